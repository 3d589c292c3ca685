"""Unroll compiled while loops into one node per executed instance.

Lowering keeps each loop body once with `repeat` = its trip count, which is what totals
need. A schedule or a Chakra trace needs every instance in order, with iteration i+1's
consumers of the loop state depending on iteration i's producers of it.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from typing import ClassVar

from flint.graph import Loop, Node, WorkloadGraph


@dataclass(frozen=True)
class ExpandLoops:
    """Contract: returns a new graph with no loops; node count = sum of repeat-weighted body
    sizes; every node has repeat 1 (for fully known trip counts); totals are unchanged;
    dependencies stay acyclic and point backwards. `max_nodes` guards against blow-up."""

    max_nodes: int = 2_000_000
    name: ClassVar[str] = "expand-loops"

    def run(self, graph: WorkloadGraph) -> WorkloadGraph:
        if not graph.loops:
            return graph
        from flint.errors import FlintError

        total = sum(n.repeat for n in graph.nodes)
        if total > self.max_nodes:
            raise FlintError(f"expanding loops would make {total} nodes (limit {self.max_nodes})")
        return _Expander(graph).run()


class _Expander:
    def __init__(self, graph: WorkloadGraph):
        self.graph = graph
        self.children: dict[int | None, list[Loop]] = {}
        for lp in graph.loops:
            self.children.setdefault(lp.parent, []).append(lp)
        self.out: list[Node] = []

    def run(self) -> WorkloadGraph:
        mapping: dict[int, int] = {}
        self.emit(0, len(self.graph.nodes) - 1, None, mapping, {}, 1, "")
        meta = dict(self.graph.meta, expanded_loops=len(self.graph.loops))
        return replace(self.graph, nodes=self.out, loops=[], meta=meta)

    def emit(self, first: int, last: int, loop: Loop | None, mapping: dict[int, int],
             carried_from: dict[int, dict[int, list[int]]], divide: int, tag: str) -> None:
        """Copy old nodes first..last; `mapping` turns old ids into new ids and is updated;
        `carried_from[consumer][old_init_id]` lists new ids that replace a loop-state input."""
        nested = {lp.first: lp for lp in self.children.get(loop.id if loop else None, [])}
        i = first
        while i <= last:
            inner = nested.get(i)
            if inner is not None and inner.last >= inner.first:
                self.expand(inner, mapping, carried_from, divide, tag)
                i = inner.last + 1
                continue
            old = self.graph.nodes[i]
            node = copy.copy(old)
            node.meta = dict(old.meta)
            node.id = len(self.out)
            swaps = carried_from.get(i, {})
            inputs: set[int] = set()
            for d in old.inputs:
                inputs.update(swaps.get(d, [mapping[d]] if d in mapping else []))
            node.inputs = sorted(inputs)
            node.control = sorted({mapping[d] for d in old.control if d in mapping})
            node.repeat = max(1, old.repeat // divide)
            if tag:
                node.meta["iteration"] = tag
            if old.collective is not None:
                node.collective = copy.copy(old.collective)
            mapping[i] = node.id
            self.out.append(node)
            i += 1
        self._fix_windows(first, last, mapping)

    def expand(self, loop: Loop, mapping: dict[int, int],
               outer: dict[int, dict[int, list[int]]], divide: int, tag: str) -> None:
        previous: dict[int, int] | None = None
        for it in range(loop.trip_count):
            iteration = dict(mapping)  # outside ids stay visible inside the body
            carried_from = {c: dict(swaps) for c, swaps in outer.items()}
            if previous is not None:
                for init, producers, consumers in loop.carried:
                    new_producers = [previous[p] for p in producers if p in previous]
                    for c in consumers:
                        swap = carried_from.setdefault(c, {})
                        for d in init:
                            swap[d] = new_producers
            label = f"{tag}/{loop.name}:{it}" if tag else f"{loop.name}:{it}"
            self.emit(loop.first, loop.last, loop, iteration, carried_from,
                      divide * loop.trip_count, label)
            previous = {k: v for k, v in iteration.items() if loop.first <= k <= loop.last}
        if previous:
            mapping.update(previous)  # after the loop, its values are the last iteration's

    def _fix_windows(self, first: int, last: int, mapping: dict[int, int]) -> None:
        for old_id in range(first, last + 1):
            new_id = mapping.get(old_id)
            if new_id is None:
                continue
            node = self.out[new_id]
            c = node.collective
            if c is not None and c.window is not None:
                lo, hi = c.window
                if lo in mapping and hi in mapping and mapping[lo] <= mapping[hi]:
                    c.window = (mapping[lo], mapping[hi])
