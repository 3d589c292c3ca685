"""Event-driven schedule of one device's step: a compute stream plus communication streams.

Nodes issue in the compiler's schedule order. Compute nodes and synchronous collectives
run on the compute stream; an async collective is issued when the compute stream reaches
its start and runs on its own stream, overlapping the work the compiler placed in its
window; whoever consumes its result waits for it. Loops are expanded first so that every
instance is placed.

Communication and computation that overlap on one GPU slow each other (NCCL's kernels hold
SMs and move bytes through HBM; Echo, arXiv 2412.12487, measures this): with a
`slowdown(compute node, collective node)` factor, a compute node that runs while async
communication is in flight on its device progresses at 1/factor of its speed until that
communication ends.

A device's asynchronous collectives share its links whichever stream issues them
(FSDP2's all-gather stream beside the reduce-scatters): NCCL kernels on two streams move
their bytes over the same NVLink and NIC ports, and each collective's time here is priced
with the full bandwidth, so two in flight at once would each get bandwidth that only one
has. Two that share a link run one at a time: each takes the earliest interval, from
when it could start, in which its links (hardware_models.links: the scale-up domain, the
NIC) are free on the device; a tensor-parallel all-reduce inside the NVLink domain and a
data-parallel reduction that leaves through the NIC share none and run at once, as their
NCCL communicators do. A pipeline's point-to-point sends
(and their receives, the far end of the same transfer) are not queued behind them: NCCL
runs send/recv on its own point-to-point channels, and a stage-boundary activation is
small beside a data-parallel reduction, which would otherwise hold the pipeline's
critical path for its whole length where the real transfer only shares bandwidth with
it. (Where one stream issues every collective, as in XLA's GPU programs, its own order
already does this.)

A TPU has no collective stream: libtpu's async collectives are DMAs over the ICI that the
TensorCore issues at their start and waits for at their done (Cloud TPU system
architecture), and XLA's scheduler keeps several in flight at once on purpose (its
latency-hiding scheduler bounds them per kind, e.g. up to 5 collective-permutes in its
tests, latency_hiding_scheduler_test.cc kMaxConcurrentAsyncCollectivePermutes; the
bidirectional windowed einsum starts its forward and backward permute together, Wang et
al., ASPLOS 2023). On a TPU graph those in flight together run at once where their link
directions are disjoint (links.torus_links) and in turn where they share one, rather than
one after another in issue order.

PyTorch eager and Inductor kernels are launched by the host one at a time (populations.py:
LAUNCH_S of host time each); the host runs ahead of the GPU while kernels are long, and a
run of short kernels waits for their launches (`Timeline.launch_wait`: a compute stream
idle for want of work, not for communication). XLA launches from command buffers.
A kernel launched on its own (not replayed from a CUDA graph) also starts the GPU's launch
gap after the stream's last kernel ended, however far ahead the host is (`gaps`, from the
cost model's `launch_gap`; counted in `launch_wait` too).
Where launches block (node meta `launch_blocking`, CUDA_LAUNCH_BLOCKING=1) the host waits
for each kernel of the compute stream to finish before it launches the next, so each one
starts a whole launch round trip (populations.BLOCKING_LAUNCH_S) after the host's last
kernel ended; the run's own flags say that nothing else overlaps (flint.run).

Multi-device (MPMD) graphs, made by the pipeline and placement passes, tag nodes with
`meta["device"]`: each device then has its own set of streams, and a RECV that depends on
a SEND starts with it (a rendezvous, as NCCL's send/recv are) rather than after it.
"""
from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from dataclasses import dataclass, field

from flint.graph import NodeKind, WorkloadGraph
from flint.hardware_models.links import BOTH
from flint.hardware_models.populations import (BLOCKING_LAUNCH_S, LAUNCH_S, host_launches,
                                               stream_kernels)


@dataclass
class Timeline:
    graph: WorkloadGraph                  # the (loop-expanded) graph that was scheduled
    start: list[float]
    finish: list[float]
    stream: list[str]
    device: list[int] = field(default_factory=list)   # meta["device"], 0 when untagged
    critical_path: list[int] = field(default_factory=list)
    launch_wait: list[float] = field(default_factory=list)   # s a node waited for its launch

    @property
    def step_time(self) -> float:
        return max(self.finish, default=0.0)


def stream_of(node, duplex: bool = True) -> str:
    """The stream a node runs on. `duplex`: a NIC port is full duplex, so a stage's sends
    (to the next stage) and receives (from the previous one) move at once, as Megatron's
    batched isend/irecv do; without it both share one point-to-point stream (what an
    ASTRA-sim rank, one collective in flight, runs). A transfer marked `half_duplex` takes
    that one stream anyway: its framework issues one blocking send or receive at a time
    (passes.pipeline, blocking-serial)."""
    if node.meta.get("stream"):     # a framework's own stream (FSDP2's all-gathers)
        return node.meta["stream"]
    c = node.collective
    if c is not None and c.is_async:
        if node.kind not in (NodeKind.SEND, NodeKind.RECV):
            return "collectives"
        if not duplex or node.meta.get("half_duplex"):
            return "p2p"
        return "p2p-send" if node.kind == NodeKind.SEND else "p2p-recv"
    if node.meta.get("async") and node.kind == NodeKind.MEMORY:
        return "copies"
    return "compute"


