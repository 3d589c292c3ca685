"""Which dynamic-update-slice fusions XLA ran in place, read from its buffer assignment.

A fusion whose root is a dynamic-update-slice writes only the update when its output
shares the buffer slice of the operand it updates: XLA's GPU backend then picks the in-place
emitter (`CanEmitFusedDynamicUpdateSliceInPlaceForGpu` compares the two slices), which
launches one thread per update element. When buffer assignment gave the output a slice of
its own (the operand is still live, or copy insertion kept them apart), the fusion runs as
a loop fusion over the whole output: it reads the whole operand and writes the whole
buffer. On a scanned model the two differ by the number of layers.

An HloProto dump (XLA's `*.hlo.pb`, nsys-jax archives) carries the BufferAssignmentProto
next to the module (xla/service/hlo.proto, field 3); HLO text and HloModuleProto do not,
and then every such fusion whose updated operand is a fusion parameter is taken as in
place, XLA's usual outcome. The protobuf runtime reads the few fields used here through a
schema built at run time (as proto_ids.py does), numbers from xla/service/hlo.proto.
"""
from __future__ import annotations

from functools import lru_cache

from flint.hlo.module import HloComputation, HloInstruction, HloModule
from flint.hlo.proto_ids import message_classes

_INT64, _STRING, _MESSAGE = 3, 9, 11          # FieldDescriptorProto types
_OPTIONAL, _REPEATED = 1, 3                   # FieldDescriptorProto labels
_SCHEMA = {
    "Location": [("instruction_name", 2, _STRING, _OPTIONAL, None),
                 ("instruction_id", 4, _INT64, _OPTIONAL, None),
                 ("shape_index", 3, _INT64, _REPEATED, None)],
    "LogicalBuffer": [("id", 1, _INT64, _OPTIONAL, None),
                      ("defined_at", 3, _MESSAGE, _OPTIONAL, "Location")],
    "BufferAlias": [("source_buffer_id", 1, _INT64, _OPTIONAL, None),
                    ("location", 2, _MESSAGE, _OPTIONAL, "Location")],
    "Assigned": [("logical_buffer_id", 1, _INT64, _OPTIONAL, None),
                 ("offset", 2, _INT64, _OPTIONAL, None),
                 ("size", 3, _INT64, _OPTIONAL, None)],
    "Allocation": [("index", 1, _INT64, _OPTIONAL, None),
                   ("assigned", 9, _MESSAGE, _REPEATED, "Assigned")],
    "Assignment": [("logical_buffers", 1, _MESSAGE, _REPEATED, "LogicalBuffer"),
                   ("buffer_aliases", 2, _MESSAGE, _REPEATED, "BufferAlias"),
                   ("buffer_allocations", 3, _MESSAGE, _REPEATED, "Allocation")],
    "Instruction": [("name", 1, _STRING, _OPTIONAL, None),
                    ("id", 35, _INT64, _OPTIONAL, None)],
    "Computation": [("instructions", 2, _MESSAGE, _REPEATED, "Instruction")],
    "Module": [("computations", 3, _MESSAGE, _REPEATED, "Computation")],
    "HloProto": [("hlo_module", 1, _MESSAGE, _OPTIONAL, "Module"),
                 ("buffer_assignment", 3, _MESSAGE, _OPTIONAL, "Assignment")],
}
# Ops inside a fusion that leave the updated buffer where it is.
_SAME_BUFFER = frozenset({"bitcast"})
# Ops between a loaded element and the store that work in registers.
_IN_REGISTERS = frozenset({"bitcast", "reshape", "convert", "copy"})


@lru_cache(maxsize=1)
def _hlo_proto_class():
    return message_classes("flint_buffer_assignment", _SCHEMA)["HloProto"]


def update_roots(fused: HloComputation) -> list[tuple[tuple, HloInstruction]]:
    """(output shape index, what defines it) for each output of a fusion rooted in
    dynamic-update-slices (one, or a tuple holding one or more; through bitcasts, as XLA's
    GetOutputDefiningDynamicUpdateSlices looks); empty for any other fusion."""
    root = fused.root
    outs = ([((k,), fused.by_name.get(name)) for k, name in enumerate(root.operands)]
            if root.opcode == "tuple" else [((), root)])
    outs = [(index, _through_bitcasts(fused, ins)) for index, ins in outs]
    if not any(ins is not None and ins.opcode == "dynamic-update-slice" for _, ins in outs):
        return []
    return outs


