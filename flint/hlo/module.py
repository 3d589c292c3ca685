"""A small, fast reader of XLA HLO text into plain objects.

The HLO text printer is the one stable surface that every XLA producer shares (JAX compiled
executables, HloModuleProto dumps, nsys-jax archives), so Flint reads text. Instruction
headers (name, shape, opcode, operands) are parsed eagerly; attributes are looked up lazily
from the raw attribute tail because most of them are never needed.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cached_property

from flint.errors import FlintError
from flint.hlo.shapes import Shape, parse_shape

_OPEN = {"{": "}", "[": "]", "(": ")"}
_COMMENT = re.compile(r"/\*.*?\*/")
_MESH_GROUPS = re.compile(r"replica_groups=(mesh\[[^\]]*\](?:,\s*device_ids=\(.*?\))?\s*\{[^}]*\})")
_META_FIELD = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|[^ }]+)')
_COMPUTATION = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*(\(.*\))?\s*->\s*(.*?)\s*\{\s*$")


_ESCAPE = re.compile(r"\\(.)")
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r"}


def unquote(text: str) -> str:
    """`"a\\"b"` -> `a"b`: HLO strings use C escapes, which are not all valid JSON."""
    return _ESCAPE.sub(lambda m: _ESCAPES.get(m.group(1), m.group(1)), text[1:-1])


def read_value(s: str, i: int, stop_at_comma: bool = True) -> tuple[str, int]:
    """Read one attribute value starting at s[i]; return it and the index after it.

    Values nest (), [], {} and may hold quoted strings; a value ends at a top-level comma
    (unless `stop_at_comma` is false) or at a closing bracket that was not opened in it.
    """
    depth = 0
    start = i
    n = len(s)
    while i < n:
        c = s[i]
        if c == '"':
            i += 1
            while i < n and s[i] != '"':
                i += 2 if s[i] == "\\" else 1
        elif c in "{[(":
            depth += 1
        elif c in "}])":
            depth -= 1
            if depth < 0:
                break
        elif c == "," and depth == 0 and stop_at_comma:
            break
        i += 1
    return s[start:i].strip(), i


def split_top_level(s: str) -> list[str]:
    """Split a comma-separated list at commas that are not nested or quoted."""
    out = []
    i = 0
    while i < len(s):
        value, i = read_value(s, i)
        if value:
            out.append(value)
        i += 1
    return out


@dataclass
class HloInstruction:
    name: str
    opcode: str
    shape: Shape
    operands: list[str]
    attrs_text: str
    is_root: bool = False
    operand_text: str = ""

    def attr(self, key: str) -> str | None:
        """The raw text of attribute `key`, or None when absent."""
        text = self.attrs_text
        pos = 0
        needle = key + "="
        while True:
            j = text.find(needle, pos)
            if j < 0:
                return None
            if j == 0 or text[j - 2:j] == ", ":
                value, _ = read_value(text, j + len(needle))
                return value
            pos = j + 1

    def replica_groups(self) -> str | None:
        """Replica groups text; the mesh-axes form may hold a top-level `, device_ids=(...)`."""
        raw = self.attr("replica_groups")
        if raw and raw.startswith("mesh[") and not raw.endswith("}"):
            m = _MESH_GROUPS.search(self.attrs_text)
            return m.group(1) if m else raw
        return raw

    @cached_property
    def metadata(self) -> dict[str, str]:
        raw = self.attr("metadata")
        if not raw:
            return {}
        out = {}
        for k, v in _META_FIELD.findall(raw[1:-1]):
            out[k] = unquote(v) if v.startswith('"') else v
        return out

    @cached_property
    def backend_config(self) -> dict:
        raw = self.attr("backend_config")
        if not raw:
            return {}
        if raw.startswith('"'):
            raw = json.loads(raw)
        try:
            value = json.loads(raw)
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}

    def called(self, key: str) -> list[str]:
        """Names of computations referenced by attribute `key` (calls=, to_apply=, ...)."""
        raw = self.attr(key)
        if not raw:
            return []
        raw = raw.strip("{}")
        return [c.strip().lstrip("%") for c in raw.split(",") if c.strip()]

    def int_list(self, key: str) -> list[int]:
        raw = self.attr(key)
        if not raw:
            return []
        raw = raw.strip("{}")
        return [int(x) for x in raw.split(",") if x.strip()]


@dataclass
class HloComputation:
    name: str
    instructions: list[HloInstruction]
    is_entry: bool = False

    @cached_property
    def by_name(self) -> dict[str, HloInstruction]:
        return {i.name: i for i in self.instructions}

    @cached_property
    def root(self) -> HloInstruction:
        for ins in self.instructions:
            if ins.is_root:
                return ins
        return self.instructions[-1]

    @cached_property
    def users(self) -> dict[str, list[tuple[HloInstruction, int]]]:
        """Instruction name -> (user, operand position) pairs."""
        out: dict[str, list[tuple[HloInstruction, int]]] = {}
        for ins in self.instructions:
            for pos, o in enumerate(ins.operands):
                out.setdefault(o, []).append((ins, pos))
        return out

    @cached_property
    def parameters(self) -> dict[int, HloInstruction]:
        return {int(i.operand_text): i for i in self.instructions if i.opcode == "parameter"}


@dataclass
class HloModule:
    name: str
    computations: dict[str, HloComputation]
    entry: str
    header: dict[str, str] = field(default_factory=dict)
    stack_frames: dict[int, str] = field(default_factory=dict)
    wrapped_names: dict[str, str] = field(default_factory=dict)  # async start -> wrapped op
    # dynamic-update-slice fusions XLA's buffer assignment did not run in place (known only
    # from an HloProto dump: buffer_assignment.py); empty: every one taken as in place
    copied_updates: frozenset = frozenset()

    @property
    def entry_computation(self) -> HloComputation:
        return self.computations[self.entry]

    @property
    def num_partitions(self) -> int:
        return int(self.header.get("num_partitions", "1"))

    @property
    def replica_count(self) -> int:
        return int(self.header.get("replica_count", "1"))


def explicit_tuple_elements(comp: HloComputation) -> HloComputation:
    """Newer XLA (jax 0.11's) prints element k of a tuple-valued instruction `x` as the
    operand `%x#k` and no get-tuple-element at all. Each such reference becomes the explicit
    get-tuple-element it stands for, named `x#k` and placed right after `x`, so the module
    reads as older XLA writes it."""
    by_name = {i.name: i for i in comp.instructions}
    made: dict[str, list[HloInstruction]] = {}
    seen: set[str] = set()
    for ins in comp.instructions:
        for ref in ins.operands:
            base, sep, k = ref.rpartition("#")
            if not sep or ref in by_name or ref in seen or not k.isdigit():
                continue
            src = by_name.get(base)
            if src is None or int(k) >= len(src.shape.elements):
                continue
            seen.add(ref)
            made.setdefault(base, []).append(HloInstruction(
                ref, "get-tuple-element", src.shape.elements[int(k)], [base], f"index={k}",
                False, f"%{base}"))
    if not made:
        return comp
    out: list[HloInstruction] = []
    for ins in comp.instructions:
        out.append(ins)
        out.extend(made.get(ins.name, ()))
    return HloComputation(comp.name, out, comp.is_entry)


def parse_instruction(line: str) -> HloInstruction:
    s = line.strip()
    if "/*" in s:  # tuple shapes and operand lists carry `/*index=5*/` comments
        s = _COMMENT.sub("", s)
    is_root = s.startswith("ROOT ")
    if is_root:
        s = s[5:]
    eq = s.find(" = ")
    if eq < 0:
        raise FlintError(f"malformed HLO instruction: {line.strip()[:80]!r}")
    name = s[:eq].lstrip("%")
    i = eq + 3
    if s.startswith("(", i):  # tuple shape: up to its matching paren
        depth, j = 0, i
        while j < len(s):
            depth += {"(": 1, ")": -1}.get(s[j], 0)
            j += 1
            if depth == 0:
                break
        shape_text = s[i:j]
        i = j + 1
    else:
        j = s.find(" ", i)
        shape_text = s[i:j]
        i = j + 1
    p = s.find("(", i)
    if p < 0 or j < 0:
        raise FlintError(f"malformed HLO instruction: {line.strip()[:80]!r}")
    opcode = s[i:p]
    operand_text, q = read_value(s, p + 1, stop_at_comma=False)
    if q >= len(s) or s[q] != ")":
        raise FlintError(f"malformed HLO instruction (unbalanced operands): {s[:80]!r}")
    operands: list[str] = []
    if opcode not in ("constant", "parameter") and operand_text:
        parts = operand_text.split(", ") if "(" not in operand_text else split_top_level(operand_text)
        for part in parts:
            operands.append(part.rsplit(" ", 1)[-1].lstrip("%"))
    attrs = s[q + 1:].lstrip(", ")
    return HloInstruction(name, opcode, parse_shape(shape_text), operands, attrs, is_root, operand_text)


def _parse_stack_frames(tables: dict[str, list[str]]) -> dict[int, str]:
    def rows(title):
        out = {}
        for row in tables.get(title, []):
            k, _, v = row.partition(" ")
            out[int(k)] = v
        return out

    files = {k: unquote(v) for k, v in rows("FileNames").items()}
    funcs = {k: unquote(v) for k, v in rows("FunctionNames").items()}
    locs = {}
    for k, v in rows("FileLocations").items():
        f = dict(_META_FIELD.findall(v.strip("{}")))
        locs[k] = (f"{files.get(int(f.get('file_name_id', 0)), '?')}:{f.get('line', '?')}"
                   f" ({funcs.get(int(f.get('function_name_id', 0)), '?')})")
    frames = {}
    for k, v in rows("StackFrames").items():
        f = dict(_META_FIELD.findall(v.strip("{}")))
        frames[k] = locs.get(int(f.get("file_location_id", 0)), "?")
    return frames


def parse_module(text: str) -> HloModule:
    """Parse HLO module text (as printed by XLA) into an HloModule."""
    lines = text.splitlines()
    if not lines or not lines[0].startswith("HloModule "):
        raise FlintError("not an HLO module: text does not start with 'HloModule'")
    head = lines[0][len("HloModule "):]
    name, _, rest = head.partition(",")
    header = {}
    for part in split_top_level(rest):
        k, _, v = part.partition("=")
        header[k.strip()] = v.strip()
    computations: dict[str, HloComputation] = {}
    entry = None
    tables: dict[str, list[str]] = {}
    current: HloComputation | None = None
    table: list[str] | None = None
    wrapped: dict[str, str] = {}
    for lineno, line in enumerate(lines[1:], start=2):
        if current is not None:
            if line.startswith("}"):
                computations[current.name] = explicit_tuple_elements(current)
                current = None
            elif line.strip():
                try:
                    current.instructions.append(parse_instruction(line))
                except FlintError as e:
                    raise FlintError(f"line {lineno}: {e}") from None
            continue
        if not line.strip():
            table = None
            continue
        if line.startswith("// flint-async-wrapped:"):
            wrapped.update(p.split("=", 1) for p in line.split(":", 1)[1].split() if "=" in p)
            continue
        m = _COMPUTATION.match(line)
        if m:
            current = HloComputation(m.group(2), [], is_entry=bool(m.group(1)))
            if m.group(1):
                entry = m.group(2)
            table = None
        elif line[0].isalpha() and " " not in line.strip():
            table = tables.setdefault(line.strip(), [])
        elif table is not None:
            table.append(line.strip())
        else:
            raise FlintError(f"malformed HLO at line {lineno}: {line.strip()[:80]!r}")
    if current is not None:
        raise FlintError(f"malformed HLO: computation {current.name!r} is not closed")
    if entry is None:
        raise FlintError("malformed HLO: no ENTRY computation")
    return HloModule(name.strip(), computations, entry, header, _parse_stack_frames(tables),
                     wrapped)
