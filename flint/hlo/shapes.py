"""HLO shapes: parse `bf16[8,128]{1,0}` and tuples of them; element sizes per dtype."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import cached_property

from flint.errors import FlintError

# Bits per element of every XLA primitive type (xla/xla_data.proto PrimitiveType).
DTYPE_BITS = {
    "pred": 8, "s2": 2, "u2": 2, "s4": 4, "u4": 4, "s8": 8, "u8": 8,
    "s16": 16, "u16": 16, "s32": 32, "u32": 32, "s64": 64, "u64": 64,
    "f16": 16, "bf16": 16, "f32": 32, "f64": 64, "c64": 64, "c128": 128,
    "f8e5m2": 8, "f8e4m3fn": 8, "f8e4m3b11fnuz": 8, "f8e5m2fnuz": 8, "f8e4m3fnuz": 8,
    "f8e4m3": 8, "f8e3m4": 8, "f8e8m0fnu": 8, "f4e2m1fn": 4, "f6e2m3fn": 6, "f6e3m2fn": 6,
    "token": 0, "opaque": 0,
}

_ARRAY = re.compile(r"([a-z][a-z0-9]*)\[([^\]]*)\]")


@dataclass(frozen=True)
class Shape:
    """An array shape (dtype + dims) or a tuple of shapes (dtype == "tuple")."""

    dtype: str
    dims: tuple[int, ...] = ()
    elements: tuple["Shape", ...] = ()

    @property
    def is_tuple(self) -> bool:
        return self.dtype == "tuple"

    @property
    def num_elements(self) -> int:
        return math.prod(self.dims)

    @cached_property     # shapes are cached and immutable: size each once
    def nbytes(self) -> int:
        if self.is_tuple:
            return sum(e.nbytes for e in self.elements)
        return (self.num_elements * DTYPE_BITS[self.dtype] + 7) // 8

    def leaves(self) -> list["Shape"]:
        if not self.is_tuple:
            return [self]
        out: list[Shape] = []
        for e in self.elements:
            out.extend(e.leaves())
        return out

    def __str__(self) -> str:
        if self.is_tuple:
            return "(" + ", ".join(str(e) for e in self.elements) + ")"
        return f"{self.dtype}[{','.join(str(d) for d in self.dims)}]"


_CACHE: dict[str, Shape] = {}


def parse_shape(text: str) -> Shape:
    """Parse an HLO shape string; layouts (`{1,0:T(8,128)}`) are ignored."""
    hit = _CACHE.get(text)
    if hit is not None:
        return hit
    shape, end = _parse(text.strip(), 0)
    _CACHE[text] = shape
    return shape


def shapes_bytes(texts) -> int:
    """Total bytes of a list of shape strings (a node's outputs)."""
    return sum(parse_shape(t).nbytes for t in texts)


def _parse(s: str, i: int) -> tuple[Shape, int]:
    if s.startswith("(", i):
        elems: list[Shape] = []
        i += 1
        while i < len(s) and s[i] != ")":
            elem, i = _parse(s, i)
            elems.append(elem)
            while i < len(s) and s[i] in ", ":
                i += 1
        return Shape("tuple", (), tuple(elems)), i + 1
    m = _ARRAY.match(s, i)
    if not m or m.group(1) not in DTYPE_BITS:
        raise FlintError(f"malformed HLO shape {s[i:i + 40]!r}")
    dims_text = m.group(2)
    # Dynamic dims print as `<=8`; the bound is what memory is sized by.
    dims = tuple(int(d.lstrip("<=?")) for d in dims_text.split(",")) if dims_text else ()
    i = m.end()
    if s.startswith("{", i):  # layout
        depth = 0
        while i < len(s):
            c = s[i]
            depth += c == "{"
            depth -= c == "}"
            i += 1
            if depth == 0:
                break
    return Shape(m.group(1), dims), i
