"""Tensor-parallel communication overlapped with its GEMM, as Transformer Engine's
userbuffers run it (Megatron-Core `--tp-comm-overlap`).

With sequence parallelism a column-parallel linear all-gathers its input over the TP
ranks before the GEMM, and a row-parallel linear reduce-scatters its output after it.
Transformer Engine splits both into TP chunks and pipelines them ("split pipelined" /
ring-exchange overlap; Wang et al., "Overlap Communication with Dependent Computation via
Decomposition in Large Deep Learning Models", ASPLOS 2023, and TE's
`transformer_engine/pytorch/module/base.py` userbuffers setup): the GEMM on the chunk a
rank already holds starts at once while the next chunk travels to its ring neighbour, so
the step costs about the GEMM plus one chunk's transfer instead of the GEMM plus the whole
collective. XLA has the same decomposition ("collective matmul", off by default).

The pass rewrites each such pair into that pipeline: an all-gather of T ranks becomes
T-1 point-to-point steps of one chunk each (a collective-permute over the TP group, each
step after the previous one), and every GEMM of the same pass (forward or backward) that
reads the gathered tensor (the Q, K and V projections, or gate and up) becomes T chunks of
1/T of its work, chunk 0 on the local shard and chunk j after step j-1. An FP8 cast
between the gather and the GEMMs (and the transposed copy XLA writes of it) is chunked
with them, and its amax reduction runs on the local shard (Transformer Engine casts, and
transposes, before gathering). A GEMM whose output a TP reduce-
scatter reduces becomes T chunks whose partial results travel in T-1 steps as the next
chunks compute. What else reads a collective's result waits for every chunk.
Collectives with no GEMM beside them, and other collectives, are unchanged. The chunks of
one GEMM run on rotating streams in TE and fill the GPU together; the cost model prices a
chunk as 1/T of the whole GEMM (node meta `gemm_split`, `gemm_output`).

Contract: input a loop-free graph; output a loop-free graph with the same flops and the
same bytes on the TP group's links; node ids are renumbered, overlap windows follow their
nodes. `axis`: the tensor-parallel mesh axis.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from flint.errors import FlintError
from flint.graph import Collective, Node, NodeKind, WorkloadGraph
from flint.hlo.shapes import shapes_bytes

_GLUE = ("elementwise", "reduction", "data_movement")   # a cast between GEMM and RS


@dataclass(frozen=True)
class TpCommOverlap:
    axis: str = "model"
    name: ClassVar[str] = "tp-comm-overlap"

    def run(self, graph: WorkloadGraph) -> WorkloadGraph:
        if graph.loops:
            raise FlintError("tp-comm-overlap needs a loop-free graph (run expand-loops "
                             "first)")
        plan = _Plan(graph, self.axis)
        if not plan.gathers and not plan.scatters:
            return graph
        return _Rewriter(graph, plan).run()


class _Plan:
    """Which collectives overlap which GEMMs. For an all-gather: the GEMMs it feeds (in its
    own pass), the casts between (chunked with them) and the amax reductions that move
    to the local shard."""

    def __init__(self, g: WorkloadGraph, axis: str):
        users = g.users
        self.gathers: dict[int, list[int]] = {}     # all-gather id -> its GEMMs
        self.casts: dict[int, list[int]] = {}       # all-gather id -> casts to chunk
        self.local: dict[int, list[int]] = {}       # all-gather id -> nodes on its shard
        self.scatters: dict[int, int] = {}          # reduce-scatter id -> its GEMM
        self.ranks: dict[int, int] = {}
        claimed: set = set()
        for n in g.nodes:
            c = n.collective
            if c is None or c.type not in ("all-gather", "reduce-scatter"):
                continue
            comm = g.communicators[c.communicator]
            if tuple(comm.mesh_axes) != (axis,) or comm.size < 2:
                continue
            if c.type == "reduce-scatter":
                gemm = _producing_gemm(g, n, users)
                if gemm is not None and gemm not in claimed:
                    claimed.add(gemm)
                    self.scatters[n.id] = gemm
                    self.ranks[n.id] = comm.size
                continue
            gemms, casts, local = _gathered_users(g, n, users, claimed)
            if gemms:
                claimed.update(gemms)
                self.gathers[n.id], self.casts[n.id], self.local[n.id] = gemms, casts, local
                self.ranks[n.id] = comm.size


def _gathered_users(g: WorkloadGraph, ag: Node, users, claimed):
    """(GEMMs to chunk, casts to chunk, reductions to run on the local shard) of a TP
    all-gather: GEMMs of the gather's own phase that read it directly or through one
    elementwise cast, itself read directly or through a layout copy (XLA writes an FP8
    cast's transposed copy as a fusion of its own; Transformer Engine makes both copies of
    the local shard before gathering); reductions that read it and feed no GEMM (an FP8
    amax)."""
    phase = ag.meta.get("phase")

    def gemms_of(i):
        return [v for v in users[i] if g.nodes[v].op_class == "gemm" and v not in claimed
                and g.nodes[v].meta.get("phase") == phase]

    gemms, casts, local = [], [], []
    for u in users[ag.id]:
        node = g.nodes[u]
        if node.op_class == "gemm" and node.meta.get("phase") == phase and u not in claimed:
            gemms.append(u)
        elif node.op_class == "elementwise":
            mine = gemms_of(u)
            copies = {v: gemms_of(v) for v in users[u]
                      if g.nodes[v].op_class == "data_movement"
                      and g.nodes[v].meta.get("phase") == phase}
            copies = {v: read for v, read in copies.items() if read}
            if mine or copies:
                casts.extend([u, *copies])
                gemms.extend(mine + [w for read in copies.values() for w in read])
        elif node.op_class == "reduction" and not any(
                g.nodes[v].op_class == "gemm" for v in users[u]):
            local.append(u)
    return sorted(set(gemms)), casts, local


def _producing_gemm(g: WorkloadGraph, rs: Node, users) -> int | None:
    """The GEMM whose output the reduce-scatter reduces: its input, or through one cast
    or reduction that only feeds it."""
    for i in rs.inputs:
        src = g.nodes[i]
        if src.op_class == "gemm" and users[i] == [rs.id]:
            return i
        if src.op_class in _GLUE and users[i] == [rs.id]:
            gemms = [j for j in src.inputs if g.nodes[j].op_class == "gemm"
                     and users[j] == [i]]
            if len(gemms) == 1:
                return gemms[0]
    return None


def _chunk_shape(shape: str, parts: int) -> str:
    """`shape` with its largest dimension split in `parts` (the gathered or scattered
    sequence), when it divides."""
    head, _, dims = shape.partition("[")
    try:
        sizes = [int(d) for d in dims.rstrip("]").split(",") if d]
    except ValueError:
        return shape
    if not sizes:
        return shape
    k = max(range(len(sizes)), key=lambda j: sizes[j])
    if sizes[k] % parts:
        return shape
    sizes[k] //= parts
    return f"{head}[{','.join(map(str, sizes))}]"


class _Rewriter:
    def __init__(self, g: WorkloadGraph, plan: _Plan):
        self.g, self.plan = g, plan
        self.nodes: list[Node] = []
        self.ids: dict[int, list[int]] = {}      # old id -> new ids standing for it
        self.chunks: dict[int, list[int]] = {}   # old collective id -> its permute steps
        self.sources: dict[int, list[list[int]]] = {}  # old id -> per chunk, its inputs
        self.role: dict[int, tuple[str, int]] = {}
        for c, gemms in plan.gathers.items():
            for u in gemms:
                self.role[u] = ("gemm", c)
            for u in plan.casts[c]:
                self.role[u] = ("cast", c)
            for u in plan.local[c]:
                self.role[u] = ("local", c)
        for c, gemm in plan.scatters.items():
            self.role[gemm] = ("scatter-gemm", c)

    def new(self, node: Node) -> int:
        node.id = len(self.nodes)
        self.nodes.append(node)
        return node.id

    def mapped(self, ids) -> list[int]:
        return sorted({j for i in ids for j in self.ids[i]})

    def run(self) -> WorkloadGraph:
        g = self.g
        for n in g.nodes:
            role, c = self.role.get(n.id, ("", -1))
            if n.id in self.plan.gathers:
                self.gather(n)
            elif n.id in self.plan.scatters:
                self.ids[n.id] = self.chunks[n.id] + self.ids[self.plan.scatters[n.id]][-1:]
            elif role in ("gemm", "cast"):
                self.chunked(n, g.nodes[c])
            elif role == "local":
                self.on_local_shard(n, g.nodes[c])
            elif role == "scatter-gemm":
                self.gemm_before_scatter(n, g.nodes[c])
            else:
                self.copy(n)
        for node in self.nodes:
            c = node.collective
            if c is not None and c.window is not None:
                lo, hi = c.window
                c.window = (self.ids[lo][0], self.ids[hi][-1]) \
                    if self.ids.get(lo) and self.ids.get(hi) else None
        out = WorkloadGraph(g.cluster, self.nodes, list(g.communicators), [],
                            dict(g.meta, tp_comm_overlap=len(self.plan.ranks)))
        out.check()
        return out

    def copy(self, n: Node) -> None:
        node = replace(n, inputs=self.mapped(n.inputs), control=self.mapped(n.control),
                       meta=dict(n.meta))
        if n.collective is not None:
            node.collective = replace(n.collective)
        self.ids[n.id] = [self.new(node)]

    def steps(self, c: Node, size: int, feeds) -> list[int]:
        """T-1 ring steps of `size` bytes over the collective's group; step j starts when
        `feeds(j)` is ready and the previous step is done."""
        col = c.collective
        shape = _chunk_shape(c.outputs[0], self.plan.ranks[c.id]) if c.outputs else "u8[0]"
        ids, last = [], None
        for j in range(self.plan.ranks[c.id] - 1):
            inputs = sorted(set(feeds(j)) | ({last} if last is not None else set()))
            last = self.new(Node(0, f"{c.name}.step{j}", NodeKind.COLLECTIVE,
                                 "collective-permute", "collective", inputs,
                                 bytes_read=size, bytes_written=size, outputs=[shape],
                                 collective=Collective("collective-permute", col.communicator,
                                                       size, size, col.dtype, None, True),
                                 meta=dict(c.meta, tp_comm_overlap=col.type)))
            ids.append(last)
        return ids

    def split(self, n: Node, parts: int, inputs_of) -> list[int]:
        """`n` as `parts` chunks of 1/parts of its work, chunk j reading inputs_of(j)."""
        gemm = n.op_class == "gemm"
        ids, last = [], None
        for j in range(parts):
            meta = dict(n.meta, tp_comm_overlap_chunk=j)
            if gemm:
                meta.update(gemm_split=parts, gemm_output=n.outputs[0] if n.outputs else "")
            ids.append(self.new(replace(
                n, inputs=sorted(set(inputs_of(j))),
                control=sorted(set(self.mapped(n.control)) | ({last} if last is not None
                                                             else set())),
                name=f"{n.name}.chunk{j}", flops=n.flops / parts,
                transcendentals=n.transcendentals / parts,
                bytes_read=n.bytes_read / parts, bytes_written=n.bytes_written / parts,
                outputs=[_chunk_shape(s, parts) for s in n.outputs], meta=meta)))
            last = ids[-1]
        return ids

    def gather(self, c: Node) -> None:
        """The all-gather's ring steps: step j carries chunk j+1 of the gathered tensor."""
        ranks = self.plan.ranks[c.id]
        local = self.mapped(c.inputs)
        size = c.collective.bytes_out // ranks
        # TE casts the local shard (FP8) before gathering: the steps carry the cast bytes
        casts = [shapes_bytes(self.g.nodes[u].outputs[:1]) for u in self.plan.casts[c.id]]
        if casts and min(casts) < c.collective.bytes_out:
            size = min(casts) // ranks
        self.chunks[c.id] = self.steps(c, size, lambda j: local)
        self.ids[c.id] = self.chunks[c.id]
        self.sources[c.id] = [local] + [[s] for s in self.chunks[c.id]]

    def on_local_shard(self, n: Node, c: Node) -> None:
        """A reduction of the gathered tensor (an FP8 amax) run on the local shard."""
        ranks = self.plan.ranks[c.id]
        inputs = self.mapped([i for i in n.inputs if i != c.id] + c.inputs)
        self.ids[n.id] = [self.new(replace(
            n, inputs=inputs, control=self.mapped(n.control), flops=n.flops / ranks,
            transcendentals=n.transcendentals / ranks, bytes_read=n.bytes_read / ranks,
            bytes_written=n.bytes_written / ranks, meta=dict(n.meta)))]

    def chunked(self, n: Node, c: Node) -> None:
        """A cast or GEMM of the gathered tensor, chunk by chunk as the steps arrive."""
        ranks = self.plan.ranks[c.id]
        chunked_inputs = [i for i in n.inputs if i in self.sources]
        others = self.mapped([i for i in n.inputs if i not in self.sources])

        def inputs_of(j):
            return others + [x for i in chunked_inputs for x in self.sources[i][j]]

        self.ids[n.id] = self.split(n, ranks, inputs_of)
        if n.op_class != "gemm":
            self.sources[n.id] = [[x] for x in self.ids[n.id]]

    def gemm_before_scatter(self, n: Node, c: Node) -> None:
        ranks = self.plan.ranks[c.id]
        chunks = self.split(n, ranks, lambda j: self.mapped(n.inputs))
        self.ids[n.id] = chunks
        size = c.collective.bytes_in // ranks
        self.chunks[c.id] = self.steps(c, size, lambda j: [chunks[j]])
