"""Compute beside collectives: how much a collective in flight slows the kernels it
overlaps, as an nsys-jax trace measured it and as Flint's cost model prices it.

A scanned layer's op runs several times per step, and XLA's loop pipelining clones it
(`.double_buffer_clone`, `.peeled_double_buffer`): some of its executions overlap a
collective on their device and some overlap nothing. nsys-jax gives every thunk's
GPU-projected start and length, so the trace measures the slowdown itself: an execution
that a collective covered for at least half its length, over the median of the same op's
executions that no collective touched. Flint's figure for that execution is its cost
model's `overlap_slowdown(node, collective)` (hardware_models/interference.py).

The other way round (`collective_table`): each collective execution by the share of its
length that memory-bound kernels covered, its measured time against Flint's time for it
alone and beside the kernels that covered it (the cost model's `comm_slowdown` over the
measured overlaps, as hardware_models/contention.py lengthens it in a step).
"""
from __future__ import annotations

import re
import statistics
from collections import defaultdict

from flint.graph import TENSOR_CLASSES, WorkloadGraph, collective_size_bytes
from flint.passes.expand_loops import ExpandLoops
from flint.validate.compare import class_of
from flint.validate.measured import WARMUP_SLOWER
from flint.validate.nsys_jax import read_thunks

# XLA's loop-pipelining clones of one instruction (same computation, same shapes)
_CLONE = re.compile(r"\.(double_buffer_clone|peeled_double_buffer)(\.\d+)?$")
COVERED = 0.5          # an execution counts as overlapped when a collective covers this share
# collectives long enough that bandwidth, not the wait for the other ranks, sets their
# time (the trace's scalar all-reduces are nearly all wait)
MIN_COLLECTIVE_S = 50e-6
MEMORY_COVER = ((0.0, 0.2), (0.2, 0.5), (0.5, 1.01))   # buckets of memory-bound cover


def overlap_table(path, graph: WorkloadGraph, model, module: str | None = None) -> list[dict]:
    """Per op class: executions a collective overlapped, their measured time, the same ops'
    time alone, and Flint's time for them alone and beside that collective."""
    runs, nodes = _runs(path, graph, module)
    alone, covered = defaultdict(list), []
    for run in runs:
        colls = [(s, s + d, op) for s, d, op in run.thunks
                 if op in nodes and nodes[op].collective is not None and d > 0]
        for s, d, op in run.thunks:
            node = nodes.get(op)
            if node is None or node.collective is not None or d <= 0:
                continue
            hits = [(min(s + d, b) - max(s, a), c) for a, b, c in colls if min(s + d, b) > max(s, a)]
            share = sum(h for h, _ in hits) / d
            if not hits:
                alone[_CLONE.sub("", op)].append(d)
            elif share >= COVERED:
                covered.append((op, d, max(hits)[1]))
    rows: dict[str, dict] = {}
    for op, d, comm in covered:
        base = alone.get(_CLONE.sub("", op))
        if not base:
            continue
        node = nodes[op]
        model.node_time(nodes[comm], graph)   # priced first, as in the step's schedule
        t = model.node_time(node, graph)
        r = rows.setdefault(str(class_of(node)), {"executions": 0, "measured_s": 0.0,
                                                   "measured_alone_s": 0.0, "flint_s": 0.0,
                                                   "flint_alone_s": 0.0})
        r["executions"] += 1
        r["measured_s"] += d * 1e-9
        r["measured_alone_s"] += statistics.median(base) * 1e-9
        r["flint_alone_s"] += t
        r["flint_s"] += t * model.overlap_slowdown(node, nodes[comm])
    return [dict(r, op_class=k, measured_ratio=r["measured_s"] / r["measured_alone_s"],
                 flint_ratio=r["flint_s"] / r["flint_alone_s"] if r["flint_alone_s"] else None)
            for k, r in sorted(rows.items(), key=lambda kv: -kv[1]["measured_s"])]


def collective_table(path, graph: WorkloadGraph, model, module: str | None = None) -> list[dict]:
    """Per collective (type and size) and share of its length that memory-bound kernels
    covered: its executions, their measured time, and Flint's time for them alone and
    beside the kernels that covered them."""
    runs, nodes = _runs(path, graph, module)
    rows: dict[tuple, dict] = {}
    for run in runs:
        kernels = [(s, s + d, nodes[op]) for s, d, op in run.thunks
                   if op in nodes and nodes[op].collective is None and d > 0]
        for s, d, op in run.thunks:
            comm = nodes.get(op)
            if comm is None or comm.collective is None or d <= 0:
                continue
            alone = model.node_time(comm, graph)
            if alone < MIN_COLLECTIVE_S:
                continue
            beside, memory = alone, 0.0
            for a, b, node in kernels:
                o = (min(s + d, b) - max(s, a)) * 1e-9
                if o > 0:
                    beside += o * (model.comm_slowdown(comm, node) - 1.0)
                    memory += o if str(node.op_class) not in TENSOR_CLASSES else 0.0
            cover = memory / (d * 1e-9)
            lo, hi = next(b for b in MEMORY_COVER if b[0] <= cover < b[1])
            size = collective_size_bytes(comm)
            r = rows.setdefault((comm.collective.type, size, lo), {
                "collective": comm.collective.type, "bytes": size,
                "memory_cover": f"{lo:.1f}-{min(hi, 1):.1f}",
                "executions": 0, "measured_s": 0.0, "flint_alone_s": 0.0, "flint_s": 0.0})
            r["executions"] += 1
            r["measured_s"] += d * 1e-9
            r["flint_alone_s"] += alone
            r["flint_s"] += beside
    return [dict(r, flint_alone_ratio=r["flint_alone_s"] / r["measured_s"],
                 flint_ratio=r["flint_s"] / r["measured_s"]) for _, r in sorted(rows.items())]


def _runs(path, graph: WorkloadGraph, module: str | None):
    """The trace's warm steps per device, and the loop-expanded graph's nodes by name."""
    runs = read_thunks(path, module)
    typical = statistics.median(r.duration_ns for r in runs)
    runs = [r for r in runs if r.duration_ns <= WARMUP_SLOWER * typical]   # warm-up out
    nodes = {}
    for n in ExpandLoops().run(graph).nodes:
        nodes.setdefault(n.name, n)
    return runs, nodes
