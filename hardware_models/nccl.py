"""NCCL's protocol regimes: latency per algorithm step and bandwidth per protocol.

NCCL moves data with three protocols and picks, per collective and size, the one its tuning
model predicts fastest (time = base latency + steps x per-hop latency + bytes / bandwidth):
- LL: 8-byte stores carrying 4 bytes of data and a 4-byte flag, no fences: lowest latency,
  a quarter of the link's bus bandwidth (a third for single-node all-gather/reduce-scatter),
  capped per GPU architecture;
- LL128: 128-byte lines with 120 bytes of data: 0.92 of the bandwidth, medium latency;
- Simple: full bandwidth, the highest latency (fences and chunked handshakes).
The figures below are NCCL's own tuning constants (NVIDIA/nccl, src/graph/tuning.cc,
releases 2.19-2.21: `baseLat`, `hwLat`, `llMaxBws`, and the LL/LL128 bandwidth factors),
in microseconds and GB/s. Links: NVLink (NVSwitch inside a node), PCIe, network (NIC).
"""
from __future__ import annotations

PROTOCOLS = ("LL", "LL128", "Simple")
# Base latency per collective launch (us), by algorithm and protocol.
BASE_LATENCY_US = {
    "ring": {"LL": 6.6, "LL128": 14.0, "Simple": 8.4},
    "tree": {"LL": 6.8, "LL128": 14.0, "Simple": 8.4},
}
# Latency per algorithm step (us), by link, algorithm and protocol.
HOP_LATENCY_US = {
    "nvlink": {"ring": {"LL": 0.6, "LL128": 1.9, "Simple": 3.4},
               "tree": {"LL": 0.6, "LL128": 1.25, "Simple": 4.0}},
    "pci": {"ring": {"LL": 1.0, "LL128": 2.5, "Simple": 5.7},
            "tree": {"LL": 1.0, "LL128": 1.9, "Simple": 4.0}},
    "net": {"ring": {"LL": 2.7, "LL128": 4.0, "Simple": 14.0},
            "tree": {"LL": 5.0, "LL128": 8.5, "Simple": 14.0}},
}
# LL's bandwidth ceiling (GB/s) by architecture, for 1 node / 2 nodes / more.
LL_MAX_BW_GBS = {"volta": (39.0, 39.0, 20.4), "ampere": (87.7, 22.5, 19.0),
                 "hopper": (141.0, 45.0, 35.0), "blackwell": (282.0, 90.0, 70.0)}
LL128_BANDWIDTH = 0.92
ARCH_BY_PREFIX = (("a100", "ampere"), ("a10", "ampere"), ("v100", "volta"), ("h100", "hopper"),
                  ("h200", "hopper"), ("gh200", "hopper"), ("b200", "blackwell"),
                  ("b300", "blackwell"), ("gb200", "blackwell"), ("gb300", "blackwell"))


def architecture(spec_name: str) -> str:
    name = spec_name.lower()
    for prefix, arch in ARCH_BY_PREFIX:
        if name.startswith(prefix):
            return arch
    return "hopper"


def protocol_bandwidth(protocol: str, bus_bw: float, arch: str, nodes: int,
                       all_reduce: bool) -> float:
    """Bytes/s a protocol sustains on a level whose Simple bus bandwidth is `bus_bw`."""
    if protocol == "Simple":
        return bus_bw
    if protocol == "LL128":
        return bus_bw * LL128_BANDWIDTH
    cap = LL_MAX_BW_GBS.get(arch, LL_MAX_BW_GBS["hopper"])[min(max(nodes, 1), 3) - 1] * 1e9
    share = 0.25 if (all_reduce or nodes > 1) else 1.0 / 3.0
    return min(cap, bus_bw * share)


def collective_time(bus_bytes: float, steps: int, bus_bw: float, link: str, algorithm: str,
                    arch: str, nodes: int, all_reduce: bool, protocol: str = "auto",
                    hop_latency_s: float | None = None, launch: bool = True) -> float:
    """Seconds for one algorithm phase: the fastest protocol (or the one given).
    `hop_latency_s` replaces NCCL's per-step latency (a what-if latency of the level);
    `launch=False` leaves out the base latency (an operation inside an NCCL group whose
    launch another member pays)."""
    algo = "tree" if algorithm == "tree" else "ring"
    best = float("inf")
    for proto in PROTOCOLS if protocol == "auto" else (protocol,):
        hop = (HOP_LATENCY_US[link][algo][proto] * 1e-6 if hop_latency_s is None
               else hop_latency_s)
        bw = protocol_bandwidth(proto, bus_bw, arch, nodes, all_reduce)
        base = BASE_LATENCY_US[algo][proto] * 1e-6 if launch else 0.0
        t = base + steps * hop + (bus_bytes / bw if bw else 0.0)
        best = min(best, t)
    return best
