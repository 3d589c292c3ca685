"""Instruction ids of a serialized HloModuleProto, rewritten so that jaxlib loads it in
memory proportional to its size.

XLA numbers an instruction `computation id << 32 | local id` and, when it loads a proto,
sizes each computation's instruction table by the largest local id it holds. Dumps from
older XLA (nsys-jax archives among them) number instructions with one counter for the
whole module, so every computation, even a 3-instruction fusion, gets a table as long as
the module's largest id: memory grows with computations x the largest id (a 40k-instruction
module with thousands of fusions needs tens of GB). Rewriting each computation's ids to
`computation id << 32 | position` before loading keeps every reference intact (operands,
control predecessors, the root and the schedule name instructions of their own
computation) and makes the tables as long as the computations.

The protobuf runtime parses the messages with a schema of only the fields touched here
(numbers from xla/service/hlo.proto); every other field is kept as an unknown field and
written back unchanged.
"""
from __future__ import annotations

from functools import lru_cache

_INT64, _MESSAGE = 3, 11            # FieldDescriptorProto types
_OPTIONAL, _REPEATED = 1, 3         # FieldDescriptorProto labels
_SCHEMA = {                         # message -> (field, number, type, label, message type)
    "Instruction": [("id", 35, _INT64, _OPTIONAL, None),
                    ("operand_ids", 36, _INT64, _REPEATED, None),
                    ("control_predecessor_ids", 37, _INT64, _REPEATED, None)],
    "Computation": [("instructions", 2, _MESSAGE, _REPEATED, "Instruction"),
                    ("id", 5, _INT64, _OPTIONAL, None),
                    ("root_id", 6, _INT64, _OPTIONAL, None)],
    "Sequence": [("instruction_ids", 1, _INT64, _REPEATED, None)],
    # map<int64, InstructionSequence> sequences = 1, read as its wire form: repeated entries
    "SequenceEntry": [("key", 1, _INT64, _OPTIONAL, None),
                      ("value", 2, _MESSAGE, _OPTIONAL, "Sequence")],
    "Schedule": [("sequences", 1, _MESSAGE, _REPEATED, "SequenceEntry")],
    "Module": [("computations", 3, _MESSAGE, _REPEATED, "Computation"),
               ("schedule", 7, _MESSAGE, _OPTIONAL, "Schedule")],
    "HloProto": [("hlo_module", 1, _MESSAGE, _OPTIONAL, "Module")],
}


class MalformedProto(ValueError):
    """The bytes are not a protobuf message (truncated, or of another format)."""


def message_classes(package: str, schema: dict) -> dict:
    """Message classes of a proto3 `schema` ({message: [(field, number, type, label,
    message type)]}) built at run time in a pool of their own: the fields not listed stay
    unknown fields, kept as they are."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    f = descriptor_pb2.FileDescriptorProto(name=f"{package}.proto", package=package,
                                           syntax="proto3")
    for name, fields in schema.items():
        m = f.message_type.add(name=name)
        for field, number, kind, label, type_name in fields:
            d = m.field.add(name=field, number=number, type=kind, label=label)
            if type_name:
                d.type_name = f".{package}.{type_name}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.{name}"))
            for name in schema}


@lru_cache(maxsize=1)
def _classes() -> dict:
    return message_classes("flint_hlo_ids", _SCHEMA)


def _parse(kind: str, data: bytes):
    from google.protobuf.message import DecodeError

    try:
        return _classes()[kind].FromString(data)
    except DecodeError as e:
        raise MalformedProto(str(e) or "not a protobuf message") from None


def hlo_module_of(data: bytes) -> bytes | None:
    """The hlo_module (field 1) of an HloProto; None when `data` is not one (an
    HloModuleProto's field 1 is its name, which holds no computations)."""
    try:
        proto = _parse("HloProto", data)
    except MalformedProto:
        return None
    if not proto.HasField("hlo_module") or not proto.hlo_module.computations:
        return None
    return proto.hlo_module.SerializeToString(deterministic=True)


def wrap_in_hlo_proto(module: bytes) -> bytes:
    """An HloProto holding `module` (the form XLA dumps and nsys-jax archives use)."""
    proto = _classes()["HloProto"]()
    proto.hlo_module.MergeFromString(module)
    return proto.SerializeToString(deterministic=True)


def table_entries(module: bytes) -> tuple[int, int]:
    """(instructions, instruction-table entries XLA allocates to load `module` as is)."""
    count = entries = 0
    for comp in _parse("Module", module).computations:
        count += len(comp.instructions)
        entries += max(((i.id & 0xFFFFFFFF) + 1 for i in comp.instructions), default=0)
    return count, entries


def compact_instruction_ids(module: bytes) -> bytes:
    """A serialized HloModuleProto whose instruction ids are `computation id << 32 |
    position in the computation`, every reference rewritten to match; unchanged when its
    ids are already compact enough (XLA of 2025 on writes them so)."""
    count, entries = table_entries(module)
    if entries <= 2 * count + 1024:
        return module
    return renumber_instructions(module, lambda comp_id, old_ids: [
        (comp_id << 32) | k for k in range(len(old_ids))])


def renumber_instructions(module: bytes, numbering) -> bytes:
    """`module` with each computation's instruction ids replaced by
    `numbering(computation id, [old ids in order])` and every reference (operands, control
    predecessors, the root, the schedule) rewritten to match."""
    proto = _parse("Module", module)
    by_computation = {}
    for comp in proto.computations:
        old = [ins.id for ins in comp.instructions]
        new_id = dict(zip(old, numbering(comp.id, old)))
        by_computation[comp.id] = new_id
        for ins in comp.instructions:
            ins.id = new_id[ins.id]
            if ins.operand_ids:
                ins.operand_ids[:] = [new_id.get(i, i) for i in ins.operand_ids]
            if ins.control_predecessor_ids:
                ins.control_predecessor_ids[:] = [new_id.get(i, i)
                                                  for i in ins.control_predecessor_ids]
        comp.root_id = new_id.get(comp.root_id, comp.root_id)
    for entry in proto.schedule.sequences:
        new_id = by_computation.get(entry.key, {})
        ids = entry.value.instruction_ids
        ids[:] = [new_id.get(i, i) for i in ids]
    return proto.SerializeToString(deterministic=True)
