"""Compute beside collectives: how much a collective in flight slows the kernels it
overlaps, as an nsys-jax trace measured it and as Flint's cost model prices it.

A scanned layer's op runs several times per step, and XLA's loop pipelining clones it
(`.double_buffer_clone`, `.peeled_double_buffer`): some of its executions overlap a
collective on their device and some overlap nothing. nsys-jax gives every thunk's
GPU-projected start and length, so the trace measures the slowdown itself: an execution
that a collective covered for at least half its length, over the median of the same op's
executions that no collective touched. Flint's figure for that execution is its cost
model's `overlap_slowdown(node, collective)` (hardware_models/interference.py).
"""
from __future__ import annotations

import re
import statistics
from collections import defaultdict

from flint.graph import WorkloadGraph
from flint.passes.expand_loops import ExpandLoops
from flint.validate.compare import class_of
from flint.validate.measured import WARMUP_SLOWER
from flint.validate.nsys_jax import read_thunks

# XLA's loop-pipelining clones of one instruction (same computation, same shapes)
_CLONE = re.compile(r"\.(double_buffer_clone|peeled_double_buffer)(\.\d+)?$")
COVERED = 0.5          # an execution counts as overlapped when a collective covers this share


def overlap_table(path, graph: WorkloadGraph, model, module: str | None = None) -> list[dict]:
    """Per op class: executions a collective overlapped, their measured time, the same ops'
    time alone, and Flint's time for them alone and beside that collective."""
    runs = read_thunks(path, module)
    typical = statistics.median(r.duration_ns for r in runs)
    runs = [r for r in runs if r.duration_ns <= WARMUP_SLOWER * typical]   # warm-up out
    nodes = {}
    for n in ExpandLoops().run(graph).nodes:
        nodes.setdefault(n.name, n)
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
