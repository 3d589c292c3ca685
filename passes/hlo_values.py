"""How the HLO lowering tracks values: each instruction's value is its producers' node ids,
a leaf per array (a tuple of ids) nested as the instruction's shape nests; inside a while
body a loop-state element stands for the producers of its initial value (Carried) until
the body's own nodes replace it."""
from __future__ import annotations

from dataclasses import dataclass

from flint.hlo.shapes import Shape


@dataclass(frozen=True)
class Carried:
    """A loop-state element as seen inside the body: the producers of its initial value."""

    loop: int
    index: int
    init: tuple


def ints(leaf: tuple) -> set[int]:
    """Node ids a leaf stands for, seeing through outer loops' carried values."""
    out: set[int] = set()
    stack = [leaf]
    while stack:
        for p in stack.pop():
            if isinstance(p, int):
                out.add(p)
            else:
                stack.append(p.init)
    return out


def leaves_of(node_id: int, shape: Shape):
    if shape.is_tuple:
        return [leaves_of(node_id, e) for e in shape.elements]
    return (node_id,)


def structure(value, shape: Shape):
    """Coerce a value to the nesting of `shape` (a leaf feeding a tuple feeds every part)."""
    if not shape.is_tuple:
        return value if isinstance(value, tuple) else tuple(flat_producers(value))
    if isinstance(value, list) and len(value) == len(shape.elements):
        return [structure(v, s) for v, s in zip(value, shape.elements)]
    leaf = value if isinstance(value, tuple) else tuple(flat_producers(value))
    return [structure(leaf, s) for s in shape.elements]


def flat_producers(value) -> list:
    if isinstance(value, tuple):
        return list(value)
    return [p for v in value for p in flat_producers(v)]


def flatten(value) -> list[tuple]:
    if isinstance(value, tuple):
        return [value]
    return [leaf for v in value for leaf in flatten(v)]


def rebuild(value, leaves):
    if isinstance(value, tuple):
        return next(leaves)
    return [rebuild(v, leaves) for v in value]


def substitute(value, loop_id: int):
    """Outside the loop, a pass-through state element is its initial value again."""
    if isinstance(value, list):
        return [substitute(v, loop_id) for v in value]
    out: list = []
    for p in value:
        if isinstance(p, Carried) and p.loop == loop_id:
            out.extend(p.init)
        else:
            out.append(p)
    return tuple(out)