def _through_bitcasts(fused: HloComputation, ins: HloInstruction | None):
    while ins is not None and ins.opcode in _SAME_BUFFER and ins.operands:
        ins = fused.by_name.get(ins.operands[0])
    return ins


def updated_parameters(fused: HloComputation) -> list[tuple[tuple, int]] | None:
    """(output shape index, parameter number) of the buffer each output of a
    dynamic-update-slice fusion updates in place; None when XLA cannot emit it in place:
    an output that is no dynamic-update-slice, or an updated operand computed inside the
    fusion (a transposed or converted buffer is a new array, written whole). The in-place
    emitter needs every output to update a parameter (through bitcasts)."""
    targets = []
    params = {p.name: number for number, p in fused.parameters.items()}
    for index, dus in update_roots(fused):
        if dus is None or dus.opcode != "dynamic-update-slice" or not dus.operands:
            return None
        base = _through_bitcasts(fused, fused.by_name.get(dus.operands[0]))
        if base is None or base.name not in params:
            return None
        targets.append((index, params[base.name]))
    return targets


def update_element_bytes(fused: HloComputation) -> int:
    """Bytes one thread of the in-place emitter loads: one element of each update (the
    updates of a multi-output fusion share their indexing, so a thread handles the same
    position in each), as the fusion reads it: before converts and bitcasts, which run
    in registers."""
    total = 0
    for _, dus in update_roots(fused):
        if dus is None or dus.opcode != "dynamic-update-slice" or len(dus.operands) < 2:
            continue
        src = fused.by_name.get(dus.operands[1])
        while src is not None and src.opcode in _IN_REGISTERS and src.operands:
            src = fused.by_name.get(src.operands[0])
        if src is not None and src.shape.num_elements:
            total += src.shape.nbytes // src.shape.num_elements
    return total


def copied_updates(hlo_proto: bytes, module: HloModule) -> frozenset[str]:
    """Names of the dynamic-update-slice fusions of `module` that XLA's buffer assignment
    (in `hlo_proto`, an HloProto) did not run in place; empty when it carries none."""
    from google.protobuf.message import DecodeError

    try:
        proto = _hlo_proto_class().FromString(hlo_proto)
    except DecodeError:
        return frozenset()
    assignment = proto.buffer_assignment
    if not assignment.buffer_allocations:
        return frozenset()
    names = {ins.id: ins.name for comp in proto.hlo_module.computations
             for ins in comp.instructions}
    slice_of = {}
    for alloc in assignment.buffer_allocations:
        for a in alloc.assigned:
            slice_of[a.logical_buffer_id] = (alloc.index, a.offset, a.size)
    at: dict[tuple[str, tuple], set] = {}

    def place(location, buffer_id):
        name = names.get(location.instruction_id) or location.instruction_name
        at.setdefault((name, tuple(location.shape_index)), set()).add(slice_of.get(buffer_id))

    for buf in assignment.logical_buffers:
        place(buf.defined_at, buf.id)
    for alias in assignment.buffer_aliases:
        place(alias.location, alias.source_buffer_id)

    copied = set()
    for comp in module.computations.values():
        for ins in comp.instructions:
            if ins.opcode != "fusion" or not ins.called("calls"):
                continue
            fused = module.computations.get(ins.called("calls")[0])
            for index, number in (updated_parameters(fused) or []) if fused else []:
                if number >= len(ins.operands):
                    continue
                out = _slices(comp, ins.name, index, at)
                base = _slices(comp, ins.operands[number], (), at)
                if out and base and not out & base:
                    copied.add(ins.name)
    return frozenset(copied)


def _slices(comp: HloComputation, name: str, index: tuple, at: dict) -> set:
    """The buffer slices at (instruction, shape index); a bitcast's are its operand's and
    a get-tuple-element's its tuple operand's at the element (not every XLA lists them as
    aliases)."""
    found = at.get((name, index)) or set()
    found = {s for s in found if s is not None}
    if found:
        return found
    ins = comp.by_name.get(name)
    if ins is not None and ins.opcode == "bitcast" and ins.operands:
        return _slices(comp, ins.operands[0], index, at)
    if ins is not None and ins.opcode == "get-tuple-element" and ins.operands:
        element = ins.attr("index")
        if element is not None and element.isdigit():
            return _slices(comp, ins.operands[0], (int(element),) + index, at)
    return set()
