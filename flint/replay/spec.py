"""WorkloadGraph -> replay spec: the plain-data recipe a replay program executes.

One entry per node, in graph (schedule) order. Every operand names where its data comes
from: the output of an earlier node whose shape matches (so the replay's data flow, buffer
lifetimes and dependencies are the graph's), or a persistent input buffer of that shape (the
step's parameters, optimizer state and batch, which the graph reads but does not compute).
A node's emulation keeps what its cost depends on:

- `gemm` (GEMMs, convolutions, attention): a batched matmul with the node's flops and its
  operands' element counts and dtypes, [b, m, k] x [b, k, n] (the operands' elements are
  re-viewed, which is free);
- `ew` (every other compute and memory node): reads `bytes_read` from its operands and
  writes its outputs; a node whose transcendentals cover most of its output applies tanh;
- `coll`: the same collective (all-reduce, all-gather, reduce-scatter, all-to-all,
  collective-permute) on the same operand shapes, over the mesh (sub-)axes whose groups are
  its communicator's groups (`replay_mesh`);
- `nop`: a RECV (its data arrives through the matching SEND's permute).

Persistent buffers are distinct per use (so the compiler cannot merge two ops that read
the same-shaped parameter) until their bytes reach what the step's arguments hold, then
reused round-robin per shape. Buffer 0 is a scalar: ops with no operands read it, so none
folds to a constant. The spec is JSON: it is embedded in the generated program, which needs only JAX to run.
"""
from __future__ import annotations

import math

from flint.cluster import prime_factors
from flint.errors import FlintError
from flint.graph import TENSOR_CLASSES, NodeKind, OpClass, WorkloadGraph
from flint.hlo.shapes import DTYPE_BITS, Shape, parse_shape

FORMAT = "flint.replay"
VERSION = 1
GEMM_CLASSES = set(TENSOR_CLASSES)
DEFAULT_BUFFER_BUDGET = 1 << 30     # bytes per device, when the graph lists no arguments
COLLECTIVE_TYPES = {"all-reduce", "all-gather", "reduce-scatter", "all-to-all",
                    "collective-permute"}


def replay_spec(graph: WorkloadGraph) -> dict:
    """The replay recipe of an SPMD graph without loops (run `ExpandLoops` first)."""
    if graph.loops:
        raise FlintError("replay needs a graph without loops: run the expand-loops pass first")
    if any(n.device is not None for n in graph.nodes):
        raise FlintError("replay needs an SPMD graph; this one is placed on several devices "
                         "(pipeline or placement output), which a single program cannot replay")
    if not graph.nodes:
        raise FlintError("the graph has no nodes to replay")
    builder = _SpecBuilder(graph)
    ops = [builder.op(n) for n in graph.nodes]
    _mark_repeats(ops)
    return {
        "buffers": builder.buffers,
        "format": FORMAT, "version": VERSION,
        "mesh": builder.mesh,
        "graph_mesh": [[a, s] for a, s in graph.cluster.mesh],
        "devices": graph.cluster.devices,
        "hardware": graph.cluster.hardware,
        "ops": ops,
        "sinks": builder.sinks(ops),
        "approximations": dict(sorted(builder.approximations.items())),
    }


def prepared(graph: WorkloadGraph) -> WorkloadGraph:
    """Loops unrolled: the replay runs every iteration's ops in order."""
    from flint.passes.expand_loops import ExpandLoops

    return ExpandLoops().run(graph)


def _shape(text: str) -> list | None:
    """'bf16[8,128]{1,0}' -> ['bf16', [8, 128]]; None for tuples, tokens and unknown dtypes."""
    try:
        s = parse_shape(text)
    except FlintError:
        return None
    if s.is_tuple or s.dtype not in DTYPE_BITS or s.dtype == "token":
        return None
    return [s.dtype, list(s.dims)]


def _elements(shape: list) -> int:
    return math.prod(shape[1])


def nbytes(shape: list) -> int:
    return Shape(shape[0], tuple(shape[1])).nbytes


