"""Predict one training step: time, breakdown, utilization, from a WorkloadGraph."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from flint.graph import NodeKind, WorkloadGraph
from flint.hardware_models.composite import (composite_comm_slowdown, composite_prices,
                                             composite_slowdown, network_times)
from flint.hardware_models.contention import contended
from flint.hardware_models.cost_model import CostModel
from flint.hardware_models.links import collective_links
from flint.hardware_models.memory import MemoryEstimate, estimate_memory
from flint.hardware_models.pluggable import CostModelFactory, cost_model_for
from flint.hardware_models.schedule import Timeline, launch_gaps, simulate
from flint.passes.expand_loops import ExpandLoops


@dataclass
class Estimate:
    hardware: str
    devices: int
    step_time_s: float
    compute_busy_s: float            # compute stream busy
    communication_busy_s: float      # communication streams busy
    exposed_communication_s: float   # communication on the critical path
    idle_s: float                    # compute stream idle (waiting on data or collectives)
    flops_per_device: float
    hfu: float                       # hardware flops / (step time x peak)
    mfu: float | None                # model flops (no recompute) / (step time x peak)
    peak_flops: float
    memory_bytes: float = 0.0            # per-device peak from buffer liveness on the graph
    memory_capacity_bytes: float = 0.0
    oom: bool = False
    memory: dict = field(default_factory=dict)   # breakdown, and XLA's figure if known
    topology: str = ""
    by_class_s: dict = field(default_factory=dict)
    by_layer_s: dict = field(default_factory=dict)
    collectives_s: dict = field(default_factory=dict)
    pipeline: dict = field(default_factory=dict)     # MPMD graphs: per-device busy, bubble
    timeline: Timeline | None = None
    # MPMD graphs: the busiest device ("busiest") and, per device, the figures reported for
    # it (splits, exposed communication), so that a pipeline priced from two short ones
    # (flint.steady_state) reports one device's figures when its busiest device changes
    per_device: dict = field(default_factory=dict, repr=False)

    def to_json(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k not in ("timeline", "per_device")}
        d["critical_path_nodes"] = len(self.timeline.critical_path) if self.timeline else 0
        return d


def _exposed_communication(graph: WorkloadGraph, tl: Timeline,
                           durations: list[float]) -> dict[int, float]:
    """Per device, the time its compute stream spends in synchronous collectives or
    waiting for async ones (the compute stream only ever waits on other streams'
    results)."""
    exposed: dict[int, float] = defaultdict(float)
    last: dict[int, float] = defaultdict(float)
    waits = tl.launch_wait or [0.0] * len(graph.nodes)
    for node, start, stream, d, dev, wait in zip(graph.nodes, tl.start, tl.stream, durations,
                                                 tl.device, waits):
        if stream != "compute":
            continue
        exposed[dev] += max(start - last[dev] - wait, 0.0)   # a wait for the host's launch
        if node.collective is not None:                     # is not
            exposed[dev] += d
        last[dev] = start + d
    return {dev: exposed[dev] + max(tl.step_time - last[dev], 0.0)  # still running at the end
            for dev in set(tl.device) | {0}}


def _per_device(graph: WorkloadGraph, tl: Timeline, durations: list[float]) -> dict:
    """Each device's busy time, the pipeline bubble and the communication wait.

    The bubble is the schedule's: a device's compute-stream idle time inside the pipelined
    part (first to last per-microbatch node anywhere) when every communication (SEND/RECV,
    collectives) takes no time, the setting of the closed form (p-1)/(v*m) of bubble over
    ideal time. What the device idles beyond that in the real timeline is communication
    wait, reported on its own (`comm_wait_s`)."""
    devices = int(graph.meta.get("mpmd_devices", 1))
    busy = [0.0] * devices
    comm = [0.0] * devices
    for stream, dev, d in zip(tl.stream, tl.device, durations):
        if stream == "compute":
            busy[dev] += d
        else:
            comm[dev] += d
    window, idle, _ = _pipelined_idle(graph, tl, durations, devices)
    free = [0.0 if n.collective is not None else d for n, d in zip(graph.nodes, durations)]
    ideal_window, bubble, ideal_busy = _pipelined_idle(graph, simulate(graph, free), free,
                                                       devices)
    wait = [max(i - b, 0.0) for i, b in zip(idle, bubble)]
    mean_busy = sum(ideal_busy) / devices
    return {"devices": devices, "compute_busy_s": busy, "communication_busy_s": comm,
            "pipelined_s": window, "bubble_s": bubble, "comm_wait_s": wait,
            "ideal_window_s": ideal_window, "ideal_busy_s": mean_busy,
            "bubble_fraction": (sum(bubble) / devices / ideal_window if ideal_window
                                else 0.0),
            "bubble_over_ideal": sum(bubble) / devices / mean_busy if mean_busy else 0.0,
            "comm_wait_fraction": sum(wait) / devices / window if window else 0.0,
            **graph.meta.get("pipeline", {})}


def _pipelined_idle(graph: WorkloadGraph, tl: Timeline, durations: list[float],
                    devices: int) -> tuple[float, list[float], list[float]]:
    """(the pipelined window, each device's compute-stream idle time in it, its F/B busy
    time)."""
    in_pipe = [0.0] * devices
    lo, hi = float("inf"), 0.0
    for node, start, end, stream, dev, d in zip(graph.nodes, tl.start, tl.finish, tl.stream,
                                                tl.device, durations):
        if stream == "compute" and node.meta.get("task") in ("F", "B"):
            in_pipe[dev] += d
            lo, hi = min(lo, start), max(hi, end)
    window = max(hi - lo, 0.0)
    return window, [max(window - b, 0.0) for b in in_pipe], in_pipe


def node_durations(graph: WorkloadGraph, hardware: str | None = None, overrides=(),
                   cost_model: CostModel | CostModelFactory | None = None,
                   algorithm: str = "auto"):
    """(loop-free graph, seconds per node of it, the cost model that priced them).
    `cost_model`: a CostModel for `graph`, a factory (hardware_models.pluggable) or None
    for the built-in one."""
    model = cost_model_for(graph, hardware, overrides, cost_model, algorithm)
    flat = ExpandLoops().run(graph)
    return flat, price_nodes(flat, model), model


def price_nodes(flat: WorkloadGraph, model) -> list[float]:
    """Seconds per node of a loop-free graph under `model`: every consumer that prices a
    graph comes through here. Composite nodes (layer templates) are priced from their
    template under the same model; pipeline copies of one node (meta "template") are
    priced once."""
    prices = composite_prices(flat, model)
    by_template: dict[int, float] = {}
    by_transfer: dict[tuple, float] = {}
    durations = []
    for n in flat.nodes:
        composite = n.meta.get("composite")
        if composite is not None:
            durations.append(prices.time(composite))
            continue
        if n.kind in (NodeKind.SEND, NodeKind.RECV) and n.collective is not None:
            # a pipeline's point-to-point transfers repeat per micro-batch: one price per
            # pair of stages and size
            c = n.collective
            key = (n.kind, c.communicator, c.bytes_in, c.bytes_out, c.dtype)
            if key not in by_transfer:
                by_transfer[key] = model.node_time(n, flat)
            durations.append(by_transfer[key])
            continue
        t = n.meta.get("template")
        if t is None:
            durations.append(model.node_time(n, flat))
        else:
            if t not in by_template:
                by_template[t] = model.node_time(n, flat)
            durations.append(by_template[t])
    return durations


def as_run(tl: Timeline) -> list[float]:
    """Each node's time as it ran in the timeline: compute stretched by the communication
    it overlapped (schedule.simulate's slowdown) counts at its stretched length."""
    return [f - s for s, f in zip(tl.start, tl.finish)]


def durations_as_run(flat: WorkloadGraph, durations: list[float], model) -> list[float]:
    """`durations` of a loop-free graph after the overlap slowdown of `model`: what a
    consumer that does not model contention (a Chakra export) should be given. A node's
    wait for its launch (the GPU's launch gap, the host's launch thread) counts in it:
    such a consumer starts a node as soon as its inputs and its stream are free."""
    tl = _schedule(flat, durations, model, composite_prices(flat, model))
    waits = tl.launch_wait or [0.0] * len(tl.start)
    return [d + w for d, w in zip(as_run(tl), waits)]


def _schedule(flat: WorkloadGraph, durations: list[float], model, prices) -> Timeline:
    """The step's timeline under `model`: compute slowed by the communication it overlaps
    and collectives by the compute (contention.py), layer blocks holding their own
    collectives' links, collectives queued per link."""
    return contended(flat, durations,
                     composite_slowdown(prices, getattr(model, "overlap_slowdown", None)),
                     composite_comm_slowdown(prices, getattr(model, "comm_slowdown", None)),
                     holds=network_times(flat, prices), links=collective_links(flat, model),
                     gaps=launch_gaps(flat, model))


def estimate(graph: WorkloadGraph, hardware: str | None = None, overrides=(),
             cost_model: CostModel | CostModelFactory | None = None, algorithm: str = "auto",
             memory: MemoryEstimate | None = None) -> Estimate:
    """Predict one step. `memory`: the graph's `estimate_memory` when already known (it
    depends on the graph only, so hardware what-ifs of one graph can share it)."""
    flat, durations, model = node_durations(graph, hardware, overrides, cost_model, algorithm)
    prices = composite_prices(flat, model)
    tl = _schedule(flat, durations, model, prices)
    alone = durations
    durations = as_run(tl)
    step = tl.step_time
    busy: dict[str, float] = defaultdict(float)
    # the splits by op class, layer and collective type, per device: a pipeline reports
    # its busiest device's, the device its compute and communication busy times are of
    by_class: dict = defaultdict(lambda: defaultdict(float))
    by_layer: dict = defaultdict(lambda: defaultdict(float))
    colls: dict = defaultdict(lambda: defaultdict(float))
    for node, d, s, d0, dev in zip(flat.nodes, durations, tl.stream, alone, tl.device):
        busy[s] += d
        composite = node.meta.get("composite")
        if composite is not None:       # a layer block: its template's op classes
            stretch = d / d0 if d0 else 0.0
            for cls, t in prices.classes(composite).items():
                by_class[dev][cls] += t * stretch
        else:
            by_class[dev][node.op_class] += d
        by_layer[dev][node.meta.get("layer") or "(none)"] += d
        if node.collective is not None:
            colls[dev][node.collective.type] += d
    worst = 0
    peak = model.spec.peak("bf16")
    flops = graph.total_flops() + sum(float(n.meta["composite"].get("flops", 0.0)) * n.repeat
                                      for n in graph.nodes if "composite" in n.meta)
    model_flops = graph.meta.get("model_flops_per_device")
    comm = sum(v for k, v in busy.items() if k != "compute")
    pipeline, per_device = {}, {}
    exposed_by = _exposed_communication(flat, tl, durations)
    if int(graph.meta.get("mpmd_devices", 1)) > 1:   # report the busiest device
        pipeline = _per_device(flat, tl, durations)
        devices = range(pipeline["devices"])
        worst = max(devices, key=lambda d: pipeline["compute_busy_s"][d])
        busy["compute"] = pipeline["compute_busy_s"][worst]
        comm = pipeline["communication_busy_s"][worst]
        flops /= pipeline["devices"]
        # The compute stream's waits inside the pipeline are the schedule's bubble or
        # communication: only the latter is exposed communication.
        exposed_by = {d: max(exposed_by.get(d, step) - pipeline["bubble_s"][d], 0.0)
                      for d in devices}
        per_device = {"busiest": worst, "exposed_communication_s": exposed_by,
                      **{name: {d: dict(sorted(split[d].items())) for d in devices}
                         for name, split in (("by_class_s", by_class),
                                             ("by_layer_s", by_layer),
                                             ("collectives_s", colls))}}
    exposed = exposed_by[worst]
    memory = memory or estimate_memory(graph)
    network = getattr(model, "network", None)
    topology = getattr(network, "topology", None)
    return Estimate(
        hardware=model.spec.name, devices=graph.cluster.devices, step_time_s=step,
        compute_busy_s=busy["compute"], communication_busy_s=comm,
        exposed_communication_s=exposed, idle_s=max(step - busy["compute"], 0.0),
        flops_per_device=flops, hfu=flops / (step * peak) if step else 0.0,
        mfu=model_flops / (step * peak) if (model_flops and step) else None, peak_flops=peak,
        memory_bytes=memory.verdict_bytes or memory.peak_bytes,
        memory_capacity_bytes=model.spec.hbm_capacity,
        oom=(memory.verdict_bytes or memory.peak_bytes) > model.spec.hbm_capacity,
        memory=memory.to_json(),
        topology=topology.describe() if topology is not None else "",
        by_class_s=dict(sorted(by_class[worst].items())),
        by_layer_s=dict(sorted(by_layer[worst].items())),
        collectives_s=dict(sorted(colls[worst].items())), pipeline=pipeline, timeline=tl,
        per_device=per_device)
