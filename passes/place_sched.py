"""m-ETF and m-SCT: list scheduling of a training step over memory-limited devices
(Jeon et al., "Baechi: Fast Device Placement of Machine Learning Graphs", SoCC 2020;
co-placement units and the memory bound as in `place`).

Both simulate the step: a node is ready once its inputs have run; on device d it can start
at max(d free, its last input's arrival), an input made on another device arriving after
the link's transfer time. ETF (Hwang, Chow, Anger and Lee, SIAM J. Comput. 1989) starts
the pair (ready node, device) with the earliest start, ties to the earlier node in the
compiler's schedule. A unit is bound to a device when its first node starts, if the device
has room for the whole unit; otherwise that device is ruled out for the unit.

SCT (Hanen and Munier, "An approximation algorithm for scheduling dependent tasks on m
processors with small communication delays") gives every node at most one favourite child,
one whose edge then costs no transfer: Hanen and Munier round an LP relaxation, which
Baechi hands to an LP solver. That is too slow for 10k-node graphs in Python, so we take
the LP's intent directly: the edges whose transfer would lengthen the longest path the most
(top level of the parent + its time + transfer + bottom level of the child) become
favourite first, greedily, each parent and each child used at most once. A device that
just ran a node whose favourite child is ready, and starts soonest there, waits for that
child (idling if need be) unless another node is urgent: its inputs are on every device
already, so delaying it gains nothing.

Binding follows the data. Nodes that read no other node (weight casts, constants) and
share a unit with other nodes start when their unit is bound, on its device: they wait for
nothing, and letting them bind a unit at time zero would scatter blocks over idle devices
before any data flows. Likewise every node of a unit waits for the values that enter the
unit before its first node in the schedule (a block's input activation), so that the block
goes where that input is cheapest to have.
"""
from __future__ import annotations

from heapq import heappop, heappush

from flint.graph import WorkloadGraph
from flint.passes.place_units import Memory, Problem


def m_etf(graph: WorkloadGraph, durations, comm, memory, devices: int,
          limit: float) -> list[int]:
    """Device per node: memory-constrained earliest task first."""
    problem = Problem(graph, durations, comm, memory, devices, limit, "m-etf")
    return _Scheduler(problem, None).run()


def m_sct(graph: WorkloadGraph, durations, comm, memory, devices: int,
          limit: float) -> list[int]:
    """Device per node: memory-constrained small communication time."""
    problem = Problem(graph, durations, comm, memory, devices, limit, "m-sct")
    return _Scheduler(problem, favourite_children(problem)).run()


def favourite_children(p: Problem) -> list[int]:
    """Favourite child per node (-1 for none), by the greedy rule in the module doc."""
    nodes, dur, comm = p.graph.nodes, p.durations, p.comm
    n = len(nodes)
    top = [0.0] * n
    for v in range(n):
        for u in nodes[v].inputs:
            t = top[u] + dur[u] + comm[u]
            if t > top[v]:
                top[v] = t
    bottom = [0.0] * n
    users = p.graph.users
    for v in range(n - 1, -1, -1):
        longest = 0.0
        for w in users[v]:
            if bottom[w] > longest:
                longest = bottom[w]
        bottom[v] = dur[v] + (comm[v] + longest if users[v] else 0.0)
    edges = sorted(((top[u] + dur[u] + comm[u] + bottom[v], -u, -v)
                    for v in range(n) for u in set(nodes[v].inputs)), reverse=True)
    favourite, taken = [-1] * n, [False] * n
    for _, mu, mv in edges:
        if favourite[-mu] < 0 and not taken[-mv]:
            favourite[-mu] = -mv
            taken[-mv] = True
    return favourite


