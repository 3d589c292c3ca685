"""The blocks of a layer template (passes.layer_template): which block each node of the
one-microbatch step runs in (a layer's forward or backward, the embedding's, the head's,
the once-per-step work), the copy of the template whose nodes name it, which blocks' backward
made the gradients a reduction works on, and the memory each block keeps and needs."""
from __future__ import annotations

from flint.graph import WorkloadGraph
from flint.hardware_models.composite import LAYER, interior
from flint.hlo.shapes import shapes_bytes
from flint.passes.pipeline_stages import layer_index

FIRST, LAST = "embed", "head"


def node_blocks(graph: WorkloadGraph, tasks: list[str]) -> list:
    """(F|B, layer index | 'embed' | 'head') per F/B node: labelled nodes by their label,
    unlabelled ones with the block that ran just before them (the backward starts in the
    head, the forward in the embedding)."""
    out: list = [None] * len(graph.nodes)
    current = {"F": FIRST, "B": LAST}
    for n in graph.nodes:
        t = tasks[n.id]
        if t not in "FB":
            continue
        label = n.meta.get("layer")
        li = layer_index(label)
        if li is not None:
            current[t] = li
        elif label in (FIRST, LAST):
            current[t] = label
        out[n.id] = (t, current[t])
    return out


def block_name(task: str, key) -> str:
    return f"{key[0]}:{key[1]}" if key is not None else task


def tagged_template(flat: WorkloadGraph, tasks, blocks, indices, gathers=frozenset()) -> WorkloadGraph:
    """A copy of the template whose nodes name their block (meta "block"): F/B blocks,
    "pre", "post", "R:<layer>" / "R:rest" for the gradient reduction of a layer's
    gradients or of the rest's, and "G" for parameter gathers held for the step."""
    from dataclasses import replace

    owners = gradient_owners(flat, tasks, blocks)
    names = []
    for n, t, b in zip(flat.nodes, tasks, blocks):
        if n.id in gathers:
            names.append("G")
        elif t == "R":
            names.append(f"R:{next(iter(owners[n.id]))}" if len(owners[n.id]) == 1
                         else "R:rest")
        else:
            names.append(block_name(t, b))
    nodes = [replace(n, meta=dict(n.meta, block=name)) for n, name in zip(flat.nodes, names)]
    meta = {k: v for k, v in flat.meta.items() if k in ("model", "xla_memory", "passes")}
    meta["template_layer_indices"] = list(indices)
    return WorkloadGraph(flat.cluster, nodes, list(flat.communicators), [], meta)


def gradient_owners(flat: WorkloadGraph, tasks, blocks) -> list[set]:
    """Per node, the blocks (a layer index, 'head' or 'embed') whose backward made the
    gradients an R node works on."""
    owners: list[set] = [set() for _ in flat.nodes]
    for n in flat.nodes:
        label = n.meta.get("layer")
        li = layer_index(label)
        key = blocks[n.id]
        if key is not None and key[0] == "B" and (li is not None or label in (FIRST, LAST)):
            owners[n.id] = {li if li is not None else label}
        else:   # unlabelled work (XLA's fusions that gather gradients) passes owners on
            for i in n.inputs:
                owners[n.id] |= owners[i]
    return owners


def reductions_by_layer(flat: WorkloadGraph, tasks, blocks) -> dict:
    """The once-per-step gradient reductions (R collectives) by the block whose backward
    made the gradient they reduce (a layer index, 'head', 'embed', or None when none
    did), each with its weight: a reduction XLA combined over several blocks' gradients
    is shared evenly among them."""
    owners = gradient_owners(flat, tasks, blocks)
    out: dict = {}
    for n in flat.nodes:
        if tasks[n.id] == "R" and n.collective is not None:
            mine = sorted(owners[n.id], key=str)
            for owner in mine or [None]:
                out.setdefault(owner, []).append((n, 1.0 / max(len(mine), 1)))
    return out


def block_memory(flat: WorkloadGraph, tasks, blocks, indices, batch=None) -> dict:
    """Per block: the bytes its forward keeps for the backward (outputs of the block that a
    backward node reads; for the representative layer, the mean of the template's
    layers) and the workspace it needs while it runs (its peak of live buffers over what
    was live when it started and what it leaves behind), from buffer liveness on the
    one-microbatch template."""
    from flint.hardware_models.memory import live_bytes_by_node

    users = flat.users
    sizes = [shapes_bytes(n.outputs) for n in flat.nodes]
    saved: dict = {}
    for n, key in zip(flat.nodes, blocks):
        if key is not None and key[0] == "F" and any(tasks[u] in "BR" for u in users[n.id]) \
                and (batch is None or batch[n.id]):
            saved[key] = saved.get(key, 0.0) + sizes[n.id]
    live = live_bytes_by_node(flat)
    spans: dict = {}
    for i, key in enumerate(blocks):
        if key is not None:
            lo, hi = spans.get(key, (i, i))
            spans[key] = (min(lo, i), max(hi, i))
    transient: dict = {}
    for key, (lo, hi) in spans.items():
        before = live[lo - 1] if lo else 0.0
        peak = max(live[lo:hi + 1])
        left = live[hi]
        transient[key] = max(peak - max(before, left), 0.0)
    out = {}
    for phase in "FB":
        for label in (FIRST, LAST):
            key = (phase, label)
            out[f"{phase}:{label}"] = (saved.get(key, 0.0), transient.get(key, 0.0))
        keys = [(phase, i) for i in interior(indices)]
        out[f"{phase}:{LAYER}"] = (sum(saved.get(k, 0.0) for k in keys) / len(keys),
                                   max(transient.get(k, 0.0) for k in keys))
        for i in (indices[0], indices[-1]):
            out[f"{phase}:{i}"] = (saved.get((phase, i), 0.0), transient.get((phase, i), 0.0))
    return out
