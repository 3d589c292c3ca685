"""The backward's tensor-parallel reduction of an input gradient overlapped with the
weight-gradient GEMM of the same linear layer, as Megatron runs it.

A column-parallel linear's backward computes the input gradient (dgrad), reduces it over
the TP ranks (an all-reduce; a reduce-scatter under sequence parallelism) and computes
the weight gradient (wgrad) from the same output gradient. Megatron starts the reduction
as soon as dgrad is done and computes wgrad while it runs:
`LinearWithGradAccumulationAndAsyncCommunication.backward` (Megatron-LM, from its
`--async-tensor-model-parallel-allreduce` of late 2021, the default since; Megatron-Core)
issues `all_reduce(grad_input, async_op=True)` (or `_reduce_scatter_base`) and waits on
it after the wgrad GEMM; Transformer Engine's Linear and flash-attn's FusedDense (which
InternEvo runs) do the same. Korthikanti et al. 2022 (arXiv 2205.05198, section 6.2)
name it as what keeps a full-recompute layer's overhead near the forward's time. XLA
orders the same program as its scheduler likes; a compile-only target often puts both
GEMMs before the reduction, which then runs exposed.

The pass reorders each such backward: for an asynchronous reduction over the TP axis whose
input comes from backward GEMMs (through element-wise glue, or the one-input reduction of
a split-K GEMM, at most; a reduce-scatter may carry no phase of its own), the GEMMs issued
before it
that read the same output gradient and that it does not need (the wgrads), together with
what depends on them before the reduction, move to just after it. Nothing else moves.

Contract: input a loop-free graph; output a loop-free graph with the same nodes, flops,
bytes and edges, in another order (node ids renumbered; windows follow their nodes).
`axis`: the tensor-parallel mesh axis.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from flint.errors import FlintError
from flint.graph import WorkloadGraph

_GLUE = ("elementwise", "data_movement")     # and one-input reductions (split-K's sum)
_REDUCTIONS = ("all-reduce", "reduce-scatter")


@dataclass(frozen=True)
class TpGradOverlap:
    axis: str = "model"
    name: ClassVar[str] = "tp-grad-overlap"

    def run(self, graph: WorkloadGraph) -> WorkloadGraph:
        if graph.loops:
            raise FlintError("tp-grad-overlap needs a loop-free graph (run expand-loops first)")
        order = list(range(len(graph.nodes)))
        moved = 0
        for c, producers in self._dgrad_reductions(graph):
            at = order.index(c.id)
            later = _wgrads_before(graph, c, producers, order[:at])
            if later:
                rest = [i for i in order[:at] if i not in later]
                order = rest + [c.id] + [i for i in order[:at] if i in later] + order[at + 1:]
                moved += 1
        if not moved:
            return graph
        out = _renumbered(graph, order)
        out.meta["tp_grad_overlap"] = moved
        return out

    def _dgrad_reductions(self, g: WorkloadGraph):
        """(reduction, the backward GEMMs it reduces) for each qualifying collective."""
        for n in g.nodes:
            c = n.collective
            if c is None or not c.is_async or c.type not in _REDUCTIONS:
                continue
            comm = g.communicators[c.communicator]
            if tuple(comm.mesh_axes) != (self.axis,) or comm.size < 2:
                continue
            producers = _producers(g, n)
            if producers and n.meta.get("phase") in ("backward", None) and all(
                    g.nodes[p].meta.get("phase") == "backward" for p in producers):
                yield n, producers


def _producers(g: WorkloadGraph, node) -> set[int]:
    """The GEMMs whose output reaches `node` through element-wise glue at most."""
    found, stack, seen = set(), list(node.inputs), set()
    while stack:
        i = stack.pop()
        if i in seen:
            continue
        seen.add(i)
        n = g.nodes[i]
        if n.op_class == "gemm":
            found.add(i)
        elif n.collective is None and (n.op_class in _GLUE or (
                n.op_class == "reduction" and len(n.inputs) == 1)):
            stack.extend(n.inputs)
    return found


def _ancestors(g: WorkloadGraph, node, within: set[int]) -> set[int]:
    out, stack = set(), list(node.inputs) + list(node.control)
    while stack:
        i = stack.pop()
        if i in out or i not in within:
            continue
        out.add(i)
        stack.extend(g.nodes[i].inputs)
        stack.extend(g.nodes[i].control)
    return out


def _wgrads_before(g: WorkloadGraph, c, producers: set[int], before: list[int]) -> set[int]:
    """Nodes issued before the reduction `c` that move behind it: the wgrad GEMMs (GEMMs
    reading an input of one of c's producing GEMMs, the shared output gradient, that c
    does not need) and what depends on them in between."""
    # the output gradient: the producers' inputs not made in the forward (the weights'
    # casts are; a fusion XLA made of backward ops may carry no phase)
    grads = {i for p in producers for i in g.nodes[p].inputs
             if g.nodes[i].meta.get("phase") != "forward"}
    if not grads:
        return set()
    where = {i: k for k, i in enumerate(before)}
    span = before[max(where.get(i, -1) for i in grads) + 1:]
    needed = _ancestors(g, c, set(span))
    later: set[int] = set()
    for i in span:
        n = g.nodes[i]
        if i in needed:
            continue
        if (n.op_class == "gemm" and grads.intersection(n.inputs)) or \
                later.intersection(n.inputs) or later.intersection(n.control):
            later.add(i)
    return later


def _renumbered(g: WorkloadGraph, order: list[int]) -> WorkloadGraph:
    new = {old: k for k, old in enumerate(order)}
    nodes = []
    for old in order:
        n = g.nodes[old]
        c = n.collective
        if c is not None and c.window is not None:
            lo, hi = sorted((new[c.window[0]], new[c.window[1]]))
            c = replace(c, window=(lo, hi))
        nodes.append(replace(n, id=new[old], inputs=[new[i] for i in n.inputs],
                             control=[new[i] for i in n.control], collective=c))
    return replace(g, nodes=nodes, meta=dict(g.meta))
