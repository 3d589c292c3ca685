"""NCCL's algorithms and protocols: latency per step and bandwidth per protocol.

NCCL picks, per collective and size, the (algorithm, protocol) its tuning model predicts
fastest: time = base latency + steps x per-step latency + bytes / bandwidth. Protocols:
- LL: 8-byte stores carrying 4 bytes of data and a 4-byte flag, no fences: lowest latency,
  half of the link's bus bandwidth, capped per GPU architecture;
- LL128: 128-byte lines with 120 bytes of data: 0.92 of the bandwidth, medium latency;
- Simple: full bandwidth, the highest latency (fences and chunked handshakes).
Algorithms: ring; tree (NCCL's double binary tree across nodes, a chain inside each);
NVLS (NVLink SHARP: the NVSwitch reduces and multicasts, Hopper and later NVSwitch
systems) and NVLS-tree (NVLS inside each node, a tree across nodes).

The constants are NCCL's own tuning constants (NVIDIA/nccl src/graph/tuning.cc, release
2.28: `baseLatencies`, `hwLatencies`, `llMaxBws`, `nvlsEfficiency`, the LL/LL128/tree
bandwidth factors and the multi-node ring "plateau" latency factor), in microseconds and
GB/s. Links: NVLink (NVSwitch inside a node), PCIe, network (NIC).

NCCL's tuning model ranks choices; it is not the time they take. nccl-tests curves show
the bandwidth protocols (Simple, LL128, NVLS) reaching their plateau far later than
latency + bytes / bandwidth says: half of it only at ~16 MB on every NVLink system in
shared/tables/more-published.md section 4. Their data runs through a pipeline (chunks
handed from step to step, channel by channel) that a message must fill before its stages
overlap; `PIPELINE_FILL_BYTES` prices that fill. The choice of protocol stays NCCL's.
"""
from __future__ import annotations

import math

PROTOCOLS = ("LL", "LL128", "Simple")
# Base latency per collective launch (us), by algorithm and protocol (tuning.cc
# baseLatencies; NVLS and NVLS-tree have none: their whole latency is the per-link one).
BASE_LATENCY_US = {
    "ring": {"LL": 6.6, "LL128": 14.0, "Simple": 8.4},
    "tree": {"LL": 6.8, "LL128": 14.0, "Simple": 8.4},
    "nvls": {"Simple": 0.0},
    "nvls_tree": {"Simple": 0.0},
}
# Latency per algorithm step (us), by link, algorithm and protocol (tuning.cc
# hwLatencies). NVLS's entry is its whole latency inside a node.
HOP_LATENCY_US = {
    "nvlink": {"ring": {"LL": 0.6, "LL128": 1.9, "Simple": 3.4},
               "tree": {"LL": 0.6, "LL128": 1.25, "Simple": 4.0},
               "nvls": {"Simple": 25.0}, "nvls_tree": {"Simple": 25.0}},
    "pci": {"ring": {"LL": 1.0, "LL128": 2.5, "Simple": 5.7},
            "tree": {"LL": 1.0, "LL128": 1.9, "Simple": 4.0}},
    "net": {"ring": {"LL": 2.7, "LL128": 4.0, "Simple": 14.0},
            "tree": {"LL": 5.0, "LL128": 8.5, "Simple": 14.0},
            "nvls": {"Simple": 18.0}, "nvls_tree": {"Simple": 14.0}},
}
# Inter-node rings pay the host's network post overhead on every step (tuning.cc
# getNetOverhead: 1 us on Intel hosts, 2 us on AMD; three posts per Simple step).
NET_OVERHEAD_US = 1.0
# Multi-node ring Simple all-reduce: NCCL scales its latency by 1.4 on sm80+ ("plateau
# effect of ring", tuning.cc ncclTopoGetAlgoTime).
RING_PLATEAU = 1.4
# LL's bandwidth ceiling (GB/s) by architecture, for 1 node / 2 nodes / more.
# AMD Instinct (RCCL, NCCL's fork) has no figure here and takes Hopper's.
LL_MAX_BW_GBS = {"volta": (39.0, 39.0, 20.4), "ampere": (87.7, 22.5, 19.0),
                 "hopper": (141.0, 45.0, 35.0), "blackwell": (282.0, 90.0, 70.0)}