def simulate(graph: WorkloadGraph, durations: list[float], slowdown=None,
             duplex: bool = True, holds: list | None = None,
             links: list[frozenset] | None = None,
             gaps: list[tuple[float, int]] | None = None) -> Timeline:
    """Place every node of a loop-free graph; `durations[i]` is node i's time in seconds
    when it runs alone; `slowdown(node, comm_node)` (>= 1) stretches overlapped compute;
    `duplex` as in stream_of; `holds[i]`: seconds compute node i holds its device's
    collective channels itself (a layer-template block's own collectives, which run
    between its compute), a number (all of its links) or {link class: seconds}: they take
    the free time of those links from its start, and the node ends when its own time and
    theirs are both done. `links[i]`: the link classes (hardware_models.links) collective i
    moves its bytes over; collectives queue per device and link class, so two on disjoint
    links run at once (None: one queue per device). `gaps[i]`: (the GPU's launch gap in
    seconds, the kernels compute node i starts one by one: populations.stream_kernels):
    each of them starts that long after the stream's previous kernel ended."""
    if graph.loops:
        raise ValueError("simulate() needs a loop-free graph: run ExpandLoops first")
    n = len(graph.nodes)
    start, finish = [0.0] * n, [0.0] * n
    streams = [stream_of(node, duplex) for node in graph.nodes]
    # streams whose work runs in issue order; a TPU's collectives queue on their links only
    tpu = graph.cluster.platform == "tpu"
    serial = [not (tpu and s == "collectives") for s in streams]
    devices = [node.device_or_0 for node in graph.nodes]
    free: dict[tuple, float] = defaultdict(float)
    last_on: dict[tuple, int] = {}
    why = [-1] * n                       # the node whose finish set this node's start
    last_compute: dict[int, int] = {}
    in_flight: dict[int, list[int]] = defaultdict(list)   # device -> async comm nodes
    kinds = [node.kind for node in graph.nodes]
    own_stream = [bool(node.meta.get("stream")) for node in graph.nodes]
    # (device, link class) -> its transfers' intervals
    network: dict[tuple[int, str], _Busy] = defaultdict(_Busy)
    host: dict[int, float] = defaultdict(float)          # device -> its launch thread's clock
    launches = [0 if "composite" in node.meta else host_launches(node) for node in graph.nodes]
    launch_wait = [0.0] * n
    # kernels whose launch returns only when they have run: the host's clock is their end
    blocks = [bool(node.meta.get("launch_blocking")) and "composite" not in node.meta and (
        bool(k) or node.collective is not None) for node, k in zip(graph.nodes, launches)]
    for node in graph.nodes:
        i = node.id
        ready, because = 0.0, -1
        rendezvous = kinds[i] == NodeKind.RECV
        for d in node.inputs + node.control:
            t = start[d] if rendezvous and kinds[d] == NodeKind.SEND else finish[d]
            if t > ready:
                ready, because = t, d
        dev = devices[i]
        s = (dev, streams[i])
        # Work on a framework's own stream is issued by the host ahead of the compute
        # stream (FSDP2 prefetch): only its inputs and control edges gate it.
        issue = 0.0 if own_stream[i] else free[(dev, "compute")]
        queued = free[s] if serial[i] else 0.0
        start_at = max(ready, issue, queued)
        if start_at == queued and s in last_on and queued > ready:
            because = last_on[s]
        elif start_at == issue and issue > ready and dev in last_compute:
            because = last_compute[dev]
        blocking = blocks[i] and streams[i] == "compute"
        gap, kernels = gaps[i] if gaps is not None and streams[i] == "compute" else (0.0, 0)
        if kernels and s in last_on and free[s] + gap > start_at:
            # the front end starts a kernel launched on its own only after the stream's
            # last one has drained
            launch_wait[i] = free[s] + gap - start_at
            start_at, because = free[s] + gap, last_on[s]
        if blocking or (launches[i] and streams[i] == "compute"):
            host[dev] += (max(launches[i], 1) * BLOCKING_LAUNCH_S if blocking
                          else launches[i] * LAUNCH_S)
            if host[dev] > start_at:
                launch_wait[i] += host[dev] - start_at
                start_at = host[dev]
        d = durations[i] + (kernels - 1) * gap if kernels else durations[i]
        if node.collective is not None and streams[i] != "compute" and kinds[i] not in (
                NodeKind.RECV, NodeKind.SEND):
            used = links[i] if links is not None else BOTH
            start_at, blocker = _place_all([network[(dev, k)] for k in sorted(used)],
                                           start_at, d, i)
            if blocker >= 0:
                because = blocker
        start[i] = start_at
        if slowdown is not None and streams[i] == "compute" and in_flight[dev]:
            d = _stretched(node, d, start_at, in_flight, dev, finish, graph, slowdown)
        if holds is not None and holds[i] and streams[i] == "compute":
            held = holds[i] if isinstance(holds[i], dict) else dict.fromkeys(BOTH, holds[i])
            d = max([start_at + d] + [network[(dev, k)].fill(start_at, d, c, i)
                                      for k, c in sorted(held.items()) if c > 0]) - start_at
        finish[i] = start_at + d
        if streams[i] != "compute" and node.collective is not None:
            in_flight[dev].append(i)
        if blocking:
            host[dev] = finish[i]
        free[s] = finish[i]
        last_on[s] = i
        if streams[i] == "compute":
            last_compute[dev] = i
        why[i] = because
    timeline = Timeline(graph, start, finish, streams, devices, launch_wait=launch_wait)
    if n:
        cur = max(range(n), key=lambda j: finish[j])
        path = []
        while cur >= 0:
            path.append(cur)
            cur = why[cur]
        timeline.critical_path = path[::-1]
    return timeline