class _Scheduler:
    def __init__(self, p: Problem, favourite):
        self.p, self.favourite = p, favourite
        self.mem = Memory(p, p.limit)
        nodes, unit_of = p.graph.nodes, p.unit_of
        n, d = len(nodes), p.devices
        busy_units = {unit_of[v] for v in range(n) if nodes[v].inputs}
        self.deferred = [not nodes[v].inputs and unit_of[v] in busy_units for v in range(n)]
        self.sources: list[list[int]] = [[] for _ in p.units]
        for v in range(n):
            if self.deferred[v]:
                self.sources[unit_of[v]].append(v)
        # The values that enter a unit before its first busy node in the schedule (a
        # block's input activation) gate all of it: otherwise a node that needs nothing
        # from there (a block's optimizer update reading a step-size scalar) would bind
        # the block to whichever device is idle long before its data exists.
        first = [n] * len(p.units)
        for v in range(n - 1, -1, -1):
            if nodes[v].inputs:
                first[unit_of[v]] = v
        gate: list[set] = [set() for _ in p.units]
        for g, external in enumerate(p.external):
            gate[g] = {u for u in external if u < first[g] and nodes[u].inputs}
        # inputs a node waits for: all but deferred sources of its own unit, plus its gate
        self.preds = [sorted({u for u in nodes[v].inputs
                              if not (self.deferred[u] and unit_of[u] == unit_of[v])}
                             | (gate[unit_of[v]] if nodes[v].inputs else set()))
                      for v in range(n)]
        self.readers: list[list[int]] = [[] for _ in range(n)]
        for v, preds in enumerate(self.preds):
            for u in preds:
                self.readers[u].append(v)
        self.pending = [len(x) for x in self.preds]
        self.done, self.dev, self.finish = [False] * n, [-1] * n, [0.0] * n
        self.arrival: list = [None] * n          # per device: when a ready node's data is there
        self.urgent = [0.0] * n
        self.free, self.last_op = [0.0] * d, [-1] * d
        self.waiting = [[] for _ in range(d)]    # (data arrival, node)
        self.available = [[] for _ in range(d)]  # node: data there by the time d is free
        self.urgent_heap = [[] for _ in range(d)]
        self.excluded = [0] * len(p.units)       # bit d: device d has no room for the unit
        self.everyone = (1 << d) - 1
        self.remaining = n

    def run(self) -> list[int]:
        for v in range(len(self.preds)):
            if not self.pending[v] and not self.deferred[v]:
                self._ready(v)
        p, mem = self.p, self.mem
        while self.remaining:
            best = None
            for d in range(p.devices):
                c = (self._awake(d) if self.favourite is not None else None) or self._candidate(d)
                if c is not None and (best is None or c + (d,) < best):
                    best = c + (d,)
            if best is None:         # only deferred sources can hold the graph up
                if not self._release_source():
                    raise RuntimeError(f"{p.algorithm}: list scheduling stalled")
                continue
            start, _, v, d = best
            g = p.unit_of[v]
            if mem.bound[g] < 0:
                if not mem.fits(g, d):
                    self.excluded[g] |= 1 << d
                    if self.excluded[g] == self.everyone:
                        raise p.infeasible(v)
                    continue
                mem.bind(g, d)
                for s in self.sources[g]:
                    if not self.done[s] and s != v:
                        self._start(s, d, self.free[d])
                start = max(self.free[d], self.arrival[v][d])
            self._start(v, d, start)
        return self.dev

    def _eligible(self, v: int):
        bound = self.mem.bound[self.p.unit_of[v]]
        if bound >= 0:
            return (bound,)
        mask = self.excluded[self.p.unit_of[v]]
        return [d for d in range(self.p.devices) if not mask >> d & 1]

    def _valid(self, v: int, d: int) -> bool:
        if self.done[v]:
            return False
        g = self.p.unit_of[v]
        bound = self.mem.bound[g]
        return bound == d if bound >= 0 else not self.excluded[g] >> d & 1

    def _ready(self, v: int) -> None:
        devices, comm = self.p.devices, self.p.comm
        arrival = [0.0] * devices
        for u in self.preds[v]:
            here, there, du = self.finish[u], self.finish[u] + comm[u], self.dev[u]
            for d in range(devices):
                t = here if d == du else there
                if t > arrival[d]:
                    arrival[d] = t
        self.arrival[v] = arrival
        self.urgent[v] = max(arrival)
        for d in self._eligible(v):
            heappush(self.waiting[d], (arrival[d], v))
            if self.favourite is not None:
                heappush(self.urgent_heap[d], (self.urgent[v], v))

    def _candidate(self, d: int):
        """(start, 1, node) of the node device d would start next under ETF."""
        free, waiting, available = self.free[d], self.waiting[d], self.available[d]
        while waiting and waiting[0][0] <= free:
            v = heappop(waiting)[1]
            if self._valid(v, d):
                heappush(available, v)
        while available and not self._valid(available[0], d):
            heappop(available)
        if available:
            return (free, 1, available[0])
        while waiting and not self._valid(waiting[0][1], d):
            heappop(waiting)
        return (waiting[0][0], 1, waiting[0][1]) if waiting else None

    def _awake(self, d: int):
        """SCT: (start, 0, node) when device d waits for its last node's favourite child."""
        last = self.last_op[d]
        child = self.favourite[last] if last >= 0 else -1
        if child < 0 or self.arrival[child] is None or not self._valid(child, d):
            return None
        arrival = self.arrival[child]
        here = max(self.free[d], arrival[d])
        if any(max(self.free[e], arrival[e]) < here for e in self._eligible(child)):
            return None
        heap = self.urgent_heap[d]
        while heap and not self._valid(heap[0][1], d):
            heappop(heap)
        if heap and heap[0][0] <= self.free[d]:
            return (self.free[d], 0, heap[0][1])
        return (here, 0, child)

    def _start(self, v: int, d: int, start: float) -> None:
        self.done[v], self.dev[v] = True, d
        self.finish[v] = self.free[d] = start + self.p.durations[v]
        self.last_op[d] = v
        self.remaining -= 1
        for r in self.readers[v]:
            self.pending[r] -= 1
            if not self.pending[r]:
                self._ready(r)

    def _release_source(self) -> bool:
        """Readers in other units wait for deferred sources whose unit no node has bound
        yet; when nothing else can run, let the first such source bind its unit."""
        for v, deferred in enumerate(self.deferred):
            if deferred and not self.done[v] and self.mem.bound[self.p.unit_of[v]] < 0:
                self.deferred[v] = False
                self._ready(v)
                return True
        return False
