"""Where each node of a training step goes in a pipeline, and in what order stages run.

Three questions, answered on the per-device graph of one microbatch:
- `task_of`: is a node per-microbatch forward work (F), backward work (B), once-per-step
  gradient reduction (R: the data-parallel all-reduce / reduce-scatter of the accumulated
  gradients and what follows it up to the optimizer, run with the last microbatch's
  backward), or once-per-step work before the pipeline (pre: parameter casts) or after it
  (post: the optimizer)?
- `assign_chunks`: which model chunk (pipeline stage, or virtual stage when interleaved)
  runs it. `layers` splits contiguous blocks of layers (as Megatron-LM and torchtitan
  do); `time` cuts the forward and the backward op sequences into pieces of equal
  predicted time (an op-granular balanced split); an explicit placement may be given.
- `device_order` (passes.pipeline_order, re-exported here): each device's sequence of
  (F|B, microbatch, chunk) tasks for GPipe, 1F1B and interleaved 1F1B.
"""
from __future__ import annotations

import re

from flint.passes.pipeline_balance import interleaved_cuts
from flint.passes.pipeline_order import SCHEDULES, device_order  # noqa: F401 (re-exported)

from flint.errors import FlintError
from flint.graph import WorkloadGraph
from flint.hlo.shapes import shapes_bytes
from flint.passes.gradient_tasks import DATA_PARALLEL_AXES  # noqa: F401 (re-exported)
from flint.passes.gradient_tasks import mark_gradient_reduction

SPLITS = ("layers", "time")
_LAYER = re.compile(r"(?:^|[^a-z])(?:layers?|blocks?|h)[._\[\]'\"/]*(\d+)", re.IGNORECASE)


def layer_index(text) -> int | None:
    """`layer_3`, `layers.3`, `model.layers.3.mlp`, `params['layers']['layer_3']` -> 3."""
    if not text:
        return None
    m = _LAYER.search(str(text))
    return int(m.group(1)) if m else None


def arguments_by_layer(graph: WorkloadGraph) -> tuple[dict[int, float], float]:
    """Argument bytes (parameters, optimizer state) by the index of the layer the graph
    runs that they are named after, and the bytes of every other argument."""
    layers = {layer_index(n.meta.get("layer")) for n in graph.nodes} - {None}
    owned: dict[int, float] = {}
    rest = 0.0
    for name, nbytes in graph.meta.get("arguments", ()):
        li = layer_index(name)
        if li in layers:
            owned[li] = owned.get(li, 0.0) + nbytes
        else:
            rest += nbytes
    return owned, rest


def task_of(graph: WorkloadGraph) -> list[str]:
    """'pre' | 'F' | 'B' | 'R' | 'post' per node, from the phase the front end recorded and
    the node's place in the schedule (recomputation inside the backward counts as B)."""
    phases = [n.meta.get("phase") for n in graph.nodes]
    first_f = next((i for i, p in enumerate(phases) if p == "forward"), None)
    backward = [i for i, p in enumerate(phases) if p == "backward"]
    if first_f is None or not backward:
        raise FlintError("pipelining needs forward and backward phases on the graph's "
                         "nodes (a training step lowered by Flint's JAX or torch front end)")
    first_b, last_b = backward[0], backward[-1]
    tasks = []
    for i, p in enumerate(phases):
        if p == "optimizer":
            tasks.append("post")
        elif i < first_b:
            tasks.append("F" if p == "forward" or i > first_f else "pre")
        elif p in ("forward", "backward") or i <= last_b:
            tasks.append("B")
        else:
            tasks.append("post")
    # Optimizer-phase values that per-microbatch work reads (XLA hoists the step counter
    # into the backward) run once before the pipeline, or per microbatch when they are
    # computed from per-microbatch values.
    users = graph.users
    changed = True
    while changed:
        changed = False
        for i in range(len(tasks) - 1, -1, -1):
            t = tasks[i]
            if t == "post" and any(tasks[u] != "post" for u in users[i]):
                t = "pre"
            if t == "pre" and any(tasks[d] in "FB" for d in graph.nodes[i].inputs):
                t = "B"
            if t != tasks[i]:
                tasks[i], changed = t, True
    mark_gradient_reduction(graph, tasks)
    _hoist_parameter_work(graph, tasks)
    for n in graph.nodes:     # the first micro-batch's own work (a sharded optimizer's
        if n.meta.get("first_microbatch"):      # parameter gathers), wherever it sits
            tasks[n.id] = "F"
    return tasks


