"""Prove a set of Chakra ETs runs to completion under ASTRA-sim's issue rule.

The rule (ASTRA-sim's Workload/HardwareResource, summarized in ../shared/tools/astra-sim/
README.md): a node is ready when all its data and control dependencies are done; ready
nodes are issued smallest id first; one GPU compute node and one communication node (a
collective or a SEND) are in flight per rank at a time, RECVs are exempt; a collective
completes when every member of its process group has issued its own k-th collective on
that group; a SEND completes without waiting for its receiver; a RECV completes once the
matching SEND (source, tag) was issued. A set of ranks that cannot all finish is a
deadlock, and ASTRA-sim would exit 0 without finishing.

The simulation is untimed: compute finishes at once. When a rank's communication nodes
are chained by dependencies (Flint's exports are), at most one of them is ready at a
time, the order ASTRA-sim issues them does not depend on timing, and this proof is exact;
for other ETs it follows one timing (compute in no time).

Lanes: a lane is a list of (kind, id, deps, what) in any order, kind comp | coll | send |
recv. A Flint export needs one lane per pipeline stage, not one per rank: ranks of a stage
run one encoded graph and differ only in whom they talk to, so a collective of the stage
completes when its lane reaches it (`ChakraPlan.lanes`). Files read back from a directory
need one lane per rank (frontends.chakra_ranks).
"""
from __future__ import annotations

import heapq
from collections import defaultdict, deque

from flint.errors import FlintError


class DeadlockError(FlintError):
    """An export some rank would never finish under ASTRA-sim's issue rule."""


def check_plan(plan) -> None:
    """Raise DeadlockError when the exported ranks of `plan` (a ChakraPlan) would not all
    finish in ASTRA-sim. Collectives: `what` is (stage, canonical communicator, text); all
    of a stage's members are one lane."""
    lanes = {}
    for stage, ops in enumerate(plan.lanes):
        lane = []
        for kind, nid, deps, what in ops:
            if kind == "coll":
                lane.append((kind, nid, deps, ((stage, what[1]), (stage,), None, what[2])))
            elif kind in ("send", "recv"):
                lane.append((kind, nid, deps, (tuple(what[0]), what[1], what[2])))
            else:
                lane.append((kind, nid, deps, None))
        lanes[stage] = lane
    simulate(lanes, unit="pipeline stage" if plan.stages > 1 else "rank")


def simulate(lanes: dict, unit: str = "rank") -> None:
    """Run every lane to completion or raise DeadlockError (one line) naming who waits on
    whom. coll what: (group key, member lanes, signature, text); send what: (destination
    lanes, tag, text); recv what: (source lanes, tag, text)."""
    state = {k: _Lane(k, ops) for k, ops in lanes.items()}
    mailbox: dict[tuple, int] = defaultdict(int)       # (src, dst, tag) -> sends issued
    arrived: dict[tuple, dict] = defaultdict(dict)     # (group, k) -> lane -> op
    order: dict[tuple, int] = defaultdict(int)         # (lane, group) -> collectives issued
    work = deque(state)
    while work:
        lane = state[work.popleft()]
        woken = lane.run(mailbox, arrived, order, state)
        work.extend(w for w in woken if w in state)
    stuck = [s for s in state.values() if s.done < len(s.ops)]
    if stuck:
        raise DeadlockError(_explain(stuck[0], state, arrived, unit))


