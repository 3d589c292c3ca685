"""Instruction ids of a serialized HloModuleProto, rewritten so that jaxlib loads it in
memory proportional to its size.

XLA numbers an instruction `computation id << 32 | local id` and, when it loads a proto,
sizes each computation's instruction table by the largest local id it holds. Dumps from
older XLA (nsys-jax archives among them) number instructions with one counter per module,
so every computation, even a 3-instruction fusion, gets a table as long as the module's
largest id: memory grows with computations x instructions (a 37k-instruction module with
thousands of fusions needs tens of GB). Rewriting each computation's ids to
`computation id << 32 | position` before loading keeps every reference intact (operands,
control predecessors, the root, the schedule all name instructions of their own
computation) and makes the tables as long as the computations.

Only the protobuf wire format is touched (field numbers from xla/service/hlo.proto);
every other byte is copied as is.
"""
from __future__ import annotations

# xla/service/hlo.proto field numbers
_MODULE_COMPUTATIONS, _MODULE_SCHEDULE = 3, 7
_COMP_INSTRUCTIONS, _COMP_ID, _COMP_ROOT_ID = 2, 5, 6
_INS_ID, _INS_OPERAND_IDS, _INS_CONTROL_PREDECESSOR_IDS = 35, 36, 37
_SCHEDULE_SEQUENCES, _MAP_KEY, _MAP_VALUE, _SEQUENCE_IDS = 1, 1, 2, 1
_LEN, _VARINT = 2, 0
_U64 = (1 << 64) - 1


class MalformedProto(ValueError):
    """The bytes are not a protobuf message (truncated, or of another format)."""