LL_SHARE = 0.5                   # ring LL: half the bus bandwidth (tuning.cc, 2.23+)
LL128_BANDWIDTH = 0.92           # 120 of 128 bytes of a line are data, as measured
TREE_BANDWIDTH = 0.92            # tree Simple (tuning.cc)
TREE_LL_SHARE = 1.0 / 3.8        # tree LL
TREE_LL128 = {True: 7.0 / 9.0, False: 120.0 / 128.0}   # tree LL128: one node / several
# NVLS bandwidth on the NVLink bandwidth NCCL sees (tuning.cc nvlsEfficiency): Hopper
# 0.85, Blackwell 0.74; no NVLS before Hopper.
NVLS_EFFICIENCY = {"hopper": 0.85, "blackwell": 0.74}
# Bytes of an all-reduce's buffer that move before its pipeline is full: a buffer of S
# bytes pays min(S, fill) / algbw on top of its time at full rate, algbw being the buffer's
# bandwidth (nccl-tests' algbw; a ring's bus moves 2(p-1)/p bytes per buffer byte, so its
# fill is that much longer in bus bytes). Below the fill the stages run one after the
# other, above it they overlap after the first fill. Counted on the buffer because that
# is how the fit below reads it (the DGX H100 curve is NVLS there, whose bandwidth term
# counts the buffer) and because every NVLink curve of section 4, ring or NVLS, reaches
# half its plateau at a 16-20 MB buffer. Fitted on one curve only, NVIDIA's DGX H100
# nccl-tests sample (more-published.md 4a: one process per GPU as in training; 10-14 MiB
# give the same median there) and checked on the others (scripts/compare_nccl.py: Azure ND H100/H200
# NVLS, ND A100 ring, ND GB200 ring, A3 Mega over TCPXO). A reading of the figure: one
# 512 KiB NCCL step (its default 4 MiB buffer over NCCL_STEPS = 8) in each of 24 channels.
# Rule for other hardware: the same bytes (a property of NCCL's buffering, not of the
# link), so on a slower link the fill costs proportionally more time. All-reduce only: the
# published curves are all-reduce curves (nothing here measures all-gather, reduce-scatter
# or send/recv, and userbuffers' TP-overlap steps are not NCCL's pipeline at all).
PIPELINE_FILL_BYTES = 12 * 2**20
PIPELINED = ("LL128", "Simple")
ARCH_BY_PREFIX = (("a100", "ampere"), ("a800", "ampere"), ("a10", "ampere"), ("v100", "volta"),
                  ("h100", "hopper"), ("h800", "hopper"), ("h200", "hopper"), ("gh200", "hopper"), ("b200", "blackwell"),
                  ("b300", "blackwell"), ("gb200", "blackwell"), ("gb300", "blackwell"),
                  ("mi300", "cdna3"), ("mi325", "cdna3"))


def architecture(spec_name: str, model: str = "") -> str:
    """The GPU generation a spec's model string (or, without one, its name) says; Hopper
    when neither does."""
    return generation(spec_name, model) or "hopper"


def generation(spec_name: str, model: str = "") -> str:
    """The GPU generation of a spec: the first known GPU named in its model string
    ("NVIDIA H100 SXM5 80GB"), else its name's prefix; "" when neither names one. The
    model string describes the device; the name is a label (a calibrated or renamed copy
    of an H100 spec called "a100-like" is still an H100)."""
    words = model.lower().replace("-", " ").split()
    for prefix, arch in ARCH_BY_PREFIX:
        if any(w.startswith(prefix) for w in words):
            return arch
    name = spec_name.lower()
    for prefix, arch in ARCH_BY_PREFIX:
        if name.startswith(prefix):
            return arch
    return ""


def protocol_bandwidth(protocol: str, bus_bw: float, arch: str, nodes: int,
                       algorithm: str = "ring") -> float:
    """Bytes/s a protocol sustains where Simple sustains `bus_bw`."""
    if algorithm == "tree":
        if protocol == "Simple":
            return bus_bw * TREE_BANDWIDTH
        if protocol == "LL128":
            return bus_bw * TREE_BANDWIDTH * TREE_LL128[nodes <= 1]
        return min(_ll_cap(arch, nodes), bus_bw * TREE_BANDWIDTH * TREE_LL_SHARE)
    if protocol == "Simple":
        return bus_bw
    if protocol == "LL128":
        return bus_bw * LL128_BANDWIDTH
    return min(_ll_cap(arch, nodes), bus_bw * LL_SHARE)


def _ll_cap(arch: str, nodes: int) -> float:
    return LL_MAX_BW_GBS.get(arch, LL_MAX_BW_GBS["hopper"])[min(max(nodes, 1), 3) - 1] * 1e9


