"""Tensors sharded along a resized mesh axis, found from the graph itself (for
`passes.rescale`).

A gather or scatter over g ranks relates, per operand, a shard to the full tensor along one
dim (full[d] = shard[d] * g). Floating-point data is a parameter, gradient or optimizer
shard (FSDP, ZeRO): the full extent F is fixed by the model and on g' ranks the shard is
F / g'. Integer data (token ids, indices) is each rank's piece of the batch, fixed under
weak scaling: the full tensor becomes shard * g' instead.

The parameter shards seed families: a tensor belongs to a seed's family when its dims,
ignoring 1s, are the seed's dims in any order, alone or with one extra dim equal to a loop
trip count (the scanned layer stack that the optimizer updates whole); its last dim of the
shard extent becomes the new extent (the layer stack's dim leads). A key two seeds
disagree on is dropped, so an ambiguous shape is left alone rather than guessed. Only
nodes joined to those gathers and scatters, to the step's results (the updated parameters
and optimizer state) or to nodes that read a member straight from the step's arguments
(they have no producer), through a chain of nodes that each hold a family member count
(the casts and slices feeding a gather, the accumulation and optimizer update after a
scatter): an activation that merely has a shard's shape is left alone. A collective that
maps a shard operand to a result (or back) along another dim carries the shard through.

A node with a shard tensor has its bytes read and written scaled by how much its operands'
and results' bytes changed, and its flops (and transcendentals) by the ratio of its largest
tensor: elementwise work follows the biggest thing it touches, so an embedding-gradient
scatter that updates a shard from a fixed-size batch keeps its work.
"""
from __future__ import annotations

from flint.errors import FlintError
from flint.graph import Node, WorkloadGraph
from flint.hlo.shapes import Shape, parse_shape, shapes_bytes


def _key(dims) -> tuple[int, ...]:
    return tuple(sorted(d for d in dims if d != 1))


class ShardFamilies:
    """Shape families of shards along the resized axis and their new extents."""

    def __init__(self, graph: WorkloadGraph, resized: dict[int, tuple[int, int]]):
        """`resized`: communicator id -> (old, new) group size, for those that change."""
        self.trips = sorted({lp.trip_count for lp in graph.loops if lp.trip_count > 1})
        self.families: dict[tuple[int, ...], tuple[int, int]] = {}
        self._clash: set[tuple[int, ...]] = set()
        self.sizes: dict[int, set[int]] = {}   # tensors' old nbytes -> new nbytes seen
        seeds = []
        for n in graph.nodes:
            c = n.collective
            if c is None or c.communicator not in resized:
                continue
            g, g2 = resized[c.communicator]
            if c.type == "all-gather":
                self._seed(n, n.operands, n.outputs, g, g2)
            elif c.type == "reduce-scatter":
                self._seed(n, n.outputs, n.operands, g, g2)
            seeds.append(n.id)
        self.reached = self._joined(graph, seeds)

    def _joined(self, graph: WorkloadGraph, seeds: list[int]) -> set[int]:
        """Nodes joined to the seeds through nodes that each hold a family member."""
        def member(i: int) -> bool:
            n = graph.nodes[i]
            return any(self._move(t) for t in n.operands + n.outputs)

        ends = [n.id for n in graph.nodes if (not graph.users[n.id] and member(n.id)) or
                (not n.inputs and any(self._move(t) for t in n.operands))]
        reached, frontier = set(seeds + ends), seeds + ends
        while frontier:
            i = frontier.pop()
            for j in graph.nodes[i].inputs + graph.users[i]:
                if j not in reached and member(j):
                    reached.add(j)
                    frontier.append(j)
        return reached - set(seeds)

    def _seed(self, node: Node, shards, fulls, g: int, g2: int) -> None:
        for shard_text, full_text in zip(shards, fulls):
            done = reshard(node, shard_text, full_text, g, g2)
            move = done[2] if done else None
            if move is None or move[0] == 1:
                continue    # with no dim to tell, a family member's shard dim is a guess
            base = _key(parse_shape(shard_text).dims)
            for key in [base] + [tuple(sorted(base + (t,))) for t in self.trips]:
                if key in self._clash:
                    continue
                if self.families.setdefault(key, move) != move:
                    self._clash.add(key)
                    del self.families[key]

    def _move(self, text: str) -> tuple[int, int] | None:
        shape = parse_shape(text)
        return None if shape.is_tuple else self.families.get(_key(shape.dims))

    def rescaled(self, text: str, joined: bool = True) -> str | None:
        """The new shape of a shard tensor, or None when `text` is not one (or belongs
        to a node not joined to the gathers and scatters)."""
        shape = parse_shape(text)
        move = self._move(text) if joined else None
        if move is None:
            self.sizes.setdefault(shape.nbytes, set()).add(shape.nbytes)
            return None
        d = len(shape.dims) - 1 - shape.dims[::-1].index(move[0])   # stack dims lead
        new = _with_dim(shape, d, move[1])
        self.sizes.setdefault(shape.nbytes, set()).add(new.nbytes)
        return str(new)

    def rescale_node(self, node: Node) -> tuple[float, float] | None:
        """Rewrite a node's shard tensors and scale its cost; (ratio of operand bytes, ratio
        of result bytes) when it changed, else None."""
        joined = node.id in self.reached
        ops = [self.rescaled(t, joined) for t in node.operands]
        outs = [self.rescaled(t, joined) for t in node.outputs]
        if node.collective is not None and len(ops) == len(outs):
            for i, (a, b) in enumerate(zip(node.operands, node.outputs)):
                if ops[i] is not None and outs[i] is None:
                    outs[i] = _carried(a, ops[i], b)
                elif outs[i] is not None and ops[i] is None:
                    ops[i] = _carried(b, outs[i], a)
        if not any(x is not None for x in ops + outs):
            return None
        new_ops = [x or t for x, t in zip(ops, node.operands)]
        new_outs = [x or t for x, t in zip(outs, node.outputs)]
        before = node.operands + node.outputs
        largest = max(range(len(before)), key=lambda i: nbytes(before[i]))
        work = _ratio([before[largest]], [(new_ops + new_outs)[largest]])
        read, written = _ratio(node.operands, new_ops), _ratio(node.outputs, new_outs)
        node.bytes_read *= read
        node.bytes_written *= written
        node.flops *= work
        node.transcendentals *= work
        node.operands, node.outputs = new_ops, new_outs
        return read, written


