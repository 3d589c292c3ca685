"""FSDP parameter gathers held for a whole step (passes.layer_template's `gather_once`).

Under a pipeline schedule a stage runs many micro-batches, and re-gathering every layer's
parameters in each micro-batch's forward and again in its backward multiplies the
data-parallel traffic by the micro-batch count. The frameworks that combine FSDP with a
pipeline avoid it:
- torch.distributed.pipelining sets `set_reshard_after_backward(False)` and
  `set_requires_gradient_sync(False)` on an FSDP2 stage for every micro-batch's backward and
  reshards and reduce-scatters only in its REDUCE_GRAD action after the last one
  (torch/distributed/pipelining/stage.py, `backward_maybe_with_nosync` and
  `perform_reduce_grad`);
- torchtitan's default `reshard_after_forward_policy` is `not pp_enabled`
  (torchtitan/models/llama3/infra/parallelize.py, "to avoid per-microbatch all-gathers");
- Llama 3's pre-training does the same (Dubey et al. 2024, section 3.3.2).
So each layer's parameters are gathered once per step, before its first micro-batch's
forward, and stay gathered until the stage's last backward; gradients are reduce-scattered
once, after it (the template's R collectives, grad_sync last-microbatch).

Here: which template nodes are those gathers (all-gathers over a data-parallel axis of
values no micro-batch data reaches), the template block that owns each, and the layered
graph's once-per-step gather nodes that replace them.

The same reach finds the other parameter-only work a framework does once per step:
Transformer Engine's FP8 weight casts (weight_casts), which Megatron-Core runs in a step's
first micro-batch and reuses until its last backward.
"""
from __future__ import annotations

from flint.passes.pipeline_stages import DATA_PARALLEL_AXES, layer_index

from flint.graph import Collective, Node, NodeKind, WorkloadGraph
from flint.hlo.shapes import parse_shape

_INTEGER_PREFIXES = ("s8[", "s16[", "s32[", "s64[", "u8[", "u16[", "u32[", "u64[")
_QUANTIZED_PREFIXES = ("f8", "f4")    # FP8 and NVFP4 (passes.nvfp4_storage) casts


def microbatch_reach(graph: WorkloadGraph) -> list[bool]:
    """Per node, whether micro-batch data reaches it (it enters as integer arrays: token
    ids, labels); the others compute from parameters alone."""
    batch = [False] * len(graph.nodes)
    for n in graph.nodes:       # an embedding lookup reads its table and the token ids
        batch[n.id] = (any(batch[i] for i in n.inputs)
                       or any(o.startswith(_INTEGER_PREFIXES) for o in n.operands))
    return batch


def weight_casts(graph: WorkloadGraph, tasks: list[str]) -> list[int]:
    """Ids of F/B compute nodes that cast weights to FP8 or FP4 (every output so, no input array
    that micro-batch data reaches), and of the parameter-only nodes that feed only them
    (the pieces of their scales). A scalar an input carries from micro-batch data does not
    count: XLA fuses a weight's scale with an activation's into one multi-output fusion,
    which a node-level reach cannot take apart; a cast of activations reads their arrays."""
    batch = microbatch_reach(graph)
    casts = {n.id for n in graph.nodes
             if tasks[n.id] in ("F", "B") and _casts_weights(graph, n, batch)}
    users = graph.users
    for n in reversed(graph.nodes):         # users come after their producers
        if (tasks[n.id] in ("F", "B") and n.collective is None and not batch[n.id]
                and users[n.id] and all(u in casts for u in users[n.id])):
            casts.add(n.id)
    return sorted(casts)


def _casts_weights(graph: WorkloadGraph, n: Node, batch: list[bool]) -> bool:
    """Whether `n` writes FP8 (every output) from arrays no micro-batch data reaches."""
    return (n.collective is None and bool(n.outputs)
            and all(o.startswith(_QUANTIZED_PREFIXES) for o in n.outputs)
            and not any(o.startswith(_INTEGER_PREFIXES) for o in n.operands)
            and not any(batch[i] and not all(parse_shape(o).num_elements <= 1
                                             for o in graph.nodes[i].outputs)
                        for i in n.inputs))


def parameter_gathers(graph: WorkloadGraph, tasks: list[str]) -> list[int]:
    """Ids of F/B all-gathers over a data-parallel axis whose input no micro-batch data
    reaches (a parameter shard, or its cast): FSDP's gathers, not a context-parallel
    gather of keys and values."""
    batch = microbatch_reach(graph)
    out = []
    for n in graph.nodes:
        c = n.collective
        if (c is None or c.type != "all-gather" or tasks[n.id] not in "FB"
                or batch[n.id]):
            continue
        axes = graph.communicators[c.communicator].mesh_axes
        if any(a in DATA_PARALLEL_AXES for a in axes):
            out.append(n.id)
    return out


def gather_owners(graph: WorkloadGraph, gathers: list[int], blocks: list) -> dict:
    """{owner: [gather node]} for the gathers a forward reads, owner a template layer
    index, 'embed' or 'head' (its own layer label, else the block of its first reader),
    or None. A backward's re-gather of the same parameters (remat, XLA's scheduling) is
    left out: the forward's gather is held through the step."""
    users = graph.users
    out: dict = {}
    for i in gathers:
        n = graph.nodes[i]
        if n.meta.get("phase") == "backward":
            continue
        label = n.meta.get("layer")
        owner = layer_index(label)
        if owner is None and label in ("embed", "head"):
            owner = label
        if owner is None:
            readers = [blocks[u] for u in sorted(users[i]) if blocks[u] is not None]
            owner = readers[0][1] if readers else None
        out.setdefault(owner, []).append(n)
    return out


def emit_gathers(nodes: list[Node], gathers: list[Node], label: str) -> list[int]:
    """Append one asynchronous all-gather per communicator and dtype for `gathers` (the
    template's gathers of one block), with their output shapes so that the gathered
    parameters stay live until their last reader; returns the new ids."""
    merged: dict = {}
    for g in gathers:
        c = g.collective
        key = (c.communicator, c.dtype)
        a, b, shapes = merged.get(key, (0, 0, []))
        merged[key] = (a + c.bytes_in, b + c.bytes_out, shapes + list(g.outputs))
    ids = []
    for (comm, dtype), (a, b, shapes) in sorted(merged.items(), key=lambda kv: str(kv[0])):
        collective = Collective("all-gather", comm, int(a), int(b), dtype, None, True)
        nodes.append(Node(len(nodes), f"all-gather.params.{label}", NodeKind.COLLECTIVE,
                          "all-gather", "collective", [], [], collective=collective,
                          outputs=shapes, meta={"layer": label, "held": "step"}))
        ids.append(len(nodes) - 1)
    return ids