def collective_time(bus_bytes: float, steps: int, bus_bw: float, link: str, algorithm: str,
                    arch: str, nodes: int, all_reduce: bool, protocol: str = "auto",
                    hop_latency_s: float | None = None, launch: bool = True,
                    inter_steps: int = 0, net_hop_s: float | None = None,
                    buffer_bytes: float | None = None) -> float:
    """Seconds for one ring or tree phase: the fastest protocol (or the one given).
    `steps` algorithm steps, of which `inter_steps` cross the network (NCCL's nInterSteps)
    and the rest run on `link`; `hop_latency_s` / `net_hop_s` replace NCCL's per-step
    latency of either (a latency the spec or a what-if states); `launch=False` leaves out
    the base latency (an operation inside an NCCL group whose launch another member pays).
    The protocol is the one NCCL's tuning model picks; an all-reduce's time adds the
    pipeline fill (the curves that show it are all-reduce curves: all-gather, reduce-scatter
    and point-to-point are left as NCCL's model prices them), counted on the all-reduce's
    buffer (`buffer_bytes`, default `bus_bytes`: a tree's bus bytes are its buffer, a
    ring's are 2(p-1)/p of it)."""
    algo = "tree" if algorithm == "tree" else "ring"
    best, best_bw, chosen = float("inf"), 0.0, ""
    for proto in PROTOCOLS if protocol == "auto" else (protocol,):
        intra = (HOP_LATENCY_US[link][algo][proto] * 1e-6 if hop_latency_s is None
                 else hop_latency_s)
        inter = (HOP_LATENCY_US["net"][algo][proto] * 1e-6 if net_hop_s is None
                 else net_hop_s)
        if nodes > 1 and algo == "ring" and hop_latency_s is None:
            posts = 3 if proto == "Simple" else 1
            intra = max(intra, posts * NET_OVERHEAD_US * 1e-6)
        latency = (BASE_LATENCY_US[algo][proto] * 1e-6 if launch else 0.0) \
            + (steps - inter_steps) * intra + inter_steps * inter
        if algo == "ring" and proto == "Simple" and nodes > 1 and all_reduce:
            latency *= RING_PLATEAU
        bw = protocol_bandwidth(proto, bus_bw, arch, nodes, algo)
        tuned = latency + (bus_bytes / bw if bw else 0.0)      # NCCL's own estimate
        if tuned < best:
            best, best_bw, chosen = tuned, bw, proto
    if not (all_reduce and chosen in PIPELINED):
        return best
    buffer = bus_bytes if buffer_bytes is None else buffer_bytes
    # the buffer's bandwidth (NCCL's algbw): the bus's, times buffer bytes per bus byte
    return best + pipeline_fill(buffer, best_bw * buffer / bus_bytes if bus_bytes else 0.0)


def pipeline_fill(size: float, bandwidth: float) -> float:
    """Seconds a pipelined protocol moving `size` bytes at `bandwidth` spends filling its
    pipeline (PIPELINE_FILL_BYTES)."""
    return min(size, PIPELINE_FILL_BYTES) / bandwidth if bandwidth > 0 else 0.0


def nvls_bandwidth(up_bw: float, arch: str, ranks: int) -> float:
    """Algorithm bandwidth (bytes/s of the buffer) of an NVLS all-reduce among `ranks`
    GPUs of one NVSwitch domain whose NVLink sustains `up_bw`: NCCL's NVLS efficiency on
    it, times (p-1)/p (the switch reduces the p contributions of every element; NCCL's
    maintainers measure 258 GB/s at 5 H100s rising to 273 GB/s at 8, NVIDIA/nccl issue
    1455, and state ~275 GB/s for 8, NVIDIA/nccl-tests issue 212). 0 where there is none."""
    eff = NVLS_EFFICIENCY.get(arch, 0.0)
    return up_bw * eff * (ranks - 1) / ranks if ranks > 1 else 0.0


def nvls_time(size: float, algbw: float, nodes: int = 1,
              net_hop_s: float | None = None) -> float:
    """NVLS all-reduce of `size` bytes (nodes > 1: NVLS-tree, log2(nodes) tree levels up
    and down across nodes), Simple protocol only, its pipeline fill included."""
    if algbw <= 0:
        return float("inf")
    if nodes <= 1:
        latency = HOP_LATENCY_US["nvlink"]["nvls"]["Simple"] * 1e-6
    else:
        net = (HOP_LATENCY_US["net"]["nvls_tree"]["Simple"] * 1e-6 if net_hop_s is None
               else net_hop_s)
        latency = HOP_LATENCY_US["nvlink"]["nvls_tree"]["Simple"] * 1e-6 \
            + 2 * math.ceil(math.log2(nodes)) * net
    return latency + size / algbw + pipeline_fill(size, algbw)