_INTEGER = re.compile(r"^[su](8|16|32|64)\[\d")     # an integer array: token ids, labels


def _hoist_parameter_work(graph: WorkloadGraph, tasks: list[str]) -> None:
    """Casts, transposes and reductions that read no microbatch data and no collective
    result (a weight's cast to the GEMM dtype and its amax, rotary tables) are the same in
    every microbatch: they run once per step, before the pipeline ('pre'), as Transformer
    Engine caches a step's FP8 weights (Megatron's is_first_microbatch) and XLA hoists
    loop-invariant code. Microbatch data enters as integer arrays (token ids, labels)."""
    batch = [False] * len(tasks)
    for n in graph.nodes:
        i = n.id
        small = (n.collective is None and n.operands
                 and n.op_class in ("elementwise", "data_movement", "reduction"))
        batch[i] = (not small or any(batch[p] for p in n.inputs + n.control)
                    or not n.inputs and any(_INTEGER.match(o) for o in n.operands))
    for n in graph.nodes:
        if tasks[n.id] in ("F", "B") and not batch[n.id]:
            tasks[n.id] = "pre"


def assign_chunks(graph: WorkloadGraph, tasks: list[str], chunks: int, split: str,
                  durations: list[float] | None = None, stages: int = 0) -> list[int]:
    """Chunk index per node. F data flows to equal or later chunks, B data to equal or
    earlier ones (so no schedule deadlocks); pre/post nodes follow their consumers and
    producers. `stages` (default: `chunks`): the devices the chunks take turns on; with
    fewer devices than chunks (interleaved), whole blocks are laid out for the interleaved
    schedule (passes.pipeline_balance)."""
    if chunks == 1:   # gradient accumulation without stages: nothing to split
        return [0] * len(graph.nodes)
    stages = stages or chunks
    if split == "layers":
        chunk = _chunks_by_layer(graph, tasks, chunks, stages)
    elif split == "time":
        if durations is None:
            raise FlintError("split=time needs node durations (a hardware model)")
        chunk = _chunks_by_time(graph, tasks, chunks, durations, stages)
    else:
        raise FlintError(f"unknown pipeline split {split!r}; use {' | '.join(SPLITS)}")
    _follow_saved_activations(graph, tasks, chunk, chunks)
    _sources_with_consumers(graph, tasks, chunk)
    _make_monotone(graph, tasks, chunk)
    _place_once_per_step(graph, tasks, chunk)
    return [c if c is not None else 0 for c in chunk]