class _Lane:
    def __init__(self, key, ops):
        self.key = key
        self.ops = {}
        self.users = defaultdict(list)
        self.waiting = {}
        self.ready: list[int] = []
        for op in ops:
            if op[1] in self.ops:
                raise FlintError(f"{key}: node id {op[1]} appears twice")
            self.ops[op[1]] = op
        for kind, nid, deps, _ in ops:
            deps = set(deps)
            missing = [d for d in deps if d not in self.ops]
            if missing:
                raise FlintError(f"{key}: node {nid} depends on node {missing[0]}, which is "
                                 f"not in the file")
            self.waiting[nid] = len(deps)
            for d in deps:
                self.users[d].append(nid)
            if not deps:
                self.ready.append(nid)
        heapq.heapify(self.ready)
        self.deferred: list[int] = []     # ready communication waiting for the resource
        self.busy = None                  # the collective in flight
        self.posted: dict[tuple, list[int]] = defaultdict(list)
        self.done = 0

    def finish(self, nid) -> None:
        self.done += 1
        for u in self.users[nid]:
            self.waiting[u] -= 1
            if self.waiting[u] == 0:
                heapq.heappush(self.ready, u)

    def run(self, mailbox, arrived, order, lanes) -> set:
        woken = set()
        while self.ready:
            nid = heapq.heappop(self.ready)
            kind, _, _, what = self.ops[nid]
            if kind == "comp":
                self.finish(nid)
            elif kind == "recv":
                sources, tag, _ = what
                got = next((s for s in sources if mailbox[(s, self.key, tag)] > 0), None)
                if got is None:
                    for s in sources:
                        self.posted[(s, tag)].append(nid)
                else:
                    mailbox[(got, self.key, tag)] -= 1
                    self.finish(nid)
            elif self.busy is not None:
                self.deferred.append(nid)
            elif kind == "send":
                targets, tag, _ = what
                for t in targets:
                    mailbox[(self.key, t, tag)] += 1
                    peer = lanes.get(t)
                    if peer is not None and peer._deliver(self.key, tag, mailbox):
                        woken.add(t)
                self.finish(nid)
            else:                                  # a collective
                group, members, signature, _ = what
                k = order[(self.key, group)]
                order[(self.key, group)] += 1
                self.busy = nid
                here = arrived[(group, k)]
                here[self.key] = nid
                if all(m in here for m in members):
                    _same_collective(here, lanes, group, k)
                    for m in members:
                        peer = lanes[m]
                        peer._complete(here[m])
                        woken.add(m)
                    del arrived[(group, k)]
        return woken - {self.key} | ({self.key} if self.ready else set())

    def _complete(self, nid) -> None:
        self.busy = None
        self.finish(nid)
        for d in self.deferred:
            heapq.heappush(self.ready, d)
        self.deferred.clear()

    def _deliver(self, src, tag, mailbox) -> bool:
        waiting = self.posted.get((src, tag))
        if not waiting:
            return False
        nid = waiting.pop(0)
        mailbox[(src, self.key, tag)] -= 1
        self.finish(nid)
        return True


def _explain(lane: _Lane, lanes: dict, arrived: dict, unit: str) -> str:
    head = "the export would deadlock in ASTRA-sim: "
    if lane.busy is not None:
        what = lane.ops[lane.busy][3]
        here = next((who for (g, _), who in arrived.items()
                     if g == what[0] and who.get(lane.key) == lane.busy), {})
        absent = next((m for m in what[1] if m not in here), None)
        msg = f"{unit} {lane.key} waits in {what[3]} (node {lane.busy})"
        if absent is not None and absent in lanes:
            other = lanes[absent]
            there = (f"in {other.ops[other.busy][3][-1]} (node {other.busy})"
                     if other.busy is not None else "elsewhere and never reaches it")
            msg += f" for {unit} {absent}, which waits {there}"
        elif absent is not None:
            msg += f" for {unit} {absent}, which has no file"
        return head + msg
    for (src, tag), nids in lane.posted.items():
        if nids:
            return head + (f"{unit} {lane.key} waits to receive {lane.ops[nids[0]][3][2]} "
                           f"(node {nids[0]}) from {unit} {src}, whose send never comes")
    nid = min(n for n, w in lane.waiting.items() if w > 0)
    return head + f"{unit} {lane.key} never gets to node {nid}"


def _same_collective(here: dict, lanes: dict, group, k: int) -> None:
    """Members of a group must agree on what its k-th collective is."""
    seen = {}
    for m, nid in here.items():
        seen.setdefault(lanes[m].ops[nid][3][2], m)
    if len(seen) > 1:
        (a, ra), (b, rb) = list(seen.items())[:2]
        raise DeadlockError(f"ranks {ra} and {rb} disagree on collective {k} of process "
                            f"group {group}: {a} vs {b}")

