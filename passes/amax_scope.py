"""FP8 scaling factors reduced over the ranks Transformer Engine reduces them over.

The extracted step quantizes a tensor with a per-tensor scale from its amax, the max of
|x| over the whole (global) array, so the SPMD partitioner all-reduces every amax over
every mesh axis the tensor is sharded on: the data-parallel and context-parallel ranks
too. Transformer Engine computes a scale from the rank's own shard. Its current-scaling
quantizers (Float8CurrentScaling, `_customize_quantizers_float8_current_scaling` in
transformer_engine/pytorch/module/linear.py, layernorm_linear.py, layernorm_mlp.py) set
`with_amax_reduction` with `amax_reduction_group = tp_group` only where a tensor is
gathered over the tensor-parallel ranks in FP8: a column-parallel input under sequence
parallelism (forward) and a row-parallel output gradient under sequence parallelism
(backward); every other amax is local. MXFP8's block scales are local to the block. So,
on a run whose FP8 kernels are Transformer Engine's, an amax all-reduce over axes beyond
`keep` is narrowed to the `keep` axes among its own (the tensor-parallel group), or
removed where it spans none of them (its readers read the local amax). The latency of a
scalar all-reduce over hundreds of ranks is what this takes out of the critical path:
the forward waits for each scale before its cast.

An amax reduction is an all-reduce with reduction `maximum` of at most `MAX_BYTES` of f32
(XLA combines a few scalar amaxes into one f32[k]). Weight amaxes reduced over the
tensor-parallel axis are kept with it (TE scales a weight shard on its own): they run once
per step in Megatron-Core (the layer template's cast_once) and cost a TP-group latency.

Contract: input a loop-free graph; output the same graph without those reductions or with
them over the narrower group (an existing communicator over exactly the kept axes; where
the graph has none, the reduction is left as it is); node ids are renumbered, overlap
windows follow their nodes. Other nodes are unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from flint.errors import FlintError
from flint.graph import Node, WorkloadGraph

MAX_BYTES = 64          # 16 f32 amaxes: more is a tensor's reduction, not a scale's


@dataclass(frozen=True)
class AmaxScope:
    keep: str = "model"          # comma-separated mesh axes an amax is reduced over
    name: ClassVar[str] = "amax-scope"

    def __post_init__(self):
        if not self.axes:
            raise FlintError("amax-scope: keep names no mesh axis")

    @property
    def axes(self) -> tuple[str, ...]:
        return tuple(a.strip() for a in self.keep.split(",") if a.strip())

    def run(self, graph: WorkloadGraph) -> WorkloadGraph:
        if graph.loops:
            raise FlintError("amax-scope needs a loop-free graph (run expand-loops first)")
        narrowed: dict[int, int] = {}       # node -> its new communicator
        removed: set[int] = set()
        for n in graph.nodes:
            if not is_amax_reduction(n):
                continue
            axes = graph.communicators[n.collective.communicator].mesh_axes
            if set(axes) <= set(self.axes):
                continue
            kept = tuple(a for a in axes if a in self.axes)
            if not kept:
                removed.add(n.id)
                continue
            comm = next((c.id for c in graph.communicators
                         if c.kind == "groups" and c.mesh_axes == kept), None)
            if comm is not None:
                narrowed[n.id] = comm
        if not removed and not narrowed:
            return graph
        return _rewritten(graph, narrowed, removed)


def is_amax_reduction(node: Node) -> bool:
    c = node.collective
    return (c is not None and c.type == "all-reduce" and c.reduction == "maximum"
            and c.dtype == "f32" and 0 < c.bytes_in <= MAX_BYTES)


def _rewritten(graph: WorkloadGraph, narrowed: dict, removed: set) -> WorkloadGraph:
    new_id: dict[int, list[int]] = {}       # old id -> the new ids that stand for it
    nodes: list[Node] = []

    def mapped(ids) -> list[int]:
        return sorted({j for i in ids for j in new_id[i]})

    for n in graph.nodes:
        if n.id in removed:
            # readers of the reduced amax read the local one
            new_id[n.id] = mapped(n.inputs)
            continue
        node = replace(n, id=len(nodes), inputs=mapped(n.inputs), control=mapped(n.control),
                       meta=dict(n.meta))
        if n.id in narrowed:
            node.collective = replace(n.collective, communicator=narrowed[n.id])
        elif n.collective is not None:
            node.collective = replace(n.collective)
        new_id[n.id] = [node.id]
        nodes.append(node)
    for node in nodes:
        c = node.collective
        if c is not None and c.window is not None:
            lo, hi = c.window
            c.window = ((new_id[lo] or [None])[0], (new_id[hi] or [None])[-1])
            if None in c.window:
                c.window = None
    out = WorkloadGraph(graph.cluster, nodes, list(graph.communicators), [],
                        dict(graph.meta, amax_reductions_removed=len(removed),
                             amax_reductions_narrowed=len(narrowed)))
    out.check()
    return out