def read_varint(b: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= len(b) or shift > 63:
            raise MalformedProto("truncated or over-long varint")
        byte = b[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, i


def varint(value: int) -> bytes:
    value &= _U64                      # negative int64s are ten-byte two's complement
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def fields(b: bytes):
    """(field number, wire type, value, start, end) per field: value is an int for
    varints and a bytes slice for length-delimited fields; [start, end) spans the field
    with its tag."""
    i, n = 0, len(b)
    while i < n:
        start = i
        tag, i = read_varint(b, i)
        number, wire = tag >> 3, tag & 7
        if wire == _VARINT:
            value, i = read_varint(b, i)
        elif wire == _LEN:
            size, i = read_varint(b, i)
            if i + size > n:
                raise MalformedProto("length-delimited field runs past the end")
            value, i = b[i:i + size], i + size
        elif wire in (1, 5):
            i += 8 if wire == 1 else 4
            if i > n:
                raise MalformedProto("fixed-width field runs past the end")
            value = None
        else:
            raise MalformedProto(f"wire type {wire} is not protobuf")
        yield number, wire, value, start, i


def _tag(number: int, wire: int) -> bytes:
    return varint(number << 3 | wire)


def _len_field(number: int, payload: bytes) -> bytes:
    return _tag(number, _LEN) + varint(len(payload)) + payload


def _ints(wire: int, value) -> list[int]:
    """The int64s of a repeated field occurrence, packed or not."""
    if wire == _VARINT:
        return [value]
    out, i = [], 0
    while i < len(value):
        v, i = read_varint(value, i)
        out.append(v)
    return out


def _remap_ints(number: int, wire: int, value, new_id: dict) -> bytes:
    ids = [new_id.get(v, v) for v in _ints(wire, value)]
    if wire == _VARINT:
        return _tag(number, _VARINT) + varint(ids[0])
    return _len_field(number, b"".join(varint(v) for v in ids))


def _instruction_id(ins: bytes) -> int:
    return next((v for f, w, v, _, _ in fields(ins) if f == _INS_ID and w == _VARINT), 0)


def _rewrite(msg: bytes, edits: dict) -> bytes:
    """`msg` with each field whose number is in `edits` replaced by edits[number](wire,
    value) (bytes to write instead); other fields copied verbatim."""
    out, last = [], 0
    for number, wire, value, start, end in fields(msg):
        edit = edits.get(number)
        if edit is None:
            continue
        out.append(msg[last:start])
        out.append(edit(wire, value))
        last = end
    out.append(msg[last:])
    return b"".join(out)


def table_entries(module: bytes) -> tuple[int, int]:
    """(instructions, instruction-table entries XLA allocates to load `module` as is)."""
    count = entries = 0
    for number, wire, comp, _, _ in fields(module):
        if number != _MODULE_COMPUTATIONS or wire != _LEN:
            continue
        ids = [_instruction_id(v) for f, w, v, _, _ in fields(comp)
               if f == _COMP_INSTRUCTIONS and w == _LEN]
        count += len(ids)
        entries += max(((i & 0xFFFFFFFF) + 1 for i in ids), default=0)
    return count, entries


def compact_instruction_ids(module: bytes) -> bytes:
    """A serialized HloModuleProto whose instruction ids are `computation id << 32 |
    position in the computation`, every reference rewritten to match; unchanged when its
    ids are already compact enough (XLA of 2025 on writes them so)."""
    count, entries = table_entries(module)
    if entries <= 2 * count + 1024:
        return module
    by_computation: dict[int, dict[int, int]] = {}
    rewritten = []
    for number, wire, comp, start, end in fields(module):
        if number != _MODULE_COMPUTATIONS or wire != _LEN:
            continue
        comp_id = next((v for f, w, v, _, _ in fields(comp) if f == _COMP_ID and w == _VARINT), 0)
        old_ids = [_instruction_id(v) for f, w, v, _, _ in fields(comp)
                   if f == _COMP_INSTRUCTIONS and w == _LEN]
        new_id = {old: (comp_id << 32) | k for k, old in enumerate(old_ids)}
        by_computation[comp_id] = new_id
        remap = {n: (lambda w, v, n=n: _remap_ints(n, w, v, new_id))
                 for n in (_INS_ID, _INS_OPERAND_IDS, _INS_CONTROL_PREDECESSOR_IDS)}
        ins_edit = {_COMP_INSTRUCTIONS: lambda w, v: _len_field(
            _COMP_INSTRUCTIONS, _with_id(_rewrite(v, remap), v, new_id)) if w == _LEN else b"",
            _COMP_ROOT_ID: lambda w, v: _remap_ints(_COMP_ROOT_ID, w, v, new_id)}
        rewritten.append((start, end, _len_field(_MODULE_COMPUTATIONS, _rewrite(comp, ins_edit))))
    out, last = [], 0
    for start, end, payload in rewritten:
        out += [module[last:start], payload]
        last = end
    out.append(module[last:])
    body = b"".join(out)
    return _rewrite(body, {_MODULE_SCHEDULE: lambda w, v: _len_field(
        _MODULE_SCHEDULE, _schedule(v, by_computation))})


def _with_id(rewritten: bytes, original: bytes, new_id: dict) -> bytes:
    """proto3 leaves id 0 out of the wire: an instruction that had none gets its new one."""
    if any(f == _INS_ID for f, _, _, _, _ in fields(original)):
        return rewritten
    return rewritten + _tag(_INS_ID, _VARINT) + varint(new_id.get(0, 0))


def _schedule(schedule: bytes, by_computation: dict) -> bytes:
    """HloScheduleProto: sequences is a map<computation id, InstructionSequence>."""
    def entry(wire, value):
        key = next((v for f, w, v, _, _ in fields(value) if f == _MAP_KEY and w == _VARINT), 0)
        ids = by_computation.get(key, {})
        seq = _rewrite(value, {_MAP_VALUE: lambda w, v: _len_field(_MAP_VALUE, _rewrite(
            v, {_SEQUENCE_IDS: lambda w2, v2: _remap_ints(_SEQUENCE_IDS, w2, v2, ids)}))})
        return _len_field(_SCHEDULE_SEQUENCES, seq)
    return _rewrite(schedule, {_SCHEDULE_SEQUENCES: entry})
