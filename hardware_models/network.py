"""Collective time on a two-level topology: a scale-up domain (NVLink/NVSwitch, Infinity
Fabric, TPU ICI) and a scale-out fabric (InfiniBand/RoCE NICs, TPU DCN).

A communicator's groups are placed on the levels they span: ranks are mesh positions, and
consecutive ranks fill a scale-up domain (`scale_up_domain` devices) first. Alpha-beta per
level; algorithms: ring, double binary tree, hierarchical (intra-domain reduce-scatter,
inter-domain all-reduce on 1/m of the data, intra-domain all-gather) and direct all-to-all.
`auto` takes the fastest, as NCCL's tuner does. Sizes follow nccl-tests: S is the
all-reduce buffer, the all-gather output, the reduce-scatter input (its "size" column), so
ring all-reduce time is 2(p-1)/p x S / busBW.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from flint.cluster import Cluster
from flint.graph import Communicator, Node
from flint.hardware_models.spec import HardwareSpec
from flint.summary import collective_size_bytes

ALGORITHMS = ("auto", "ring", "tree", "hierarchical", "direct")
# Bus bandwidth NCCL sustains as a share of the link rate, for large messages (modelling
# defaults that calibration refits): nccl-tests on NVLink systems report roughly 80% of
# the per-direction link bandwidth, InfiniBand NICs about 90% of line rate.
DEFAULT_BUS_EFFICIENCY = {"scale_up": 0.80, "scale_out": 0.90}


@dataclass(frozen=True)
class Level:
    bandwidth: float     # bytes/s per device, one direction
    latency: float       # seconds per step


@dataclass(frozen=True)
class Placement:
    size: int            # ranks in a group
    domains: int         # scale-up domains the group touches (k)
    per_domain: int      # ranks of the group in each domain (m)


@dataclass(frozen=True)
class NetworkModel:
    spec: HardwareSpec
    cluster: Cluster
    algorithm: str = "auto"

    def _efficiency(self, level: str) -> float:
        return float(self.spec.efficiency.get(f"bus_{level}", DEFAULT_BUS_EFFICIENCY[level]))

    @property
    def up(self) -> Level:
        bw = self.spec.scale_up_bandwidth or self.spec.nic_bandwidth
        return Level(bw * self._efficiency("scale_up"), self.spec.scale_up_latency)

    @property
    def out(self) -> Level:
        bw = (self.spec.nic_bandwidth or self.spec.scale_up_bandwidth) / max(
            self.spec.oversubscription, 1.0)
        return Level(bw * self._efficiency("scale_out"), self.spec.nic_latency)

    def placement(self, comm: Communicator) -> Placement:
        return _placement(comm, self.spec.scale_up_domain)

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
        up, out = self.up, self.out
        flat = up if k == 1 else out  # a flat ring is as fast as its slowest link
        if kind == "all-reduce":
            opts = {"ring": 2 * (p - 1) / p * s / flat.bandwidth + 2 * (p - 1) * flat.latency,
                    "tree": 2 * s / flat.bandwidth + 2 * math.ceil(math.log2(p)) * flat.latency}
            if k > 1 and m > 1:
                opts["hierarchical"] = (
                    2 * (m - 1) / m * s / up.bandwidth + 2 * (m - 1) * up.latency
                    + 2 * (k - 1) / k * (s / m) / out.bandwidth + 2 * (k - 1) * out.latency)
            return opts
        if kind in ("all-gather", "reduce-scatter"):
            opts = {"ring": (p - 1) / p * s / flat.bandwidth + (p - 1) * flat.latency}
            if k > 1 and m > 1:
                opts["hierarchical"] = ((m - 1) / m * s / up.bandwidth + (m - 1) * up.latency
                                        + (k - 1) / k * (s / m) / out.bandwidth
                                        + (k - 1) * out.latency)
            return opts
        if kind in ("all-to-all", "ragged-all-to-all"):
            intra = (m - 1) / p * s / up.bandwidth
            inter = (p - m) / p * s / out.bandwidth if k > 1 else 0.0
            return {"direct": max(intra, inter) + (p - 1) * flat.latency}
        # collective-broadcast and anything else: a pipelined chain
        return {"ring": s / flat.bandwidth + math.ceil(math.log2(p)) * flat.latency}

    def _point_to_point(self, comm: Communicator, s: float) -> float:
        pairs = comm.groups()
        domain = self.spec.scale_up_domain
        crosses = bool(len(pairs)) and bool(((pairs[:, 0] // domain) != (pairs[:, 1] // domain)).any())
        level = self.out if crosses else self.up
        return s / level.bandwidth + level.latency


@lru_cache(maxsize=4096)
def _placement(comm: Communicator, domain: int) -> Placement:
    """Expanding groups is O(devices): do it once per communicator (communicators are frozen)."""
    groups = comm.groups()
    if comm.kind == "pairs" or groups.size == 0:
        return Placement(2, 1, 2)
    first = groups[0]
    domains = len({int(r) // domain for r in first})
    return Placement(int(len(first)), domains, max(1, int(len(first)) // domains))
