"""Co-placement units and the memory bound of a placement in progress, shared by the Baechi
algorithms (`place`, `place_sched`); the rules are spelled out in `place`'s docstring."""
from __future__ import annotations

import numpy as np

from flint.errors import FlintError
from flint.graph import WorkloadGraph
from flint.hlo.shapes import shapes_bytes
from flint.passes.pipeline_stages import arguments_by_layer, layer_index

_MAX_BUCKETS = 16384          # schedule positions per memory bucket grow beyond this


def output_bytes(graph: WorkloadGraph) -> list[float]:
    return [float(shapes_bytes(n.outputs)) for n in graph.nodes]


def _label_key(meta: dict):
    """The block a node belongs to: a layer index, or a block name; a scanned layer's name
    says no index, so there each loop iteration (`expand_loops` tags it) is a block."""
    label = meta.get("layer")
    if not label or label == "optimizer":
        return None
    li = layer_index(label)
    if li is not None:
        return li
    return (str(label), meta["iteration"]) if "iteration" in meta else str(label)


def coplacement_units(graph: WorkloadGraph, durations: list[float], devices: int) -> list[int]:
    """Co-placement unit per node (the rules in `place`'s docstring), numbered by each
    unit's first node; deterministic."""
    n = len(graph.nodes)
    parent = list(range(n))
    key: list = [None] * n
    weight = list(durations)
    cap = sum(durations) / (4 * max(devices, 1))
    first: dict = {}
    for node in graph.nodes:                        # rule 1: same block, same device
        k = _label_key(node.meta)
        if k is not None:
            root = first.setdefault(k, node.id)
            parent[node.id] = root
            key[root] = k
            if root != node.id:
                weight[root] += weight[node.id]

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(a, b):
        ra, rb = find(a), find(b)
        if ra == rb or (key[ra] is not None and key[rb] is not None):
            return
        if key[ra] is None and key[rb] is None and weight[ra] + weight[rb] > cap:
            return
        if rb < ra:
            ra, rb = rb, ra
        parent[rb] = ra
        key[ra] = key[ra] if key[ra] is not None else key[rb]
        weight[ra] += weight[rb]

    users = graph.users
    for node in graph.nodes:                        # rule 2: a sole consumer
        consumers = set(users[node.id])
        if len(consumers) == 1:
            union(node.id, consumers.pop())
    for node in graph.nodes:                        # rule 3: sources with a first consumer
        if not node.inputs and users[node.id]:
            union(node.id, min(users[node.id]))
    sizes = output_bytes(graph)
    for node in graph.nodes:                        # rule 4: backward with its activation
        if node.meta.get("phase") == "backward" and key[find(node.id)] is None:
            fwd = [i for i in node.inputs if graph.nodes[i].inputs
                   and graph.nodes[i].meta.get("phase") == "forward"]
            if fwd:
                union(node.id, max(fwd, key=lambda i: (sizes[i], i)))
    number: dict[int, int] = {}
    return [number.setdefault(find(i), len(number)) for i in range(n)]


def argument_bytes(graph: WorkloadGraph) -> tuple[dict[int, float], float]:
    """Resident bytes by owning node (a layer's parameters and optimizer state belong to
    the first node of the layer, as `apply_placement` accounts them), and the bytes every
    device holds a 1/devices share of (other arguments, step results not aliased to one)."""
    meta = graph.meta
    first: dict[int, int] = {}
    for node in graph.nodes:
        li = layer_index(node.meta.get("layer"))
        if li is not None:
            first.setdefault(li, node.id)
    by_layer, spread = arguments_by_layer(graph)
    owned = {first[li]: nbytes for li, nbytes in by_layer.items()}
    arguments = meta.get("arguments", ())
    aliased = set(meta.get("aliased_arguments", ()))
    aliased_bytes = sum(b for i, (_, b) in enumerate(arguments) if i in aliased)
    return owned, spread + max(float(meta.get("output_bytes", 0)) - aliased_bytes, 0.0)


