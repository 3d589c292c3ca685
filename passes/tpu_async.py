"""libtpu's async collective fusions, as the HLO lowering reads them.

Under the collective flags MaxText's TPU scripts export (flint.frontends.targets
TPU_TRAINING_FLAGS: --xla_tpu_enable_async_collective_fusion and its family) libtpu runs an
FSDP all-gather in three kinds of fusion that share the collective's channel_id:
- a start fusion, whose root is the custom-call AsyncCollectiveStart over the collective,
  issues it;
- continuation fusions (backend_config `continuation_config`) are compute kernels (the
  next dot) that carry the collective's state along in an aliased output tuple while the
  TensorCore works;
- a done fusion, whose root is the custom-call AsyncCollectiveDone, waits for it.
The lowering makes one async collective node from start to done; a continuation is priced
as its own compute: its original outputs, the bytes its compute reads, and no wait on the
collective it carries.
"""
from __future__ import annotations

from flint.graph import Node
from flint.hlo.module import HloComputation, HloInstruction, HloModule
from flint.passes.hlo_cost import COLLECTIVES, read_through
from flint.passes.lower_collectives import fused_collective

# how the lowering reads libtpu's programs: part of a TPU stage program's cache key
TPU_LOWERING_VERSION = 7


def tpu_async_role(module: HloModule, ins: HloInstruction) -> tuple | None:
    """("start" | "continuation" | "done", channel id) for a fusion of the family, None
    for any other fusion."""
    inner = fused_collective(module, ins)
    if inner is None:
        return None
    body, coll = inner
    channel = coll.attr("channel_id") or coll.name
    target = (body.root.attr("custom_call_target") or "").strip('"') \
        if body.root.opcode == "custom-call" else ""
    if target == "AsyncCollectiveStart":
        return "start", channel
    if target == "AsyncCollectiveDone":
        return "done", channel
    if "continuation_config" in ins.backend_config:
        return "continuation", channel
    return None


def own_outputs(ins: HloInstruction) -> list:
    """A continuation's own output shapes: the tuple's original range; the rest is the
    carried collective's state and buffers, aliased through untouched."""
    span = ins.backend_config["continuation_config"]
    first = int(span.get("output_tuple_original_start", 0))
    last = int(span.get("output_tuple_original_end", first))
    leaves = list(ins.shape.leaves())
    return leaves[first:last + 1] or leaves[:1]


def compute_operands(module: HloModule, ins: HloInstruction) -> set[int]:
    """Operand positions of a continuation that its compute reads. The others are the
    carried collective's state, handed from the start or the previous continuation of the
    channel: an edge from them would chain every compute kernel that carries one gather
    (an attention call's tiles and the weight-gradient GEMM XLA put between them) as if
    each read the last one's output."""
    body, compute_users = _compute_users(module, ins)
    return {k for k, param in body.parameters.items() if compute_users(param)}


def compute_reads(module: HloModule, ins: HloInstruction) -> int:
    """Bytes a continuation's compute reads: of each parameter, what the instructions other
    than the carried collective and the root tuple read of it (the slices they take, as
    for any fusion); what only passes through is not read."""
    body, compute_users = _compute_users(module, ins)
    total = 0
    for param in body.parameters.values():
        users = compute_users(param)
        if users:
            total += read_through(body, users, param.shape, module.computations)
    return total


def _compute_users(module: HloModule, ins: HloInstruction):
    """(a continuation's fused body, parameter -> its (user, operand position) pairs other
    than the carried collective and the root tuple that hands the state on)."""
    body = module.computations[ins.called("calls")[0]]
    skip = {i.name for i in body.instructions if i.opcode in COLLECTIVES} | {body.root.name}
    return body, lambda param: [(u, pos) for u, pos in body.users.get(param.name, [])
                                if u.name not in skip]


def mark_async(node: Node) -> None:
    """A collective the TensorCore issues and waits for at its first use. A TPU
    collective-permute is one whether or not libtpu's HLO names a -start: a DMA to a
    neighbour; XLA's windowed-einsum loops send the next chunk while this one's dot runs
    (Wang et al., 'Overlap Communication with Dependent Computation via Decomposition in
    Large Deep Learning Models', ASPLOS 2023)."""
    node.meta["async"] = True
    node.collective.is_async = True


def lower_fusion(lowering, ins: HloInstruction, comp: HloComputation, env: dict,
                 repeat: int, role: tuple) -> int:
    """The node id of one fusion of the family, lowered by `lowering` (passes.lower_hlo):
    the start is an async collective node, the done closes it, a continuation is priced as
    its own compute and carries the collective without waiting for it. Starts stay open
    across computations (a while body carries the state): `lowering.tpu_starts`."""
    kind, channel = role
    key, starts = str(channel), lowering.tpu_starts
    if kind == "done" and key in starts:
        node = lowering.nodes[starts.pop(key)]
        lowering.close_async(node, ins)
        return node.id
    operands = [env.get(o, ()) for o in ins.operands]
    if kind == "continuation":
        reads = compute_operands(lowering.module, ins)
        operands = [v if k in reads else () for k, v in enumerate(operands)]
    node = lowering.make_node(ins, comp, ins, operands, repeat,
                              carried_collective=kind == "continuation")
    if kind == "continuation":
        own = own_outputs(ins)
        node.outputs = [str(t) for t in own]
        node.bytes_written = float(sum(t.nbytes for t in own))
        node.bytes_read = float(compute_reads(lowering.module, ins))
        carried = set(starts.values())
        node.inputs = [i for i in node.inputs if i not in carried]
    if kind == "start" and node.collective is not None:
        mark_async(node)
        starts[key] = node.id
    return node.id

