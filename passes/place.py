"""Baechi device placement: the operators of one training step over devices with a memory
limit (model parallelism, one microbatch).

After Jeon et al., "Baechi: Fast Device Placement of Machine Learning Graphs", SoCC 2020:
- m-TOPO walks the nodes in topological (schedule) order and fills device 0, then 1, ...
  each up to an even share of the memory (Baechi's default, uniform variant), falling back
  to the full limit when the shares leave something over.
- m-ETF is earliest-task-first list scheduling (Hwang et al. 1989): repeatedly start the
  (ready node, device) pair that can start earliest, a value paying the link's transfer
  time when its consumer sits on another device, skipping devices without room.
- m-SCT is Hanen and Munier's small-communication-time list scheduling: each node has at
  most one favourite child, which the device that ran the parent waits for unless another
  node is urgent. Both list schedulers live in `place_sched`.

Co-placement: as Baechi places TensorFlow's colocation groups (and its forward/backward
groups) whole, nodes that must share a device form a unit, bound to a device when its
first node is placed. Four rules build the units:
1. nodes labelled with one model block (`meta["layer"]`: `layer_3`, `head`, `embed`) share
   a device: the block's forward, the backward that reads its saved activations and the
   nodes that read its parameters, which the graph does not show as edges (splitting a
   block would need weight copies the cost model never sees). Layers inside a scan carry
   no index: each loop iteration is a block then, and forward and backward part;
2. Baechi's rule: a node whose output has one consumer goes with it (a gradient with its
   optimizer update);
3. a node that reads no other node (a weight cast, a constant) goes with its first consumer;
4. an unlabelled backward node goes with the forward node whose activation (the largest
   one) it reads.
Rules 2-4 never join two labelled blocks, and never grow a unit of unlabelled nodes past a
quarter of a device's fair share of the step's time, so enough units remain to balance.

Memory is a bound on each device's peak, checked whenever a unit is placed: the device
holds its units' parameters and optimizer state (a layer's arguments live with the layer,
the rest is spread evenly, as `apply_placement` accounts them), plus every value it makes
or receives, from the moment the value is made (a transfer is a rendezvous right after
the producer) to the value's last use anywhere. Values live over intervals of the schedule
order, so the check is a running maximum, not a sum; a copy for an input whose device is
not known yet is reserved as if remote. This covers what `hardware_models.memory` reports
for the placed graph, which frees a value on its producer once sent and counts the copy
only from its first consumer on.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import ClassVar

from flint.errors import FlintError
from flint.graph import NodeKind, WorkloadGraph
from flint.passes.place_sched import m_etf, m_sct
from flint.passes.place_units import Memory, Problem, output_bytes, placement_memory

ALGORITHMS = ("m-sct", "m-etf", "m-topo")


@dataclass(frozen=True)
class Place:
    """Contract: input a training-step graph (loops are expanded first); output the
    multi-device graph of `apply_placement`: every node on one of `devices` devices in the
    original order, a SEND/RECV pair for each value crossing devices, every co-placement
    unit on one device, and `meta["placement"]` with the algorithm, the placement time and
    each device's memory bound, which is at most `memory_limit` (bytes; 0 = the hardware's
    HBM). Raises FlintError when no placement fits the limit."""

    algorithm: str = "m-sct"
    devices: int = 8
    memory_limit: float = field(default=0.0, metadata={"unit": "bytes"})
    hardware: str = "h100-sxm"
    name: ClassVar[str] = "place"
    # node times, link speed and HBM from this cost model (a factory or a CostModel,
    # hardware_models.pluggable) instead of the built-in one for `hardware`
    cost_model: object = None

    def run(self, graph: WorkloadGraph) -> WorkloadGraph:
        return place(graph, self.algorithm, self.devices, self.memory_limit,
                     self.hardware, self.cost_model).graph


@dataclass
class Placement:
    device_of: list[int]
    graph: WorkloadGraph             # the placed multi-device graph
    placement_time_s: float
    memory_limit_bytes: float
    per_device_bytes: list[float] = field(default_factory=list)


def place(graph: WorkloadGraph, algorithm: str = "m-sct", devices: int = 8,
          memory_limit: float = 0.0, hardware: str = "h100-sxm", cost_model=None) -> Placement:
    """Place `graph` with a Baechi algorithm. The placement time covers the algorithm with
    its co-placement and memory bookkeeping, not the cost model pricing the nodes."""
    from flint.hardware_models.estimate import node_durations
    from flint.passes.pipeline import apply_placement

    run = {"m-sct": m_sct, "m-etf": m_etf, "m-topo": m_topo}.get(algorithm)
    if run is None:
        raise FlintError(f"unknown placement algorithm {algorithm!r}; use {' | '.join(ALGORITHMS)}")
    if devices < 1:
        raise FlintError(f"placement needs at least 1 device, not {devices}")
    if memory_limit < 0:
        raise FlintError(f"memory limit {memory_limit} bytes is negative")
    flat, durations, model = node_durations(graph, hardware or None, cost_model=cost_model)
    limit = float(memory_limit or model.spec.hbm_capacity)
    comm = link_time(model.spec)
    start = time.perf_counter()
    sizes = output_bytes(flat)
    device_of = run(flat, durations, comm, sizes, devices, limit)
    elapsed = time.perf_counter() - start
    placed = apply_placement(flat, device_of, devices)
    per_device = placement_memory(flat, sizes, device_of, devices)
    placed.meta["placement"] = dict(placed.meta.get("placement", {}), algorithm=algorithm,
                                    hardware=model.spec.name, placement_time_s=elapsed,
                                    memory_limit_bytes=limit, per_device_bytes=per_device)
    return Placement(device_of, placed, elapsed, limit, per_device)


def link_time(spec):
    """Seconds to move a value between two devices of one NVLink domain (the network
    model's point-to-point time on the scale-up fabric)."""
    bandwidth, latency = spec.scale_up_bandwidth, spec.scale_up_latency
    if bandwidth <= 0:
        raise FlintError(f"hardware {spec.name} has no scale-up bandwidth to place over")
    return lambda nbytes: nbytes / bandwidth + latency


def transfers(placed: WorkloadGraph) -> tuple[int, float]:
    """(values sent between devices, their bytes) in a placed graph."""
    sends = [n for n in placed.nodes if n.kind == NodeKind.SEND]
    return len(sends), float(sum(n.collective.bytes_in for n in sends))


def m_topo(graph: WorkloadGraph, durations, comm, memory, devices: int, limit: float,
           uniform: bool = True) -> list[int]:
    """m-TOPO: nodes in schedule order; each new unit goes to the current device if it has
    room under the cap, else the cursor moves on. The cap is first an even share (the
    step's lower bound per device plus the largest unit), then the limit itself."""
    p = Problem(graph, durations, comm, memory, devices, limit, "m-topo")
    caps = [min(limit, p.even_share + p.unit_need)] if uniform and devices > 1 else []
    for cap in caps + [limit]:
        mem = Memory(p, cap)
        device_of, d = [0] * len(graph.nodes), 0
        for v in range(len(graph.nodes)):
            g = p.unit_of[v]
            if mem.bound[g] < 0:
                while d < devices and not mem.fits(g, d):
                    d += 1
                if d == devices:
                    break
                mem.bind(g, d)
            device_of[v] = mem.bound[g]
        else:
            return device_of
    raise p.infeasible(v, " after filling every device in topological order")