def launch_gaps(graph: WorkloadGraph, model) -> list[tuple[float, int]] | None:
    """Per node of a loop-free graph, (the launch gap of `model`'s GPU, the kernels the
    node's stream starts one by one: populations.stream_kernels); None where the model
    has no gap (a TPU or CPU, or a cost model without `launch_gap`)."""
    gap = getattr(model, "launch_gap", None)
    seconds = gap() if callable(gap) else 0.0
    if seconds <= 0:
        return None
    return [(seconds, stream_kernels(node)) for node in graph.nodes]


class _Busy:
    """Disjoint busy intervals of one device's network, sorted."""

    def __init__(self):
        self.starts: list[float] = []
        self.ends: list[float] = []
        self.nodes: list[int] = []

    def earliest(self, t: float, d: float) -> tuple[float, int]:
        """(the earliest start >= t of a free interval of length d, the node whose end
        it waited for or -1)."""
        k = bisect_right(self.ends, t)
        blocker = -1
        while k < len(self.starts) and self.starts[k] < t + d:
            if self.ends[k] > t:
                t, blocker = self.ends[k], self.nodes[k]
            k += 1
        return t, blocker

    def take(self, t: float, d: float, node: int) -> None:
        """Mark [t, t + d) busy (free: found by `earliest`)."""
        if d > 0:
            k = bisect_right(self.starts, t)
            self.starts.insert(k, t)
            self.ends.insert(k, t + d)
            self.nodes.insert(k, node)

    def fill(self, t0: float, d: float, c: float, node: int) -> float:
        """Work of length `d` from `t0` whose own transfers need `c` seconds of the
        network, taken piece by piece in its free gaps from `t0` on: when the work and
        its transfers are both done."""
        t, k, pieces, left = t0, bisect_right(self.ends, t0), [], c
        while left > 0:
            while k < len(self.starts) and self.starts[k] <= t:
                t = max(t, self.ends[k])
                k += 1
            gap = (self.starts[k] if k < len(self.starts) else float("inf")) - t
            take = min(gap, left)
            if take > 0:
                pieces.append((t, t + take))
            left -= take
            t += take
        for a, b in pieces:
            j = bisect_right(self.starts, a)
            self.starts.insert(j, a)
            self.ends.insert(j, b)
            self.nodes.insert(j, node)
        return max(t0 + d, pieces[-1][1] if pieces else t0)


def _place_all(busy: list[_Busy], t: float, d: float, node: int) -> tuple[float, int]:
    """The earliest start >= t at which every one of `busy` is free for d (and the node
    whose end it waited for, or -1); the interval is then taken on all of them."""
    blocker, moved = -1, True
    while moved:
        moved = False
        for b in busy:
            t2, who = b.earliest(t, d)
            if t2 > t:
                t, blocker, moved = t2, who, True
    for b in busy:
        b.take(t, d, node)
    return t, blocker


def _stretched(node, d: float, t: float, in_flight: dict, dev: int, finish: list, graph,
               slowdown) -> float:
    """Duration of compute work `d` started at `t` beside the device's in-flight comms."""
    live = [j for j in in_flight[dev] if finish[j] > t]
    in_flight[dev] = live
    if not live:
        return d
    window = max(finish[j] for j in live) - t
    factor = max(slowdown(node, graph.nodes[j]) for j in live)
    if factor <= 1.0:
        return d
    if d * factor <= window:
        return d * factor
    return window + (d - window / factor)
