"""libtpu's Multislice programs, as the HLO lowering reads them.

A job larger than one TPU slice runs as Multislice: every slice runs the same SPMD program,
partitioned for the chips of one slice, and what crosses slices goes over the data-center
network through the MegaScale runtime. In the compiled HLO a cross-slice collective is a
host-transfer send/recv pair whose frontend attributes name the runtime
(`_xla_host_transfer_handler_name="xla_megascale_runtime"`), a rendezvous key shared by
the pair, the collective (`_xla_megascale_transfer_type="ALL_REDUCE"`) and its reduction:
- the recv is posted early and carries no data;
- the send hands the runtime this chip's operand;
- send-done releases the operand; recv-done yields the result.
The lowering makes one async collective node from the send to the recv-done, over the
chips at the same position of every slice (a group per chip of a slice, one member per
slice), which the topology places across the DCN.
"""
from __future__ import annotations

import re

from flint.errors import FlintError
from flint.graph import Collective, Node, NodeKind, OpClass
from flint.hlo.module import HloComputation, HloInstruction, HloModule

RUNTIME = "xla_megascale_runtime"
_ATTR = re.compile(r'(_xla_[a-z_]+)="([^"]*)"')
# the MegaScale runtime's transfer types, as the lowering prices them
_TYPES = {"ALL_REDUCE": "all-reduce", "ALL_GATHER": "all-gather",
          "REDUCE_SCATTER": "reduce-scatter", "ALL_TO_ALL": "all-to-all"}
_REDUCTIONS = {"SUM": "add", "MAX": "maximum", "MIN": "minimum", "PRODUCT": "multiply"}
_OPS = ("send", "recv", "send-done", "recv-done")


def attributes(ins: HloInstruction) -> dict:
    return dict(_ATTR.findall(ins.attr("frontend_attributes") or ""))


def is_transfer(ins: HloInstruction) -> bool:
    """A send, recv or their done of the MegaScale runtime (a cross-slice collective)."""
    return (ins.opcode in _OPS
            and attributes(ins).get("_xla_host_transfer_handler_name") == RUNTIME)


def slices(module: HloModule, devices: int, partitions: int) -> int:
    """How many slices a program partitioned for `partitions` chips runs on in a cluster
    of `devices`: more than one only for a Multislice program (one that hands data to the
    MegaScale runtime) whose slice divides the cluster. A Multislice program on a cluster
    of one slice is a FlintError: its cross-slice collectives would have no one to reach."""
    if partitions <= 1 or devices < partitions or devices % partitions:
        return 1
    multislice = any(is_transfer(i) for c in module.computations.values()
                     for i in c.instructions)
    if multislice and devices == partitions:
        raise FlintError(f"HLO module {module.name!r} is one slice's program of a Multislice "
                         f"job (its cross-slice collectives go through the MegaScale runtime): "
                         f"give the whole job's device count, a multiple of {partitions}")
    return devices // partitions if multislice else 1


def lower_transfer(lowering, ins: HloInstruction, comp: HloComputation, env: dict,
                   repeat: int):
    """The value of one MegaScale instruction lowered by `lowering` (passes.lower_hlo): the
    send is an async collective node across slices, the recv-done closes it and yields its
    result; the recv and send-done carry no data."""
    pending = lowering.megascale
    if ins.opcode == "recv":
        pending[ins.name] = _key(ins)
        return ()
    if ins.opcode == "send-done":
        return ()
    if ins.opcode == "recv-done":
        key = pending.get(ins.operands[0])
        sent = pending.get(key)
        if not isinstance(sent, int):
            raise FlintError(f"MegaScale transfer {key or ins.operands[0]!r} completes in "
                             f"{ins.name!r} before any send of it")
        node = lowering.nodes[sent]
        lowering.close_async(node, ins)
        data = [s for s in ins.shape.leaves() if s.dtype != "token"]
        node.outputs = [str(s) for s in data]
        node.bytes_written = float(sum(s.nbytes for s in data))
        node.collective.bytes_out = int(node.bytes_written)
        return [(node.id,) if s.dtype != "token" else () for s in ins.shape.elements] \
            if ins.shape.is_tuple else (node.id,)
    node = _collective_node(lowering, ins, comp, env, repeat)
    pending[_key(ins)] = node.id
    return ()


def _key(ins: HloInstruction) -> str:
    attrs = attributes(ins)
    return attrs.get("_xla_host_transfer_rendezvous") or ins.attr("channel_id") or ins.name


def _collective_node(lowering, ins: HloInstruction, comp: HloComputation, env: dict,
                     repeat: int) -> Node:
    attrs = attributes(ins)
    kind = attrs.get("_xla_megascale_transfer_type", "")
    if kind not in _TYPES:
        raise FlintError(f"MegaScale transfer {ins.name!r}: transfer type {kind or 'none'!r} "
                         f"is not one of {', '.join(sorted(_TYPES))}")
    data = [comp.by_name[o].shape for o in ins.operands[:1] if o in comp.by_name]
    leaves = [s for shape in data for s in shape.leaves()]
    nbytes = sum(s.nbytes for s in leaves)
    per_slice = lowering.partitions
    groups = f"[{per_slice},{lowering.slices}]<=[{lowering.slices},{per_slice}]T(1,0)"
    comm = lowering.collectives.table.get("groups", groups, across_slices=True)
    reduction = _REDUCTIONS.get(attrs.get("_xla_megascale_reduce_operation", ""))
    node_id = len(lowering.nodes)
    meta = lowering.metadata(ins)
    if lowering.loop_stack:
        meta["loop"] = lowering.loop_stack[-1]
    meta.update({"async": True, "megascale": _key(ins)})
    node = Node(id=node_id, name=ins.name, kind=NodeKind.COLLECTIVE, op=_TYPES[kind],
                op_class=OpClass.COLLECTIVE,
                inputs=lowering.resolve([env.get(o, ()) for o in ins.operands[:1]], node_id),
                bytes_read=float(nbytes), bytes_written=float(nbytes),
                outputs=[str(s) for s in leaves], operands=[str(s) for s in data],
                repeat=repeat, meta=meta,
                collective=Collective(type=_TYPES[kind], communicator=comm.id,
                                      bytes_in=nbytes, bytes_out=nbytes,
                                      dtype=leaves[0].dtype if leaves else "f32",
                                      reduction=reduction, is_async=True))
    return lowering.append(node, ins)