class _SpecBuilder:
    def __init__(self, graph: WorkloadGraph):
        self.graph = graph
        self.outputs = [[s for s in map(_shape, n.outputs) if s is not None] for n in graph.nodes]
        self.approximations: dict[str, int] = {}
        self.mesh = replay_mesh(graph.cluster.mesh)
        self.axes: dict[int, list[str] | None] = {}      # communicator id -> sub-axes
        self.buffers: list[list] = [["f32", []]]
        self.by_shape: dict[tuple, list[int]] = {}
        self.uses: dict[tuple, int] = {}
        self.buffer_bytes = 0
        argument_bytes = sum(b for _, b in graph.meta.get("arguments", []))
        self.budget = argument_bytes or DEFAULT_BUFFER_BUDGET

    def buffer(self, shape: list) -> list[int]:
        """[-1, j]: persistent buffer j of `shape`, a new one while within the budget."""
        key = (shape[0], tuple(shape[1]))
        ids = self.by_shape.setdefault(key, [])
        use = self.uses[key] = self.uses.get(key, -1) + 1
        if not ids or self.buffer_bytes + nbytes(shape) <= self.budget:
            if use >= len(ids):
                ids.append(len(self.buffers))
                self.buffers.append(shape)
                self.buffer_bytes += nbytes(shape)
        return [-1, ids[use % len(ids)]]

    def note(self, what: str) -> None:
        self.approximations[what] = self.approximations.get(what, 0) + 1

    def op(self, n) -> dict:
        operands = [s for s in map(_shape, n.operands) if s is not None]
        sources = [src or self.buffer(shape)
                   for src, shape in zip(self.match(n, operands), operands)]
        base = {"id": n.id, "name": n.name, "in": sources, "shapes": operands,
                "out": self.outputs[n.id]}
        if n.kind == NodeKind.RECV:
            return {**base, "op": "nop", "in": [], "shapes": []}
        if n.collective is not None:
            return {**base, **self.collective(n, operands)}
        if n.op_class == OpClass.ATTENTION and isinstance(n.meta.get("attention"), dict):
            fused = self.attention(n, operands)
            if fused is not None:
                extra_shape, op = fused
                return {**base, "in": sources + [self.buffer(extra_shape)],
                        "shapes": operands + [extra_shape], **op}
        if n.op_class in GEMM_CLASSES:
            gemm = self.gemm(n, operands)
            if gemm is not None:
                return {**base, **gemm}
            self.note(f"{n.op_class} replayed by bytes (shapes do not give a matmul)")
        return {**base, **self.elementwise(n)}

    def match(self, n, operands: list) -> list:
        """For each operand, [producer id, output index] of an unused equal-shaped output of
        one of the node's inputs, else None (to be read from a persistent buffer)."""
        used: set[tuple[int, int]] = set()
        sources = []
        for shape in operands:
            candidates = [(i, k, s) for i in n.inputs for k, s in enumerate(self.outputs[i])
                          if (i, k) not in used]
            exact = [(i, k) for i, k, s in candidates if s == shape]
            same_size = [(i, k) for i, k, s in candidates
                         if s[0] == shape[0] and _elements(s) == _elements(shape)]
            found = (exact or same_size or [None])[0]
            if found:
                used.add(found)
            sources.append(list(found) if found else None)
        return sources

    def gemm(self, n, operands: list) -> dict | None:
        """[b, m, k] x [b, k, n] from the two largest operands and the node's flops."""
        out = self.outputs[n.id]
        if not out or n.flops <= 0 or len(operands) < 2:
            return None
        e_out = _elements(out[0])
        k = n.flops / (2 * e_out)        # flops are per execution
        if k < 1 or abs(k - round(k)) > 1e-6:
            return None
        k = round(k)
        order = sorted(range(len(operands)), key=lambda i: -_elements(operands[i]))
        a, b = sorted(order[:2])
        ea, eb = _elements(operands[a]), _elements(operands[b])
        batch, rem = divmod(ea * eb, e_out * k * k)
        if batch < 1 or rem or ea % (batch * k) or eb % (batch * k):
            return None
        m, nn = ea // (batch * k), eb // (batch * k)
        if batch * m * nn != e_out:
            return None
        return {"op": "gemm", "bmkn": [batch, m, k, nn], "lhs": a, "rhs": b}

    def attention(self, n, operands: list):
        """A fused attention call as one batched matmul with its flops: the queries
        [B*H, Sq, D] against a [B*H, D, N] operand from a persistent buffer, N = flops /
        (2 B H Sq D) (the key length, halved when causal, x2.5 for the backward)."""
        a = n.meta["attention"]
        try:
            bh, sq, d = int(a["batch"]) * int(a["heads"]), int(a["seq_q"]), int(a["head_dim"])
        except (KeyError, TypeError, ValueError):
            return None
        if not operands or bh * sq * d != _elements(operands[0]) or n.flops <= 0:
            return None
        width = max(1, round(n.flops / (2 * bh * sq * d)))
        extra = [operands[0][0], [bh, d, width]]
        return extra, {"op": "gemm", "bmkn": [bh, sq, d, width], "lhs": 0,
                       "rhs": len(operands)}

    def elementwise(self, n) -> dict:
        out = self.outputs[n.id] or [["f32", [max(1, int(n.bytes_written) // 4)]]]
        e_out = sum(_elements(s) for s in out)
        return {"op": "ew", "out": out, "read_bytes": int(n.bytes_read),
                "tanh": bool(n.transcendentals >= 0.5 * e_out)}

    def collective(self, n, operands: list) -> dict:
        c = n.collective
        comm = self.graph.communicator(n)
        kind = c.type if c.type in COLLECTIVE_TYPES else "all-reduce"
        if kind != c.type:
            self.note(f"{c.type} replayed as all-reduce")
        every = [a for a, _ in self.mesh]
        d = {"op": "coll", "type": kind, "axes": every, "group": comm.size}
        if kind == "collective-permute" or comm.kind == "pairs":
            d["type"] = "collective-permute"
            d["pairs"] = comm.groups().tolist()
        else:
            if comm.id not in self.axes:
                self.axes[comm.id] = sub_axes_of(comm, self.mesh)
            if self.axes[comm.id] is None:
                self.note("collective whose groups no set of mesh sub-axes forms "
                          "(replayed over every device)")
            d["axes"] = self.axes[comm.id] or every
            d["group"] = math.prod(dict(self.mesh)[a] for a in d["axes"])
        if not operands:   # no shapes recorded: a flat buffer of the bytes sent
            self.note("collective without operand shapes replayed from its bytes")
            d["shapes"] = [[_dtype(c.dtype), [max(1, c.bytes_in // _itemsize(c.dtype))]]]
            d["in"] = [self.buffer(d["shapes"][0])]
        return d

    def sinks(self, ops: list) -> list[list[int]]:
        """Outputs no replayed op reads: the step returns them, so none is dead code."""
        read = {tuple(s) for op in ops for s in op["in"]}
        return [[op["id"], k] for op in ops for k in range(len(op["out"]))
                if (op["id"], k) not in read and op["op"] != "nop"]


def _mark_repeats(ops: list) -> None:
    """A GEMM or collective on exactly the data an earlier one of its kind read (e.g. one
    weight gathered for the forward and again for the backward) is `repeat`: the runtime
    offsets its input first, else XLA's CSE would run the two as one."""
    seen = set()
    for op in ops:
        if op["op"] in ("gemm", "coll"):
            key = (op["op"], op.get("type"), tuple(map(tuple, op["in"])))
            op["repeat"] = key in seen
            seen.add(key)


def replay_mesh(mesh) -> list[list]:
    """The graph's mesh with every axis split into prime factors, major first (`fsdp=4` ->
    `fsdp_0=2, fsdp_1=2`): ranks keep their row-major order, and XLA's groups that run along
    part of an axis (e.g. every other fsdp rank) become groups over named sub-axes."""
    out = []
    for name, size in mesh:
        factors = prime_factors(size)
        out += [[name, size]] if len(factors) <= 1 else \
            [[f"{name}_{i}", p] for i, p in enumerate(factors)]
    return out


def sub_axes_of(comm, sub) -> list[str] | None:
    """The sub-axes of `replay_mesh` whose groups are exactly `comm`'s, or None."""
    import itertools

    import numpy as np

    want = {tuple(sorted(r)) for r in comm.groups().tolist()}
    spanned = [i for i, (name, _) in enumerate(sub)
               if name.rsplit("_", 1)[0] in comm.mesh_axes or name in comm.mesh_axes]
    ranks = np.arange(math.prod(s for _, s in sub)).reshape([s for _, s in sub])

    def groups(keep):
        rest = [i for i in range(len(sub)) if i not in keep]
        size = math.prod(sub[i][1] for i in keep)
        return {tuple(sorted(r)) for r in ranks.transpose(rest + list(keep))
                .reshape(-1, size).tolist()}

    if groups(spanned) == want:                      # whole mesh axes: the common case
        return [sub[i][0] for i in spanned]
    for r in range(1, len(sub) + 1):
        for keep in itertools.combinations(range(len(sub)), r):
            if math.prod(sub[i][1] for i in keep) == comm.size and groups(keep) == want:
                return [sub[i][0] for i in keep]
    return None


def _dtype(name: str) -> str:
    return name if name in DTYPE_BITS and name not in ("token", "tuple") else "f32"


def _itemsize(name: str) -> int:
    return max(1, DTYPE_BITS.get(_dtype(name), 32) // 8)
