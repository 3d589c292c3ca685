"""Approximate what torch.compile (Inductor) fuses, so the roofline sees its memory traffic.

Eager aten graphs run one kernel per op: every intermediate of `x * rsqrt(mean(x*x)) * w`
goes to memory and back. Inductor fuses chains of pointwise ops, and reductions with the
pointwise ops around them, into one kernel whose traffic is its external inputs and final
outputs. This pass merges such chains: a pointwise or reduction node joins the group of
its producer when it is that producer's only user and both are pointwise/reduction nodes
of the same phase. GEMMs, attention, convolutions, copies and collectives are never fused
(Inductor calls cuBLAS/flash kernels for them and keeps communication separate).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from flint.graph import OpClass, WorkloadGraph

FUSIBLE = (OpClass.ELEMENTWISE, OpClass.REDUCTION)


@dataclass(frozen=True)
class FusePointwise:
    """Contract: returns a new graph whose total flops and transcendentals equal the
    input's; bytes drop by twice the bytes of every intermediate fused away; deps stay
    acyclic and point backwards; collectives and their windows are kept (windows remapped
    to the fused ids); meta["fused_from"] counts the ops in each fused node."""

    name: ClassVar[str] = "fuse-pointwise"

    def run(self, graph: WorkloadGraph) -> WorkloadGraph:
        if graph.loops:
            return graph
        users = graph.users
        group = list(range(len(graph.nodes)))      # node -> representative (its last node)
        for node in graph.nodes:
            if node.op_class not in FUSIBLE or node.collective is not None:
                continue
            for p in set(node.inputs):
                producer = graph.nodes[p]
                if (producer.op_class in FUSIBLE and producer.collective is None
                        and users[p] == [node.id] and not producer.control
                        and producer.meta.get("phase") == node.meta.get("phase")):
                    _merge(group, p, node.id)
        return _rebuild(graph, group)


def _find(group: list[int], i: int) -> int:
    while group[i] != i:
        group[i] = group[group[i]]
        i = group[i]
    return i


def _merge(group: list[int], producer: int, consumer: int) -> None:
    a, b = _find(group, producer), _find(group, consumer)
    if a != b:
        group[a] = b      # the consumer (later) node represents the fused kernel


def _rebuild(graph: WorkloadGraph, group: list[int]) -> WorkloadGraph:
    members: dict[int, list[int]] = {}
    for i in range(len(graph.nodes)):
        members.setdefault(_find(group, i), []).append(i)
    order = sorted(members, key=lambda r: max(members[r]))   # place at the last member
    new_id = {}
    for k, root in enumerate(order):
        for m in members[root]:
            new_id[m] = k
    nodes = []
    for k, root in enumerate(order):
        ms = members[root]
        head = graph.nodes[root]
        inside = set(ms)
        internal = sum(graph.nodes[p].bytes_written for m in ms for p in set(graph.nodes[m].inputs)
                       if p in inside)
        inputs = sorted({new_id[p] for m in ms for p in graph.nodes[m].inputs
                         if p not in inside})
        control = sorted({new_id[p] for m in ms for p in graph.nodes[m].control
                          if p not in inside} - set(inputs))
        meta = dict(head.meta)
        if len(ms) > 1:
            meta["fused_from"] = len(ms)
        node = replace(head, id=k, inputs=inputs, control=control, meta=meta,
                       flops=sum(graph.nodes[m].flops for m in ms),
                       transcendentals=sum(graph.nodes[m].transcendentals for m in ms),
                       bytes_read=sum(graph.nodes[m].bytes_read for m in ms) - internal,
                       bytes_written=sum(graph.nodes[m].bytes_written for m in ms) - internal,
                       operands=[s for m in ms for s in graph.nodes[m].operands][:8])
        if head.collective is not None and head.collective.window is not None:
            lo, hi = head.collective.window
            lo, hi = new_id[lo], new_id[hi]
            node.collective = replace(head.collective, window=(lo, hi) if lo <= hi else None)
        nodes.append(node)
    meta = dict(graph.meta, fused_nodes=len(graph.nodes) - len(nodes))
    out = replace(graph, nodes=nodes, meta=meta)
    out.check()
    return out
