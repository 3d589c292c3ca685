"""The gradient reductions of a layer-templated step, in buckets (passes.layer_template).

The writer (layer_template's _Writer) owns the node list; each block adds its unit of
reductions here and a closed bucket is written back to it as merged collectives."""
from __future__ import annotations

from flint.graph import Collective, Node, NodeKind


class GradientBuckets:
    """The step's gradient reductions in buckets. Each block (a layer, the head, the
    embedding) adds its unit: the template's R collectives of the layer it is, which
    reduce what its backward made. Units join the open bucket while its collectives stay
    within `limit` bytes; a closed bucket is issued (its collectives merged by kind and
    group, then each unit's compute on their results: casts, scaling) when the next
    block's backward has started, whose parameter gathers and own collectives go first,
    as XLA's scheduler and FSDP's prefetch order them."""

    def __init__(self, writer, limit: int):
        self.w, self.limit = writer, limit
        self.open: list = []
        self.closed: list = []
        self.done: dict = {}
        self.after: list = []       # nodes every bucket waits for (no overlap)
        self.holding = not writer.overlap

    def add(self, key, owner, producer: int, label: str) -> None:
        unit = (key, owner, producer, label)
        size = sum(c.bytes_in * w for c, w in self.collectives([unit]))
        held = sum(c.bytes_in * w for c, w in self.collectives(self.open))
        if self.open and (not self.limit or held + size > self.limit):
            self.close()
        self.open.append(unit)

    def close(self) -> None:
        if self.open:
            self.closed.append(self.open)
            self.open = []

    def collectives(self, units) -> list:
        return [(n.collective, w) for _, owner, _, _ in units
                for n, w in self.w.owned_reductions.get(owner, ())]

    def issue(self) -> None:
        if self.holding and not self.after:
            return              # reduce nothing until the backward is done
        for bucket in self.closed:
            self._emit(bucket)
        self.closed = []

    def _emit(self, units) -> None:
        w = self.w
        inputs = sorted({producer for _, _, producer, _ in units})
        # Held to the end of the backward by a control edge, not a data edge: under
        # passes.pipeline the end that matters is the stage's own last backward (DeepSpeed's
        # PipelineEngine reduces each stage's gradients after that stage's flush), which the
        # pipeline pass substitutes for `after` (meta after_backward); a data edge to the
        # embedding's backward would cross stages and become a transfer.
        merged: dict = {}
        for c, weight in self.collectives(units):
            key = (c.type, c.communicator, c.dtype, c.reduction, c.is_async)
            a, b = merged.get(key, (0.0, 0.0))
            merged[key] = (a + c.bytes_in * weight, b + c.bytes_out * weight)
        label = units[-1][3]
        ids = []
        for (kind, comm, dtype, reduction, is_async), (a, b) in merged.items():
            collective = Collective(kind, comm, int(a), int(b), dtype, reduction, is_async)
            w.nodes.append(Node(len(w.nodes), f"{kind}.grads.{label}", NodeKind.COLLECTIVE,
                                kind, "collective", list(inputs), sorted(self.after),
                                collective=collective,
                                meta={"phase": "backward", "layer": label,
                                      "bucket": [u[3] for u in units]}))
            if self.after:
                w.nodes[-1].meta["after_backward"] = True
            ids.append(len(w.nodes) - 1)
        for key, owner, producer, unit_label in units:
            got = ids or [producer]
            block = f"R:{'rest' if owner is None else owner}"
            if block in w.r_blocks:
                phase = "optimizer" if w.defer_reduced_work else "backward"
                got = [w.add(f"red.{unit_label}", phase, unit_label, block, 1.0, got)]
            self.done.setdefault(key, []).extend(got)