def _chunks_by_layer(graph, tasks, chunks, stages) -> list[int | None]:
    index = [layer_index(n.meta.get("layer")) for n in graph.nodes]
    known = [i for i, t in zip(index, tasks) if i is not None and t in "FB"]
    if not known:
        raise FlintError("no per-layer metadata on the graph's nodes (layers inside a "
                         "scan loop?): extract with --unroll, or split by time")
    layers = max(known) + 1
    if layers < chunks:
        raise FlintError(f"the model has {layers} layers: too few for {chunks} pipeline "
                         f"chunks")
    of_layer = [li * chunks // layers for li in range(layers)]
    if chunks > stages and layers % chunks:     # interleaved, layers that do not divide
        of_layer = _chunk_of_block(
            interleaved_cuts([1.0] * layers, chunks, stages), layers)
    chunk: list[int | None] = [None] * len(graph.nodes)
    for i, (li, t) in enumerate(zip(index, tasks)):
        if li is not None and t in "FB":
            chunk[i] = of_layer[li]
    # Layer-less F nodes (embedding, head, loss, glue between layers) join their latest
    # producer's chunk; with no producers (the embedding), the first chunk.
    for n in graph.nodes:
        if tasks[n.id] == "F" and chunk[n.id] is None:
            chunk[n.id] = max((chunk[i] for i in n.inputs if tasks[i] == "F"
                               and chunk[i] is not None), default=0)
    return chunk


def _follow_saved_activations(graph, tasks, chunk, chunks) -> None:
    """Unassigned B nodes run where the forward activations they read were made (no
    transfer of saved activations), but never before the gradient they consume arrives
    (B data flows to equal or earlier chunks); with neither, on the last chunk (the loss
    gradient). Only activations of labelled blocks count: unlabelled forward values
    (targets, casts), values computed from no other forward value (weights cast for
    compute, tied embeddings) or read by three or more chunks (masks, position tables) say
    nothing about where a backward node belongs."""
    spread: dict[int, set] = {}
    for n in graph.nodes:
        if tasks[n.id] == "F":
            for i in n.inputs:
                if tasks[i] == "F":
                    spread.setdefault(i, {chunk[i]}).add(chunk[n.id])
    for n in graph.nodes:
        if tasks[n.id] == "F" and not any(tasks[i] == "F" for i in n.inputs):
            spread[n.id] = set(range(3))
    for n in graph.nodes:
        if tasks[n.id] != "B" or chunk[n.id] is not None:
            continue
        grads = [chunk[i] for i in n.inputs if tasks[i] == "B"]
        saved = [chunk[i] for i in n.inputs if tasks[i] == "F" and len(spread.get(i, ())) <= 2
                 and graph.nodes[i].meta.get("layer")]
        if saved:
            chunk[n.id] = min([max(saved)] + grads)
        else:
            chunk[n.id] = min(grads, default=chunks - 1)


def _chunk_of_block(cuts: list[int], blocks: int) -> list[int]:
    out, c = [], 0
    for k in range(blocks):
        while c < len(cuts) and k >= cuts[c]:
            c += 1
        out.append(c)
    return out


def _chunks_by_time(graph, tasks, chunks, durations, stages,
                    tolerance=0.15) -> list[int | None]:
    """Cut the F sequence (schedule order) into contiguous pieces of equal predicted time.
    With layer metadata the pieces are runs of whole labelled blocks (layers, the
    embedding, the head), each weighing its forward plus backward time (Megatron-LM's
    --account-for-embedding/loss-in-pipeline-split, by predicted time instead of a layer
    count); B nodes go with their block, unlabelled ones follow the saved activations.
    Without labels, F time is cut op by op, each cut moved within `tolerance` of a piece's
    share to where the fewest bytes cross."""
    ids = [i for i, t in enumerate(tasks) if t == "F"]
    labels = [graph.nodes[i].meta.get("layer") or None for i in ids]
    if any(labels):
        weight: dict[str, float] = {}
        for n in graph.nodes:
            label = n.meta.get("layer")
            if label and tasks[n.id] in "FB":
                weight[label] = weight.get(label, 0.0) + durations[n.id]
        time, seen, boundaries, current = [0.0], set(), [], None
        for pos, label in enumerate(labels):
            if label and label != current and label not in seen:
                if current is not None:
                    boundaries.append(pos)
                seen.add(label)
                current = label
                time.append(time[-1] + weight[label])
            else:
                time.append(time[-1])
        cost = [0.0] * (len(ids) + 1)
    else:
        time = [0.0]
        for i in ids:
            time.append(time[-1] + durations[i])
        boundaries = list(range(1, len(ids)))
        cost = _crossing_bytes(graph, ids)
    layers = len({layer_index(x) for x in labels if x} - {None})
    # interleaved over layers that do not divide into the chunks: a layout for the schedule
    # (when they divide, Megatron-Core's equal chunks, cut here by time as below)
    if any(labels) and chunks > stages and layers % chunks:
        starts = [0] + boundaries
        weights = [time[b] - time[a] for a, b in zip(starts, boundaries + [len(ids)])]
        if len(weights) < chunks:
            raise FlintError(f"the model has {len(weights)} blocks: too few for {chunks} "
                             f"pipeline chunks")
        cuts = [starts[k] for k in interleaved_cuts(weights, chunks, stages)]
    else:
        cuts = _equal_time_cuts(time, boundaries, cost, chunks, len(ids), tolerance)
    chunk: list[int | None] = [None] * len(tasks)
    c = 0
    for pos, i in enumerate(ids):
        while c < len(cuts) and pos >= cuts[c]:
            c += 1
        chunk[i] = c
    by_label = {}
    for label, i in zip(labels, ids):
        if label:
            by_label.setdefault(label, chunk[i])
    for n in graph.nodes:
        if tasks[n.id] == "B" and n.meta.get("layer") in by_label:
            chunk[n.id] = by_label[n.meta["layer"]]
    return chunk


def _equal_time_cuts(time, boundaries, cost, chunks, end, tolerance) -> list[int]:
    share = time[-1] / chunks
    cuts, lo = [], 0
    for k in range(1, chunks):
        target = k * share
        options = [j for j in boundaries if j > lo] or [end]
        near = [j for j in options if abs(time[j] - target) <= tolerance * share]
        best = min(near or options, key=lambda j: (cost[j], abs(time[j] - target), j))
        cuts.append(best)
        lo = best
    return cuts


def _crossing_bytes(graph, ids) -> list[float]:
    """crossing[j]: bytes of F values made before position j and read at or after it."""
    pos = {i: k for k, i in enumerate(ids)}
    last_use = {}
    for k, i in enumerate(ids):
        for d in graph.nodes[i].inputs:
            if d in pos:
                last_use[d] = k
    ends = [0.0] * (len(ids) + 1)
    size = [shapes_bytes(graph.nodes[i].outputs) for i in ids]
    live, out = 0.0, [0.0] * (len(ids) + 1)
    for k, i in enumerate(ids):
        live -= ends[k]
        out[k] = live
        if i in last_use:
            live += size[k]
            ends[last_use[i]] += size[k]
    out[len(ids)] = live - ends[len(ids)]
    return out


def _sources_with_consumers(graph, tasks, chunk) -> None:
    """F/B nodes that read no other node (a weight cast for the head, zeros for the
    embedding's gradient) run where they are read, not on the first or last chunk by
    default: no stage sends another a value it could make itself. F data may flow to
    later chunks, B data to earlier ones, so F sources take their earliest consumer's
    chunk and B sources their latest."""
    users = graph.users
    for n in graph.nodes:
        t = tasks[n.id]
        if t not in "FB" or n.inputs:
            continue
        dst = [chunk[u] for u in users[n.id] if tasks[u] in "FB" and chunk[u] is not None]
        if dst:
            chunk[n.id] = min(dst) if t == "F" else max(dst)


def _make_monotone(graph, tasks, chunk) -> None:
    for n in graph.nodes:
        t = tasks[n.id]
        if t not in "FB":
            continue
        src = [chunk[i] for i in n.inputs if tasks[i] == t]
        if src:
            chunk[n.id] = max(chunk[n.id], *src) if t == "F" else min(chunk[n.id], *src)


def _place_once_per_step(graph, tasks, chunk) -> None:
    for n in graph.nodes:                # R: with its gradients' producers; B data flows
        if tasks[n.id] == "R":           # to equal or earlier chunks (no cycle)
            src = [chunk[i] for i in n.inputs if tasks[i] in "BR" and chunk[i] is not None]
            chunk[n.id] = min(src or [chunk[i] for i in n.inputs if chunk[i] is not None],
                              default=0)
    users = graph.users
    for n in reversed(graph.nodes):      # pre: with the earliest consumer
        if tasks[n.id] == "pre":
            dst = [chunk[u] for u in users[n.id] if chunk[u] is not None]
            chunk[n.id] = min(dst, default=0)
    for n in graph.nodes:                # post: with the latest producer
        if tasks[n.id] == "post":
            src = [chunk[i] for i in n.inputs if chunk[i] is not None]
            chunk[n.id] = max(src, default=0)
