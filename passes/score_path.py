"""The score path of an unfused attention core as the framework's own kernels run it.

Framework megatron compiles an unfused core as the JAX twin writes it: QK^T and PV as
batched GEMMs, and XLA's fusions of the scale, causal mask and softmax between them (and
of their gradients), priced as library kernels where Megatron-LM runs its
FusedScaleMaskSoftmax (megatron/model/fused_softmax.py). Two things Megatron-LM runs are
not in that program, and this pass adds them as the PyTorch kernels they are:

- Dropout on the probabilities (`dropout` > 0: Megatron-LM's --attention-dropout, 0.1 by
  default there; ParallelAttention applies torch's dropout after the fused softmax).
  Forward, one kernel reads the probabilities and writes them and a bool mask (ATen's
  native_dropout, what F.dropout runs on a GPU); backward, one kernel reads the gradient
  and the mask and writes the gradient (native_dropout_backward).
- `softmax="eager"`: the score path of Megatron-LM 2019, before its fused kernels
  (mpu/transformer.py GPT2ParallelSelfAttention): divide by sqrt(head dim), multiply by
  the causal mask, subtract 10000 x (1 - mask), torch.nn.Softmax, each one PyTorch
  kernel over the S x S scores; backward, softmax's backward and the gradients of the
  multiply and the divide (the subtract of a constant passes its gradient through). The
  compiled fusions they stand for are replaced.

Softmax moves the scores as hardware_models.attention_kernels.UNFUSED_SOFTMAX_PASSES says
PyTorch's does (three reads and a write forward; backward, two reads of each input and a
write).

A score GEMM is a GEMM whose output has the S x S scores as its last two dimensions (QK^T,
and the probabilities' gradient dO V^T); a node of the score path is a non-GEMM compute
node of the same attention call that reads or writes as many elements as the scores. The
calls are told apart by the JAX name stack of their ops (a forward, its recomputation,
the backward: is_backward).

Contract: input a loop-free graph; output the same graph with each score path's chain
(its compiled fusions, kept or replaced, and the added kernels) in order on the compute
stream where the path's last node ran: the chain's first node takes the path's inputs
from outside it, its last feeds the path's readers, and a node the compiler put between
the path's nodes runs before the chain or right after it (after it where it reads the
path; inside the path where it also feeds it). Node ids are renumbered; overlap windows
follow their nodes. A graph with no such score path is refused in one line (a run asking
for these kernels never silently goes without them).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import ClassVar

from flint.errors import FlintError
from flint.graph import Node, NodeKind, OpClass, WorkloadGraph
from flint.hardware_models.attention_kernels import UNFUSED_SOFTMAX_PASSES
from flint.hlo.shapes import Shape, parse_shape

# How an unfused core's scale, causal mask and softmax run under framework megatron: fused
# (one kernel, Megatron's FusedScaleMaskSoftmax) or eager (one PyTorch kernel each,
# Megatron-LM 2019); the run field `score_path` (flint.run_schema)
SOFTMAX = ("fused", "eager")


@dataclass(frozen=True)
class ScorePath:
    seq: int                    # the S of the S x S scores (queries = keys: causal self-attention)
    scores: int                 # elements of one call's scores (micro-batch x local heads x S x S)
    softmax: str = "fused"
    dropout: float = 0.0
    name: ClassVar[str] = "score-path"

    def __post_init__(self):
        if self.seq < 1 or self.scores < self.seq * self.seq:
            raise FlintError(f"score-path: {self.scores} score elements cannot hold "
                             f"{self.seq} x {self.seq} scores")
        if self.softmax not in SOFTMAX:
            raise FlintError(f"score-path: softmax {self.softmax!r}: use "
                             f"{' | '.join(SOFTMAX)}")
        if not 0 <= self.dropout < 1:
            raise FlintError(f"score-path: dropout {self.dropout} is not a probability "
                             f"below 1")

    def run(self, graph: WorkloadGraph) -> WorkloadGraph:
        if graph.loops:
            raise FlintError("score-path needs a loop-free graph (run expand-loops first)")
        if self.softmax == "fused" and not self.dropout:
            return graph
        paths = self._paths(graph)
        if not paths:
            raise FlintError(f"score-path: no attention call's GEMM writes S x S scores of "
                             f"{self.scores} elements (S {self.seq}): not an unfused core of "
                             f"that shape")
        return _rewritten(graph, paths, self)

    def _paths(self, graph: WorkloadGraph) -> dict[str, dict]:
        """Per attention call: its score shape and its score-path nodes, in order."""
        paths: dict[str, dict] = {}
        for n in graph.nodes:
            if n.kind != NodeKind.COMPUTE or n.collective is not None:
                continue
            call = attention_call(n.meta.get("op_name", ""))
            if call is None:
                continue
            if n.op_class == OpClass.GEMM:
                score = next((o for o in n.outputs if self.is_scores(o)), None)
                if score is not None:
                    paths.setdefault(call, {"shape": score, "nodes": []})
                continue
            path = paths.get(call)
            if path is not None and any(self.is_scores(t) for t in n.outputs + n.operands):
                path["nodes"].append(n.id)
        return {c: p for c, p in paths.items() if p["nodes"]}

    def is_scores(self, shape: str) -> bool:
        """A tensor of one call's S x S scores: as many elements, its last two dims S x S
        once unit dims are dropped (XLA's fusions insert them: f32[8,3,1024,1,1024])."""
        parsed = _array(shape)
        dims = [d for d in parsed.dims if d != 1] if parsed else []
        return dims[-2:] == [self.seq, self.seq] and math.prod(dims) == self.scores

    def chain(self, path: dict, backward: bool,
              like: Node) -> tuple[list[Node], bool, list[Node]]:
        """The kernels this pass adds to one score path (in their order), and whether the
        compiled nodes stay: (new nodes before them, keep, new nodes after them)."""
        shape = path["shape"]
        parsed = parse_shape(shape)
        elems, scores = parsed.num_elements, parsed.nbytes
        mask_shape = f"{parsed.dtype}[{self.seq},{self.seq}]"
        mask = parse_shape(mask_shape).nbytes
        bool_mask = str(Shape("pred", parsed.dims))

        def node(op, op_class, reads, writes, operands, outputs, flops=0.0, exp=0.0):
            meta = {k: v for k, v in like.meta.items()
                    if k not in ("fusion_kind", "kernels", "update_element_bytes")}
            meta.update(kernel_source="eager", aten=f"aten::{op}", score_path=self.softmax)
            return replace(like, id=-1, name=f"{op}.score", op=op, op_class=op_class,
                           inputs=[], control=[], flops=float(flops),
                           transcendentals=float(exp), bytes_read=float(reads),
                           bytes_written=float(writes), operands=list(operands),
                           outputs=list(outputs), collective=None, meta=meta)

        ew, red = OpClass.ELEMENTWISE, OpClass.REDUCTION
        drop = self.dropout > 0
        if not backward:
            tail = [node("native_dropout", ew, scores, scores + elems, [shape],
                         [shape, bool_mask], flops=elems)] if drop else []
            if self.softmax == "fused":
                return [], True, tail
            passes = UNFUSED_SOFTMAX_PASSES[("eager", False)]
            return [node("div", ew, scores, scores, [shape], [shape], flops=elems),
                    node("mul", ew, scores + mask, scores, [shape, mask_shape], [shape],
                         flops=elems),
                    node("sub", ew, scores + mask, scores, [shape, mask_shape], [shape],
                         flops=elems),
                    node("_softmax", red, (passes - 1) * scores, scores, [shape], [shape],
                         flops=4 * elems, exp=elems)] + tail, False, []
        head = [node("native_dropout_backward", ew, scores + elems, scores,
                     [shape, bool_mask], [shape], flops=elems)] if drop else []
        if self.softmax == "fused":
            return head, True, []
        passes = UNFUSED_SOFTMAX_PASSES[("eager", True)]
        return head + [
            node("_softmax_backward_data", red, (passes - 1) * scores, scores,
                 [shape, shape], [shape], flops=3 * elems),
            node("mul", ew, scores + mask, scores, [shape, mask_shape], [shape], flops=elems),
            node("div", ew, scores, scores, [shape], [shape], flops=elems)], False, []


def attention_call(op_name: str) -> str | None:
    """The name stack of the attention call an op of the JAX twin belongs to (None outside
    attention): everything up to its `attention` scope, e.g. `jit(train_step)/
    transpose(jvp(layer_1))/transpose(jvp(attention))`."""
    parts = op_name.split("/")
    for i, part in enumerate(parts):
        if re.fullmatch(r"(?:[a-z_]+\()*attention\)*", part):
            return "/".join(parts[: i + 1])
    return None


def is_backward(call: str) -> bool:
    """Whether an attention call is a backward: under a transpose (JAX's name for the
    backward of what it wraps) and not a recomputed forward there (`.../recompute/
    jvp(attention)`, the forward jax.checkpoint re-runs for the backward)."""
    return "transpose(" in call and not call.rsplit("/", 1)[-1].startswith("jvp(")


def _placed(graph: WorkloadGraph, users, ids: list[int]) -> tuple[list[int], list[int]]:
    """(the path's nodes, the nodes run right after its chain). The chain runs where the
    path's last node ran, everything it reads being ready there. A node between the path's
    first and last that both reads the path and feeds it (a reduction's reciprocal the
    normalization reads) is part of it; one that only reads it runs after the chain."""
    first, last = ids[0], ids[-1]
    inside = set(ids)

    def reach(start, step) -> set[int]:
        seen, todo = set(), list(start)
        while todo:
            for j in step(todo.pop()):
                if first < j < last and j not in inside and j not in seen:
                    seen.add(j)
                    todo.append(j)
        return seen

    after = reach(ids, lambda i: users[i])
    before = reach(ids, lambda i: graph.nodes[i].inputs + graph.nodes[i].control)
    return sorted(inside | (after & before)), sorted(after - before)


def _array(shape: str) -> Shape | None:
    """The array a shape string names (None: a tuple, or not an HLO shape)."""
    try:
        parsed = parse_shape(shape)
    except FlintError:
        return None
    return None if parsed.is_tuple else parsed


def _rewritten(graph: WorkloadGraph, paths: dict, spec: ScorePath) -> WorkloadGraph:
    by_node = graph.nodes
    plan: dict[int, tuple] = {}        # a path's last node -> (path ids, chain, deferred ids)
    members: set[int] = set()          # every path node and every node run after a chain
    users = graph.users
    for call, path in paths.items():
        ids, deferred = _placed(graph, users, path["nodes"])
        path = dict(path, nodes=ids)
        before, keep, after = spec.chain(path, is_backward(call), by_node[ids[-1]])
        plan[ids[-1]] = (ids, before + ([by_node[i] for i in ids] if keep else []) + after,
                         deferred)
        members.update(ids, deferred)
    new_id: dict[int, list[int]] = {}
    nodes: list[Node] = []

    def mapped(ids) -> list[int]:
        return sorted({j for i in ids for j in new_id.get(i, [])})

    def emit(n: Node) -> None:
        node = replace(n, id=len(nodes), inputs=mapped(n.inputs), control=mapped(n.control),
                       meta=dict(n.meta))
        if n.collective is not None:
            node.collective = replace(n.collective)
        new_id[n.id] = [node.id]
        nodes.append(node)

    for n in graph.nodes:
        if n.id not in plan:
            if n.id not in members:
                emit(n)
            continue                    # a path's node, or one run after its chain
        ids, chain, deferred = plan[n.id]
        inside = set(ids)
        outside = sorted({p for i in ids for p in by_node[i].inputs if p not in inside})
        control = sorted({p for i in ids for p in by_node[i].control if p not in inside})
        previous = None
        for k, link in enumerate(chain):
            node = replace(link, id=len(nodes),
                           inputs=mapped(outside) if k == 0 else [previous],
                           control=mapped(control) if k == 0 else [],
                           meta=dict(link.meta))
            nodes.append(node)
            previous = node.id
        for i in ids:                   # readers of any of the path's nodes read its end
            new_id[i] = [previous]
        for i in deferred:
            emit(by_node[i])
    for node in nodes:
        c = node.collective
        if c is not None and c.window is not None:
            lo, hi = c.window
            c.window = ((new_id.get(lo) or [None])[0], (new_id.get(hi) or [None])[-1])
            if None in c.window:
                c.window = None
    added = len(nodes) - len(graph.nodes)
    out = WorkloadGraph(graph.cluster, nodes, list(graph.communicators), [],
                        dict(graph.meta, score_paths=len(plan), score_path_nodes_added=added))
    out.check()
    return out
