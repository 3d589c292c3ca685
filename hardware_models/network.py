"""Collective time on the cluster's topology (see topology.py): a scale-up level (NVLink/
NVSwitch, Infinity Fabric, or TPU ICI torus dimensions) and a scale-out level (InfiniBand/
RoCE NICs through a fat-tree whose spine may be oversubscribed, or TPU DCN between slices).

A communicator's groups are placed on the levels they span. Alpha-beta per level;
algorithms: ring, double binary tree, hierarchical (reduce-scatter inside each domain, the
inter-domain collective on 1/m of the data, all-gather inside), PAT for all-gather and
reduce-scatter with one rank per node, and direct all-to-all. On a
torus the in-slice part runs dimension by dimension, each over the links of that dimension
(both directions when the dimension wraps). `auto` takes the fastest, as NCCL's tuner does.
Sizes follow nccl-tests: S is the all-reduce buffer, the all-gather output, the
reduce-scatter input (its "size" column), so ring all-reduce time is 2(p-1)/p x S / busBW.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from dataclasses import field

from flint.cluster import Cluster
from flint.graph import Communicator, Node
from flint.hardware_models.spec import HardwareSpec
from flint.hardware_models.topology import Placement, Topology, place, topology_for
from flint.summary import collective_size_bytes

ALGORITHMS = ("auto", "ring", "tree", "hierarchical", "pat", "direct")
# Bus bandwidth NCCL sustains as a share of the link rate, for large messages (modelling
# defaults that calibration refits): nccl-tests on NVLink systems report roughly 80% of
# the per-direction link bandwidth, InfiniBand NICs about 90% of line rate.
DEFAULT_BUS_EFFICIENCY = {"scale_up": 0.80, "scale_out": 0.90}


@dataclass(frozen=True)
class Level:
    bandwidth: float     # bytes/s per device, one direction
    latency: float       # seconds per step


@dataclass(frozen=True)
class NetworkModel:
    spec: HardwareSpec
    cluster: Cluster
    algorithm: str = "auto"
    topology: Topology = field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "topology", topology_for(self.spec, self.cluster.devices))

    def bus_efficiency(self, level: str) -> float:
        """Share of the link rate collectives sustain on `level` (calibrated or default)."""
        return float(self.spec.efficiency.get(f"bus_{level}", DEFAULT_BUS_EFFICIENCY[level]))

    @property
    def up(self) -> Level:
        bw = self.spec.scale_up_bandwidth or self.spec.nic_bandwidth
        return Level(bw * self.bus_efficiency("scale_up"), self.spec.scale_up_latency)

    def out(self, leaves: int = 1) -> Level:
        """The scale-out level; past one leaf group the spine's oversubscription applies."""
        bw = self.spec.nic_bandwidth or self.spec.scale_up_bandwidth
        if leaves > 1:
            bw /= max(self.spec.oversubscription, 1.0)
        return Level(bw * self.bus_efficiency("scale_out"), self.spec.nic_latency)

    @property
    def torus_link(self) -> Level:
        """One ICI link, one direction: the chip's ICI bandwidth over its 2 x dims links."""
        links = 2 * len(self.topology.torus)
        return Level(self.up.bandwidth / links, self.spec.scale_up_latency)

    def placement(self, comm: Communicator) -> Placement:
        return place(comm, self.topology)

    def time(self, node: Node, comm: Communicator) -> float:
        c = node.collective
        size = float(collective_size_bytes(node))
        if c.type in ("collective-permute", "send", "recv"):
            return self._point_to_point(comm, size)
        place = self.placement(comm)
        if place.size <= 1:
            return 0.0
        options = self._options(c.type, size, place)
        if self.algorithm != "auto":
            if self.algorithm not in options:
                return min(options.values())
            return options[self.algorithm]
        return min(options.values())

    def _options(self, kind: str, s: float, pl: Placement) -> dict[str, float]:
        p, k, m = pl.size, pl.domains, pl.per_domain
        up, out = self.up, self.out(pl.leaves)
        flat = up if k == 1 else out  # a flat ring is as fast as its slowest link
        if k == 1 and self.topology.is_torus:
            return self._torus_options(kind, s, pl)
        if kind == "all-reduce":
            opts = {"ring": 2 * (p - 1) / p * s / flat.bandwidth + 2 * (p - 1) * flat.latency,
                    "tree": 2 * s / flat.bandwidth + 2 * math.ceil(math.log2(p)) * flat.latency}
            if k > 1 and m > 1:
                opts["hierarchical"] = (2 * self._intra("reduce-scatter", s, pl)
                                        + 2 * (k - 1) / k * (s / m) / out.bandwidth
                                        + 2 * (k - 1) * out.latency)
            return opts
        if kind in ("all-gather", "reduce-scatter"):
            opts = {"ring": (p - 1) / p * s / flat.bandwidth + (p - 1) * flat.latency}
            if k > 1 and m == 1:
                # PAT (Parallel Aggregated Trees; Jeaugey, arXiv:2506.20252, NCCL >= 2.23):
                # one rank per node, the ring's bandwidth with a logarithmic number of steps.
                opts["pat"] = ((p - 1) / p * s / flat.bandwidth
                               + math.ceil(math.log2(p)) * flat.latency)
            if k > 1 and m > 1:
                opts["hierarchical"] = (self._intra(kind, s, pl)
                                        + (k - 1) / k * (s / m) / out.bandwidth
                                        + (k - 1) * out.latency)
            return opts
        if kind in ("all-to-all", "ragged-all-to-all"):
            intra = (m - 1) / p * s / up.bandwidth
            inter = (p - m) / p * s / out.bandwidth if k > 1 else 0.0
            return {"direct": max(intra, inter) + (p - 1) * flat.latency}
        # collective-broadcast and anything else: a pipelined chain
        return {"ring": s / flat.bandwidth + math.ceil(math.log2(p)) * flat.latency}

    def _intra(self, kind: str, s: float, pl: Placement) -> float:
        """Reduce-scatter or all-gather of S among the m ranks of one domain."""
        m = pl.per_domain
        if self.topology.is_torus:
            return self._torus_phase(s, pl.grid, m)
        return (m - 1) / m * s / self.up.bandwidth + (m - 1) * self.up.latency

    def _torus_phase(self, s: float, grid, m: int) -> float:
        """One reduce-scatter (or all-gather) pass over a torus sub-grid, dimension by
        dimension: the data shrinks by each extent; a wrapping dimension runs a
        bidirectional ring (two links), an open one a ring folded onto one link."""
        link = self.torus_link
        if not grid:   # members scattered over the slice: one link, one hop per member
            return (m - 1) / m * s / link.bandwidth + (m - 1) * link.latency
        t = 0.0
        for extent, wraps in grid:
            lanes = 2 if wraps else 1
            t += (extent - 1) / extent * s / (lanes * link.bandwidth) + (extent - 1) * link.latency
            s /= extent
        return t

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

    def _point_to_point(self, comm: Communicator, s: float) -> float:
        pairs = comm.groups()
        domain = self.topology.scale_up_domain
        crosses = bool(len(pairs)) and bool(((pairs[:, 0] // domain) != (pairs[:, 1] // domain)).any())
        level = self.out() if crosses else (self.torus_link if self.topology.is_torus else self.up)
        return s / level.bandwidth + level.latency