def reshard(node: Node, shard_text: str, full_text: str, g: int, g2: int):
    """(new shard, new full, (old, new) shard extent or None for batch data) for one
    operand of a gather or scatter going from g to g2 ranks; None when the shapes do not
    show which dim is split."""
    shard, full = parse_shape(shard_text), parse_shape(full_text)
    if shard.is_tuple or full.is_tuple or len(shard.dims) != len(full.dims):
        return None
    diff = [d for d, (a, b) in enumerate(zip(shard.dims, full.dims)) if a != b]
    if len(diff) != 1 or full.dims[diff[0]] != shard.dims[diff[0]] * g:
        return None
    d, extent = diff[0], full.dims[diff[0]]
    if shard.dtype == "pred" or shard.dtype[0] in "su":
        return shard_text, str(_with_dim(full, d, shard.dims[d] * g2)), None
    if extent % g2:
        raise FlintError(f"cannot spread {node.collective.type} {node.name!r} over {g2} ranks: "
                         f"it shards a dim of {extent}, which {g2} does not divide")
    return str(_with_dim(shard, d, extent // g2)), full_text, (shard.dims[d], extent // g2)


def _carried(old: str, new: str, other: str) -> str | None:
    """`other` with the dim that took `old` to `new` changed alike, when it has that dim."""
    a, b, o = parse_shape(old), parse_shape(new), parse_shape(other)
    d = next(i for i, (x, y) in enumerate(zip(a.dims, b.dims)) if x != y)
    if o.is_tuple or len(o.dims) != len(a.dims) or o.dims[d] != a.dims[d]:
        return None
    return str(_with_dim(o, d, b.dims[d]))


def _with_dim(shape: Shape, d: int, extent: int) -> Shape:
    dims = list(shape.dims)
    dims[d] = extent
    return Shape(shape.dtype, tuple(dims))


def nbytes(text: str) -> int:
    return parse_shape(text).nbytes


def _ratio(old: list[str], new: list[str]) -> float:
    before = shapes_bytes(old)
    return shapes_bytes(new) / before if before else 1.0
