"""Collectives slowed by the compute beside them (interference.collective_slowdown: HBM
serves a kernel's loads and NCCL's without priority).

The schedule places a collective before the compute that will overlap it (program order),
so one placement cannot make a collective's length depend on that compute. `contended`
places the step, lengthens each asynchronous collective by what the compute beside it
took (an overlap of o seconds at factor f costs o (f - 1)), and places the step once more
with those lengths: one step towards the fixed point, since the second placement's
overlaps differ a little from the first's. The compute side of the same contention is
schedule.simulate's `slowdown`.
"""
from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict

from flint.graph import NodeKind, WorkloadGraph
from flint.hardware_models.schedule import Timeline, simulate


def contended(graph: WorkloadGraph, durations: list[float], slowdown=None,
              comm_slowdown=None, **placement) -> Timeline:
    """schedule.simulate, with `comm_slowdown(collective, compute node)` (>= 1) lengthening
    the asynchronous collectives that compute overlapped; `placement`: simulate's other
    arguments (holds, links, gaps, duplex)."""
    tl = simulate(graph, durations, slowdown, **placement)
    if comm_slowdown is None:
        return tl
    longer = lengthened(tl, durations, comm_slowdown)
    return tl if longer is None else simulate(graph, longer, slowdown, **placement)


def lengthened(tl: Timeline, durations: list[float], comm_slowdown) -> list[float] | None:
    """`durations` with each asynchronous collective lengthened by the compute that
    overlapped it in `tl` (None when none is)."""
    nodes = tl.graph.nodes
    compute: dict[int, list[int]] = defaultdict(list)
    for i, s in enumerate(tl.stream):
        if s == "compute" and nodes[i].collective is None and tl.finish[i] > tl.start[i]:
            compute[tl.device[i]].append(i)
    for order in compute.values():
        order.sort(key=lambda i: tl.start[i])
    # one compute stream per device: its kernels end in the order they start
    ends = {dev: [tl.finish[i] for i in order] for dev, order in compute.items()}
    out = None
    for j, s in enumerate(tl.stream):
        comm = nodes[j]
        a, b = tl.start[j], tl.finish[j]
        if (s == "compute" or comm.collective is None or b <= a
                or comm.kind in (NodeKind.SEND, NodeKind.RECV)):
            continue
        order = compute.get(tl.device[j], ())
        k = bisect_right(ends[tl.device[j]], a) if order else 0
        extra = 0.0
        while k < len(order) and tl.start[order[k]] < b:
            i = order[k]
            overlap = min(b, tl.finish[i]) - max(a, tl.start[i])
            if overlap > 0:
                extra += overlap * (comm_slowdown(comm, nodes[i]) - 1.0)
            k += 1
        if extra > 0:
            out = out if out is not None else list(durations)
            out[j] = durations[j] + extra
    return out
