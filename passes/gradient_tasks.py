"""Which of a step's backward nodes are its once-per-step gradient reduction ('R' tasks of
passes.pipeline_stages.task_of): the data-parallel collectives that sum a gradient and the
casts and scaling after them, which frameworks run once per step however many
micro-batches the step has."""
from __future__ import annotations

from flint.graph import WorkloadGraph
from flint.hlo.shapes import parse_shape

# Mesh axes over which gradients are reduced: flint.models.train's batch, FSDP, context
# and expert axes each hold a different slice of the tokens (dense weights of a MoE reduce
# over the expert axis too, as over Megatron's whole DP group).
DATA_PARALLEL_AXES = ("data", "dp", "batch", "replica", "fsdp", "zero", "context", "cp",
                      "expert", "ep")


def mark_gradient_reduction(graph: WorkloadGraph, tasks: list[str]) -> None:
    """Turn the gradient reduction's nodes of `tasks` ('pre' | 'F' | 'B' | 'post') into
    'R', in place."""
    _combined_reductions(graph, tasks)
    _mark_reduction(graph, tasks)


def _combined_reductions(graph: WorkloadGraph, tasks: list[str]) -> None:
    """XLA's GPU pipeline may concatenate many small gradients into one flat buffer and
    reduce it with a single all-reduce (AllReduceContiguous, after the all-reduce
    combiner: a LoRA step's adapter gradients). The concatenation and the collective carry
    no op metadata, so they sit after the last backward node with no phase and would count
    as optimizer work; when everything they read comes from the backward they are the
    backward's gradient reduction (marked R below). Only that pattern (a flat buffer as
    long as its operands together) is taken: a phase-less reduction of one gradient (a
    TPU program's) stays where the program's schedule put it."""
    for n in graph.nodes:
        if tasks[n.id] != "post" or n.meta.get("phase") is not None \
                or not _reduces_over_data(graph, n):
            continue
        chain, stack, from_backward = set(), [n.id], True
        while stack and from_backward:
            i = stack.pop()
            if i in chain:
                continue
            if graph.nodes[i].meta.get("phase") is None and tasks[i] == "post":
                chain.add(i)
                stack.extend(graph.nodes[i].inputs)
            else:
                from_backward = tasks[i] == "B"
        if from_backward and any(_concatenation(graph.nodes[i]) for i in chain):
            for i in chain:
                tasks[i] = "B"


def _concatenation(node) -> bool:
    """A kernel writing one flat buffer exactly as long as its several operands together."""
    if len(node.operands) < 2 or len(node.outputs) != 1:
        return False
    out = parse_shape(node.outputs[0])
    return len(out.dims) == 1 and out.num_elements == sum(
        parse_shape(t).num_elements for t in node.operands)


def _mark_reduction(graph: WorkloadGraph, tasks: list[str]) -> None:
    """Backward nodes that only feed the optimizer, starting from a collective (the
    data-parallel reduction of a gradient, its casts and scaling): frameworks accumulate
    gradients over microbatches and reduce them once per step (Megatron-LM's
    --overlap-grad-reduce, torch DDP's no_sync, XLA's gradient accumulation), overlapped
    with the last microbatch's backward. They become 'R' work, emitted once."""
    users = graph.users
    tail = [False] * len(tasks)
    for i in range(len(tasks) - 1, -1, -1):   # a B value nothing reads is a step output
        if tasks[i] == "B":
            tail[i] = all(tasks[u] == "post" or tail[u] for u in users[i])
    # Only the part at and after a collective over a data-parallel axis is reduction: the
    # weight-gradient GEMM that feeds it is per-microbatch work (it accumulates into the
    # gradient buffer), and so is a tensor-parallel all-reduce whose result only the
    # weight gradients of the first layer read.
    # ... and only a reduction no matrix multiply reads afterwards: a gradient on its way
    # to the optimizer is cast and scaled, never multiplied, while an activation's
    # gradient summed over the context-parallel ranks (dK, dV) feeds the backward GEMMs
    # of the layers below.
    multiplied = [False] * len(tasks)
    for i in range(len(tasks) - 1, -1, -1):
        multiplied[i] = any(graph.nodes[u].op_class in ("gemm", "conv", "attention")
                            or multiplied[u] for u in users[i])
    for n in graph.nodes:
        i = n.id
        if tail[i] and (_reduces_over_data(graph, n) and not multiplied[i]
                        or any(tasks[d] == "R" for d in n.inputs)):
            tasks[i] = "R"


def _reduces_over_data(graph: WorkloadGraph, node) -> bool:
    c = node.collective
    if c is None or c.type not in ("all-reduce", "reduce-scatter"):
        return False
    # a gradient is summed; a max/min over the data axis is a per-microbatch statistic
    # (FP8 current scaling's amax of an activation gradient), not a gradient reduction
    if c.reduction not in (None, "add", "sum"):
        return False
    axes = graph.communicators[c.communicator].mesh_axes
    return any(a in DATA_PARALLEL_AXES for a in axes)