class Problem:
    """What every algorithm needs: units, their arguments, value lifetimes and the
    per-device memory bookkeeping (see the module docstring)."""

    def __init__(self, graph, durations, comm, sizes, devices, limit, algorithm):
        if devices < 1:
            raise FlintError(f"placement needs at least 1 device, not {devices}")
        self.graph, self.durations, self.sizes = graph, durations, sizes
        self.devices, self.limit, self.algorithm = devices, float(limit), algorithm
        self.comm = [comm(s) for s in sizes]
        n = len(graph.nodes)
        self.unit_of = coplacement_units(graph, durations, devices)
        self.units: list[list[int]] = [[] for _ in range(max(self.unit_of, default=-1) + 1)]
        for v, g in enumerate(self.unit_of):
            self.units[g].append(v)
        users = graph.users
        self.last = [max(users[v], default=v) for v in range(n)]
        self.width = max(1, -(-n // _MAX_BUCKETS))
        self.buckets = max(1, -(-n // self.width))
        owned, spread = argument_bytes(graph)
        self.unit_args = [0.0] * len(self.units)
        for v, nbytes in owned.items():
            self.unit_args[self.unit_of[v]] += nbytes
        self.resident = spread / devices
        # values each unit reads from other units, in schedule order
        external: list[set] = [set() for _ in self.units]
        for node in graph.nodes:
            g = self.unit_of[node.id]
            external[g].update(u for u in node.inputs if self.unit_of[u] != g)
        self.external = [sorted(x) for x in external]
        self._check_lower_bounds()

    def own_intervals(self, g):
        w = self.width
        return [(v // w, self.last[v] // w, self.sizes[v]) for v in self.units[g] if self.sizes[v]]

    def _check_lower_bounds(self) -> None:
        """Clear errors for limits no placement can meet: one unit alone, or the whole
        step spread perfectly over the devices."""
        total = np.zeros(self.buckets + 1)
        worst, worst_unit = 0.0, 0
        for g in range(len(self.units)):
            intervals = self.own_intervals(g)
            need = self.unit_args[g] + _peak(intervals)
            if need > worst:
                worst, worst_unit = need, g
            for a, b, s in intervals:
                total[a] += s
                total[b + 1] -= s
        whole = (sum(self.unit_args) + self.resident * self.devices
                 + float(np.cumsum(total).max(initial=0.0))) / self.devices
        from flint.hardware_models.units import fmt_bytes

        if self.resident + worst > self.limit:
            label = self.graph.nodes[self.units[worst_unit][0]].meta.get("layer") or \
                self.graph.nodes[self.units[worst_unit][0]].name
            raise FlintError(f"{self.algorithm}: memory limit {fmt_bytes(self.limit)} per device "
                             f"is infeasible: co-placed unit {label!r} alone needs "
                             f"{fmt_bytes(self.resident + worst)}")
        if whole > self.limit:
            raise FlintError(f"{self.algorithm}: memory limit {fmt_bytes(self.limit)} per device "
                             f"is infeasible: the step needs at least {fmt_bytes(whole)} per "
                             f"device on {self.devices} devices")
        self.unit_need = worst + self.resident
        self.even_share = whole

    def infeasible(self, node: int, extra: str = "") -> FlintError:
        from flint.hardware_models.units import fmt_bytes

        n = self.graph.nodes[node]
        return FlintError(f"{self.algorithm}: memory limit {fmt_bytes(self.limit)} per device is "
                          f"infeasible: no device has room for {n.name!r} "
                          f"({n.meta.get('layer') or 'unlabelled'}){extra}")


def _peak(intervals) -> float:
    if not intervals:
        return 0.0
    lo = min(a for a, _, _ in intervals)
    hi = max(b for _, b, _ in intervals)
    diff = np.zeros(hi - lo + 2)
    for a, b, s in intervals:
        diff[a - lo] += s
        diff[b - lo + 1] -= s
    return float(np.cumsum(diff).max())


class Memory:
    """Per-device live bytes over the schedule, as units are bound to devices."""

    def __init__(self, problem: Problem, cap: float):
        self.p, self.cap = problem, cap
        self.live = np.zeros((problem.devices, problem.buckets))
        self.peak = [0.0] * problem.devices
        self.held = [problem.resident] * problem.devices
        self.copies: set[tuple[int, int]] = set()   # (value, device) copies reserved
        self.bound = [-1] * len(problem.units)

    def _delta(self, g: int, d: int):
        p = self.p
        out = p.own_intervals(g)
        copies = []
        for u in p.external[g]:
            if self.bound[p.unit_of[u]] == d or not p.sizes[u] or (u, d) in self.copies:
                continue
            copies.append((u, d))
            out.append((u // p.width, p.last[u] // p.width, p.sizes[u]))
        return out, copies

    def _span(self, d: int, intervals):
        lo = min(a for a, _, _ in intervals)
        hi = max(b for _, b, _ in intervals)
        if len(intervals) > 8:
            diff = np.zeros(hi - lo + 2)
            for a, b, s in intervals:
                diff[a - lo] += s
                diff[b - lo + 1] -= s
            return lo, hi, np.cumsum(diff[:-1])
        add = np.zeros(hi - lo + 1)
        for a, b, s in intervals:
            add[a - lo:b - lo + 1] += s
        return lo, hi, add

    def fits(self, g: int, d: int) -> bool:
        intervals, _ = self._delta(g, d)
        base = self.held[d] + self.p.unit_args[g]
        if not intervals:
            return base + self.peak[d] <= self.cap * (1 + 1e-9)
        lo, hi, add = self._span(d, intervals)
        top = max(self.peak[d], float((self.live[d, lo:hi + 1] + add).max()))
        return base + top <= self.cap * (1 + 1e-9)

    def bind(self, g: int, d: int) -> None:
        intervals, copies = self._delta(g, d)
        self.bound[g] = d
        self.held[d] += self.p.unit_args[g]
        self.copies.update(copies)
        if intervals:
            lo, hi, add = self._span(d, intervals)
            self.live[d, lo:hi + 1] += add
            self.peak[d] = max(self.peak[d], float(self.live[d, lo:hi + 1].max()))


def placement_memory(graph: WorkloadGraph, sizes, device_of: list[int],
                     devices: int) -> list[float]:
    """Each device's memory bound for a finished placement (`place`'s docstring; no
    copy reserved for a value that turned out local), in bytes."""
    n = len(graph.nodes)
    users = graph.users
    last = [max(users[v], default=v) for v in range(n)]
    diff = np.zeros((devices, n + 1))
    held_on = {(u, device_of[u]) for u in range(n)}
    for v in range(n):
        for u in graph.nodes[v].inputs:
            held_on.add((u, device_of[v]))
    for u, d in held_on:
        if sizes[u]:
            diff[d, u] += sizes[u]
            diff[d, last[u] + 1] -= sizes[u]
    owned, spread = argument_bytes(graph)
    held = [spread / devices] * devices
    for v, nbytes in owned.items():
        held[device_of[v]] += nbytes
    peaks = np.cumsum(diff, axis=1).max(axis=1)
    return [held[d] + float(peaks[d]) for d in range(devices)]
