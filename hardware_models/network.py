"""Collective time on the cluster's topology (see topology.py): a scale-up level (NVLink/
NVSwitch, Infinity Fabric, or TPU ICI torus dimensions) and a scale-out level (InfiniBand/
RoCE NICs through a fat-tree whose spine may be oversubscribed, or TPU DCN between slices).

A communicator's groups are placed on the levels they span (p ranks, m in each of k
domains). On GPUs the algorithms are NCCL's (_nccl_options): ring (the node's m NICs and
its NVLink carry the ring at once), double binary tree across nodes, NVLS / NVLS-tree
where the switches reduce, PAT for all-gather and reduce-scatter with one rank per node,
and direct all-to-all or DeepEP's hierarchical one; each phase is priced as NCCL's tuner
prices it (nccl.py): base latency, per-step latency of the link class (NVLink, PCIe,
network) and bandwidth of the protocol (LL, LL128, Simple), taking the fastest protocol
unless one is given (as NCCL_PROTO does). `auto` takes the fastest algorithm, as NCCL's
tuner does; `hierarchical` (reduce-scatter inside each domain, the inter-domain collective
on 1/m of the data, all-gather inside) is a what-if. Elsewhere alpha-beta per level; on a
torus the in-slice part runs dimension by dimension, each over the links of that dimension
(both directions when the dimension wraps).
Sizes follow nccl-tests: S is the all-reduce buffer, the all-gather output, the
reduce-scatter input (its "size" column), so ring all-reduce time is 2(p-1)/p x S / busBW.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from dataclasses import field

from flint.cluster import Cluster
from flint.graph import Communicator, Node, collective_size_bytes
from flint.hardware_models import nccl
from flint.hardware_models.spec import HardwareSpec
from flint.hardware_models.topology import Placement, Topology, place, topology_for

ALGORITHMS = ("auto", "ring", "tree", "hierarchical", "pat", "direct", "nvls")
PROTOCOLS = ("auto",) + nccl.PROTOCOLS
# Bus bandwidth NCCL sustains as a share of the link rate, for large messages (calibration
# refits them): nccl-tests all-reduce on DGX A100 reports ~230-240 GB/s bus bandwidth of the
# 300 GB/s per-direction NVLink 3 rate, on DGX H100 ~360-370 GB/s (ring, no NVLS) of 450
# GB/s: about 0.8; InfiniBand NDR/HDR NICs sustain about 90% of line rate in nccl-tests
# multi-node runs (NVIDIA DGX SuperPOD reference architecture performance figures).
DEFAULT_BUS_EFFICIENCY = {"scale_up": 0.80, "scale_out": 0.90}


@dataclass(frozen=True)
class Level:
    bandwidth: float     # bytes/s per device, one direction
    latency: float       # seconds per step (TPU/CPU; a GPU what-if replaces NCCL's)
    link: str = "nvlink"                 # NCCL latency class: nvlink | pci | net
    hop_override: float | None = None    # an explicitly given per-step latency


@dataclass(frozen=True)
class NetworkModel:
    spec: HardwareSpec
    cluster: Cluster
    algorithm: str = "auto"
    protocol: str = "auto"
    latency_free: bool = False       # bandwidth terms only (to split a time in two)
    topology: Topology = field(init=False)
    # what time() chose per collective node: (algorithm, seconds, ranks), for the overlap
    # slowdown (interference.py) of the compute running beside it
    priced: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "topology", topology_for(self.spec, self.cluster.devices))

    def bus_efficiency(self, level: str) -> float:
        """Share of the link rate collectives sustain on `level`: calibrated, else the
        spec's published figure, else the default."""
        if f"bus_{level}" in self.spec.efficiency:
            return float(self.spec.efficiency[f"bus_{level}"])
        stated = (self.spec.scale_up_bus_efficiency if level == "scale_up"
                  else self.spec.nic_bus_efficiency)
        return float(stated or DEFAULT_BUS_EFFICIENCY[level])

    @property
    def up(self) -> Level:
        bw = self.spec.scale_up_bandwidth or self.spec.nic_bandwidth
        return Level(bw * self.bus_efficiency("scale_up"), self.spec.scale_up_latency,
                     self.spec.scale_up_link, self._given("scale_up_latency"))

    def out(self, leaves: int = 1) -> Level:
        """The scale-out level; past one leaf group the spine's oversubscription applies."""
        bw = self.spec.nic_bandwidth or self.spec.scale_up_bandwidth
        if leaves > 1:
            bw /= max(self.spec.oversubscription, 1.0)
        return Level(bw * self.bus_efficiency("scale_out"), self.spec.nic_latency, "net",
                     self._given("nic_latency"))

    def _given(self, name: str) -> float | None:
        """A latency the spec (or a what-if) states; NCCL's constants apply otherwise."""
        return getattr(self.spec, name) if name in self.spec.sources else None

    @property
    def nccl_protocol(self) -> str:
        """The protocol collectives run: the one asked for (NCCL_PROTO of a what-if), else
        the one the system's environment allows (the spec's nccl_protocol), else NCCL's
        pick ("auto")."""
        return self.protocol if self.protocol != "auto" else self.spec.nccl_protocol

    @property
    def nccl(self) -> bool:
        return self.spec.kind == "gpu" and not self.topology.is_torus

    def phase(self, bus_bytes: float, steps: int, level: Level, algorithm: str = "ring",
              nodes: int = 1, all_reduce: bool = False, launch: bool = True,
              inter_steps: int = 0, buffer: float | None = None) -> float:
        """One algorithm phase: `bus_bytes` per rank over `steps` hops on `level`, of
        which `inter_steps` cross the network (NCCL's latency class of those steps).
        `buffer`: an all-reduce's buffer, where the bus bytes are not it (a ring's are
        2(p-1)/p of it): its pipeline fill is counted on the buffer."""
        if self.latency_free:
            return bus_bytes / level.bandwidth
        if not self.nccl:
            return bus_bytes / level.bandwidth + steps * level.latency
        return nccl.collective_time(bus_bytes, steps, level.bandwidth, level.link, algorithm,
                                    nccl.architecture(self.spec.name, self.spec.model), nodes, all_reduce,
                                    self.nccl_protocol, level.hop_override, launch, inter_steps,
                                    self._given("nic_latency"), buffer)

    @property
    def torus_link(self) -> Level:
        """One ICI link, one direction: the chip's ICI bandwidth over its 2 x dims links."""
        links = 2 * len(self.topology.torus)
        return Level(self.up.bandwidth / links, self.spec.scale_up_latency)

    def placement(self, comm: Communicator) -> Placement:
        return place(comm, self.topology)

    def options(self, node: Node, comm: Communicator) -> dict[str, float]:
        """Seconds per algorithm the model offers for a group collective ({} for a group
        of one)."""
        place = self.placement(comm)
        if place.size <= 1:
            return {}
        # a node may stand for `pieces` collectives of equal size issued one after another
        # (InternEvo's parameter sync: one broadcast per owner rank): each pays its launch
        # and pipeline fill
        pieces = max(int(node.meta.get("pieces") or 1), 1)
        one = self._options(node.collective.type, float(collective_size_bytes(node)) / pieces,
                            place, int(node.meta.get("moe_top_k") or 0),
                            domain_skew(node, place.per_domain))
        return {k: v * pieces for k, v in one.items()} if pieces > 1 else one

    def time(self, node: Node, comm: Communicator) -> float:
        c = node.collective
        size = float(collective_size_bytes(node))
        if c.type in ("collective-permute", "send", "recv"):
            # A pipeline's sends and receives of one stage boundary go out as one NCCL group
            # (Megatron's batch_isend_irecv) that pays one launch; the graph has a SEND per
            # tensor, so the base launch latency (~7-8 us) is left out of each rather than
            # charged per tensor (an under-count of one launch per boundary and microbatch).
            # An XLA collective-permute is its own launch.
            # (a ring step of TP communication overlap runs inside userbuffers' own
            # kernels or copy engines, passes.tp_comm_overlap: no launch of its own)
            return self._point_to_point(comm, size, launch=c.type == "collective-permute"
                                        and not node.meta.get("tp_comm_overlap"))
        options = self.options(node, comm)
        if not options:
            return 0.0
        chosen = (self.algorithm if self.algorithm in options
                  else min(sorted(options), key=options.get))
        place = self.placement(comm)
        # (algorithm, seconds, ranks, scale-up domains spanned): interference.py
        self.priced[priced_key(node)] = (chosen, options[chosen], place.size, place.domains)
        return options[chosen]

    def _options(self, kind: str, s: float, pl: Placement, top_k: int = 0,
                 skew: float = 1.0) -> dict[str, float]:
        p, k, m = pl.size, pl.domains, pl.per_domain
        if k == 1 and self.topology.is_torus:
            return self._torus_options(kind, s, pl)
        if self.nccl and kind in ("all-reduce", "all-gather", "reduce-scatter",
                                  "collective-broadcast"):
            return self._nccl_options(kind, s, pl)
        up, out = self.up, self.out(pl.leaves)
        flat = up if k == 1 else out  # a flat ring is as fast as its slowest link
        log_p = math.ceil(math.log2(p))
        if kind == "all-reduce":
            opts = {"ring": self.phase(2 * (p - 1) / p * s, 2 * (p - 1), flat, "ring", k, True),
                    "tree": self.phase(2 * s, 2 * log_p, flat, "tree", k, True)}
            if k > 1 and m > 1:
                opts["hierarchical"] = (2 * self._intra("reduce-scatter", s, pl)
                                        + self.phase(2 * (k - 1) / k * (s / m), 2 * (k - 1),
                                                     out, "ring", k, True))
            return opts
        if kind in ("all-gather", "reduce-scatter"):
            opts = {"ring": self.phase((p - 1) / p * s, p - 1, flat, "ring", k)}
            if k > 1 and m > 1:
                opts["hierarchical"] = (self._intra(kind, s, pl)
                                        + self.phase((k - 1) / k * (s / m), k - 1, out, "ring", k))
            return opts
        if kind in ("all-to-all", "ragged-all-to-all"):
            intra = (m - 1) / p * s / up.bandwidth
            inter = (p - m) / p * s / out.bandwidth if k > 1 else 0.0
            opts = {"direct": max(intra, inter) + self.phase(0.0, p - 1, flat, "ring", k)}
            if k > 1 and m > 1:
                opts["hierarchical"] = self._hierarchical_all_to_all(s, pl, top_k, skew)
            return opts
        # collective-broadcast and anything else: a pipelined chain
        return {"ring": self.phase(s, log_p, flat, "ring", k)}

    def _nccl_options(self, kind: str, s: float, pl: Placement) -> dict[str, float]:
        """NCCL's algorithms for a group of p ranks, m in each of k NVLink domains (nodes).

        Rings: every channel's ring runs through each node once, entering and leaving by
        a NIC; NCCL stripes its channels over the NICs of the ranks it holds in a node, so
        a node's network carries the ring's bus bytes over m NICs at once while its NVLink
        carries them too: the bus bandwidth is min(NVLink, m x NIC) (nccl-tests multi-node
        busBw approaches the node's NIC total: NVIDIA/nccl-tests issue 119, 4x HDR per node
        -> ~85-96 GB/s; issue 290, 46-48 GB/s per NDR NIC).
        Trees (all-reduce across nodes): NCCL's double binary tree, a chain inside each
        node; a chain moves the buffer twice over each NVLink direction (reduce up,
        broadcast down) and a node's NICs carry it once each way on two nodes (each node
        roots one of the two trees) and twice beyond (an inner node of one tree has two
        children): tree bandwidth min(NVLink / 2, m x NIC / (1 or 2)).
        NVLS (switch_reduction: nvls): the NVSwitch reduces and multicasts inside a node
        (nccl.nvls_bandwidth); across nodes NVLS-tree, NVLS inside and a tree between.
        Hierarchical (reduce-scatter inside, the network part on 1/m, all-gather inside,
        one after the other) is not one of NCCL's algorithms: offered only when asked for
        (`algorithm="hierarchical"`), so that `auto` chooses as NCCL's tuner does."""
        p, k, m = pl.size, pl.domains, pl.per_domain
        up, out = self.up, self.out(pl.leaves)
        arch = nccl.architecture(self.spec.name, self.spec.model)
        ring_bw = up.bandwidth if k == 1 else min(up.bandwidth, m * out.bandwidth) \
            if m > 1 else out.bandwidth
        ring_level = Level(ring_bw, up.latency, up.link if k == 1 or m > 1 else "net",
                           up.hop_override if k == 1 or m > 1 else out.hop_override)
        log_k = math.ceil(math.log2(k)) if k > 1 else 0
        if kind == "collective-broadcast":
            # NCCL runs broadcast as a ring only, its chunks pipelined from the root round
            # the ring: every link carries the buffer once (bus bandwidth = algorithm
            # bandwidth), nRanks steps of which nNodes cross the network (tuning.cc
            # ncclTopoTuneModel: nsteps = nRanks, nInterSteps = nNodes for Broadcast)
            return {"ring": self.phase(s, p, ring_level, "ring", k,
                                       inter_steps=k if k > 1 else 0)}
        if kind != "all-reduce":
            opts = {"ring": self.phase((p - 1) / p * s, p - 1, ring_level, "ring", k,
                                       inter_steps=k - 1 if m > 1 else 0)}
            if k > 1 and m == 1:
                # PAT (Parallel Aggregated Trees; Jeaugey, arXiv:2506.20252, NCCL >= 2.23):
                # one rank per node, the ring's bandwidth with a logarithmic number of steps.
                opts["pat"] = self.phase((p - 1) / p * s, log_k, ring_level, "ring", k)
            if k > 1 and m > 1 and self.algorithm == "hierarchical":
                opts["hierarchical"] = (self._intra(kind, s, pl)
                                        + self.phase((k - 1) / k * (s / m), k - 1, out,
                                                     "ring", k))
            return opts
        opts = {"ring": self.phase(2 * (p - 1) / p * s, 2 * (p - 1), ring_level, "ring", k,
                                   True, inter_steps=2 * (k - 1) if m > 1 else 0, buffer=s)}
        # NVLS runs the Simple protocol only (nccl.nvls_time): none where NCCL_PROTO
        # names another
        nvls = (self.spec.switch_reduction == "nvls" and self.spec.scale_up_link == "nvlink"
                and m > 1 and self.nccl_protocol in ("auto", "Simple"))
        if k > 1:
            network = m * out.bandwidth / (1.0 if k == 2 else 2.0)
            chain = up.bandwidth / 2 if m > 1 else float("inf")
            tree = Level(min(chain, network), up.latency, up.link if m > 1 else "net",
                         up.hop_override if m > 1 else out.hop_override)
            opts["tree"] = self.phase(s, 2 * (m - 1) + 2 * log_k, tree, "tree", k, True,
                                      inter_steps=2 * log_k)
            if nvls:
                algbw = min(nccl.nvls_bandwidth(up.bandwidth, arch, m), network)
                opts["nvls"] = self._nvls(s, algbw, k, out)
            if m > 1 and self.algorithm == "hierarchical":
                opts["hierarchical"] = (2 * self._intra("reduce-scatter", s, pl)
                                        + self.phase(2 * (k - 1) / k * (s / m), 2 * (k - 1),
                                                     out, "ring", k, True, buffer=s / m))
        elif nvls:
            opts["nvls"] = self._nvls(s, nccl.nvls_bandwidth(up.bandwidth, arch, p), 1, out)
        return opts

    def _nvls(self, s: float, algbw: float, nodes: int, out: Level) -> float:
        if self.latency_free:
            return s / algbw if algbw else float("inf")
        return nccl.nvls_time(s, algbw, nodes, out.hop_override)

    def _hierarchical_all_to_all(self, s: float, pl: Placement, top_k: int,
                                 skew: float = 1.0) -> float:
        """DeepEP's inter-node dispatch/combine (DeepSeek-V3, arXiv 2412.19437 section
        3.2.2; deepseek-ai/DeepEP README, "normal kernels"): a token bound for another
        node crosses the network once, to the GPU of the same local index there, which
        forwards it over NVLink to every GPU of that node holding one of its experts. With
        top_k picks spread evenly over k nodes, a token reaches (k-1)(1-(1-1/k)^top_k)
        distinct remote nodes instead of top_k (k-1)/k copies (without top_k: no
        deduplication). The network and NVLink parts run pipelined (RDMA and NVLink
        forwarding overlap in DeepEP), so the slower one sets the time.

        Under routing skew S is the hottest rank's bytes; its NVLink carries them all, but
        its node's remote tokens arrive through all m NICs of the node (each from senders
        of that local index), so the network part scales with the hottest node's load:
        `skew` = hottest node's mean load / hottest rank's load (domain_skew)."""
        p, k, m = pl.size, pl.domains, pl.per_domain
        remote = (p - m) / p * s * remote_share(top_k, k)   # off-node, deduplicated
        nvlink = (m - 1) / p * s + remote * (m - 1) / m
        remote *= skew
        up, out = self.up, self.out(pl.leaves)
        return (max(remote / out.bandwidth, nvlink / up.bandwidth)
                + self.phase(0.0, k - 1, out, "ring", k) + self.phase(0.0, m - 1, up))

    def _intra(self, kind: str, s: float, pl: Placement) -> float:
        """Reduce-scatter or all-gather of S among the m ranks of one domain."""
        m = pl.per_domain
        if self.topology.is_torus:
            return self._torus_phase(s, pl.grid, m)
        return self.phase((m - 1) / m * s, m - 1, self.up)

    def _torus_phase(self, s: float, grid, m: int) -> float:
        """One reduce-scatter (or all-gather) pass over a torus sub-grid. Each spanned
        dimension has links of its own, so the data is split into one part per dimension
        and every part runs the dimensions in its own rotated order, each shrinking it by
        the extent: all dimensions' links carry data at once, and a group spanning n
        dimensions moves S in about S / (n x a dimension's bandwidth) (jax-ml/scaling-book,
        'Sharded Matrices', "What happens when we AllGather over multiple axes?":
        T = max(T_min x sum|X_i| / 2, V / (W_ici x n_axes))). A wrapping dimension runs a
        bidirectional ring (two links), an open one a ring folded onto one link; the pass
        takes as long as its busiest dimension's links."""
        link = self.torus_link
        if not grid:   # members scattered over the slice: one link, one hop per member
            return (m - 1) / m * s / link.bandwidth + (m - 1) * link.latency
        dims = [(extent, wraps) for extent, wraps in grid if extent > 1]
        load = [0.0] * len(dims)
        for first in range(len(dims)):
            part = s / len(dims)
            for step in range(len(dims)):
                d = (first + step) % len(dims)
                extent, wraps = dims[d]
                load[d] += (extent - 1) / extent * part / ((2 if wraps else 1) * link.bandwidth)
                part /= extent
        hops = sum(extent - 1 for extent, _ in dims)
        return max(load, default=0.0) + hops * link.latency

    def _torus_options(self, kind: str, s: float, pl: Placement) -> dict[str, float]:
        phase = self._torus_phase(s, pl.grid, pl.size)
        if kind == "all-reduce":
            return {"ring": 2 * phase}
        if kind in ("all-gather", "reduce-scatter"):
            return {"ring": phase}
        if kind in ("all-to-all", "ragged-all-to-all"):
            # Bisection-bound: p*S/4 bytes cross the middle of the longest spanned
            # dimension, whose cut holds p/extent rank columns of 1 (open) or 2 links.
            extent, wraps = max(pl.grid, default=(pl.size, False))
            cut = 2 if wraps else 1
            return {"direct": s * extent / (4 * cut * self.torus_link.bandwidth)
                    + (pl.size - 1) * self.torus_link.latency}
        return {"ring": s / self.torus_link.bandwidth
                + math.ceil(math.log2(max(pl.size, 2))) * self.torus_link.latency}

    def _point_to_point(self, comm: Communicator, s: float, launch: bool = True) -> float:
        pairs = comm.groups()
        domain = self.topology.scale_up_domain
        crosses = bool(len(pairs)) and bool(((pairs[:, 0] // domain) != (pairs[:, 1] // domain)).any())
        level = self.out() if crosses else (self.torus_link if self.topology.is_torus else self.up)
        return self.phase(s, 1, level, launch=launch)


def priced_key(node: Node) -> tuple:
    """How NetworkModel.priced names a collective node."""
    c = node.collective
    return (node.id, node.name, c.type if c else "", c.bytes_in if c else 0)


def domain_skew(node: Node, per_domain: int) -> float:
    """For an all-to-all the routing pass priced at its hottest rank (meta
    `moe_all_to_all`, passes/moe_routing.py): the hottest domain's mean rank load over the
    hottest rank's load (1.0 without skew). EP ranks fill domains in order (positions
    0..m-1 in the first, as when the expert axis is the mesh's innermost)."""
    info = node.meta.get("moe_all_to_all")
    load = info.get("rank_load") if isinstance(info, dict) else None
    if not load or per_domain <= 1 or len(load) % per_domain or max(load) <= 0:
        return 1.0
    domains = [sum(load[i:i + per_domain]) / per_domain
               for i in range(0, len(load), per_domain)]
    return max(domains) / max(load)


def remote_share(top_k: int, domains: int) -> float:
    """Share of a flat all-to-all's off-domain token copies DeepEP sends (once per
    destination domain): top_k picks spread evenly over k domains reach (k-1)(1-(1-1/k)^top_k)
    distinct remote domains instead of top_k (k-1)/k copies; 1.0 without top_k."""
    k = domains
    naive = top_k * (k - 1) / k if k > 1 else 0.0
    if not top_k or not naive:
        return 1.0
    return (k - 1) * (1 - (1 - 1 / k) ** top_k) / naive
