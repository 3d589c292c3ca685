"""Replica groups as a sub-mesh, and that sub-mesh on a resized mesh (for
`passes.rescale`).

A replica-group list XLA writes splits each mesh axis into mixed-radix digits, some of
which a group spans (its members take every value of them) while the others pick the
group: `{{0,1,4,5},{2,3,6,7}}` on an axis of 8 spans the digits of weight 4 and 1 and is
picked by the digit of weight 2. That is the iota form `[G,S]<=[dims]T(perm)` with the
picking digits first and the spanned ones last, in the orders in which the list varies
them. Digits next to each other on the axis and in that order merge into one block.

Resizing an axis: its outermost block absorbs the change and the blocks inside it keep
their sizes, so a tensor-parallel block of 8 inside a flattened `ranks` axis stays 8 wide
while data-parallel groups (spanning the outer block, ranks 8 apart) grow. The
description is checked by regenerating the original list from it: an irregular list is a
FlintError, never a guess.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from flint.cluster import prime_factors
from flint.errors import FlintError


@dataclass(frozen=True)
class Block:
    axis: int
    size: int
    spanned: bool


@dataclass(frozen=True)
class SubMesh:
    """Blocks in mesh order (major to minor) and the iota transpose: the picking blocks
    (slowest first), then the spanned ones (slowest first)."""

    blocks: tuple[Block, ...]
    perm: tuple[int, ...]

    def groups(self) -> np.ndarray:
        n = math.prod(b.size for b in self.blocks)
        size = math.prod(b.size for b in self.blocks if b.spanned)
        ids = np.arange(n, dtype=np.int64).reshape([b.size for b in self.blocks] or [1])
        return ids.transpose(self.perm or (0,)).reshape(n // size, size)

    def iota(self) -> str:
        n = math.prod(b.size for b in self.blocks)
        size = math.prod(b.size for b in self.blocks if b.spanned)
        head = f"[{n // size},{size}]<="
        if list(self.perm) == sorted(self.perm):   # no transpose: XLA writes the flat iota
            return f"{head}[{n}]"
        return (f"{head}[{','.join(str(b.size) for b in self.blocks)}]"
                f"T({','.join(map(str, self.perm))})")

    def resized(self, old: list[int], new: list[int], names: list[str], cid: int) -> "SubMesh":
        blocks, perm = list(self.blocks), list(self.perm)
        for a, (s, s2) in enumerate(zip(old, new)):
            if s == s2:
                continue
            mine = [i for i, b in enumerate(blocks) if b.axis == a]
            if not mine:     # an axis of size 1 grows: a new picking block
                at = next((i for i, b in enumerate(blocks) if b.axis > a), len(blocks))
                blocks.insert(at, Block(a, s2, False))
                perm = [at] + [p + (p >= at) for p in perm]
                continue
            outer = blocks[mine[0]]
            if (outer.size * s2) % s:
                inner = s // outer.size
                raise FlintError(f"cannot resize mesh axis {names[a]!r} from {s} to {s2}: "
                                 f"communicator {cid} needs blocks of {inner} along it")
            blocks[mine[0]] = replace(outer, size=outer.size * s2 // s)
        keep = [i for i, b in enumerate(blocks) if b.size > 1]
        index = {i: k for k, i in enumerate(keep)}
        return SubMesh(tuple(blocks[i] for i in keep),
                       tuple(index[p] for p in perm if p in index))


def describe(groups: np.ndarray, sizes: list[int], cid: int) -> SubMesh:
    """The sub-mesh whose groups include `groups` (FlintError when there is none)."""
    coords = np.unravel_index(groups, sizes)
    digits: list[Block] = []
    member_vals, row_vals = [], []
    for a, s in enumerate(sizes):
        radices = _radices(coords[a][0], s)
        if radices is None:
            raise FlintError(f"communicator {cid}: its groups do not form a regular "
                             f"sub-mesh along mesh axis {a}; rescale cannot resize them")
        weight = s
        for r, spanned in radices:
            weight //= r
            digits.append(Block(a, r, spanned))
            member_vals.append(coords[a][0] // weight % r)
            row_vals.append(coords[a][:, 0] // weight % r)
    rows = _slowest_first([i for i, d in enumerate(digits) if not d.spanned], row_vals)
    members = _slowest_first([i for i, d in enumerate(digits) if d.spanned], member_vals)
    return _merged(digits, rows + members)


def _radices(values: np.ndarray, size: int):
    """[(radix, spanned)] major to minor: prime digits of the axis such that `values`
    (one group's coordinates along it) are every combination of the spanned digits."""
    distinct = np.unique(values)
    for order in _orderings(prime_factors(size)):
        weights = [math.prod(order[i + 1:]) for i in range(len(order))]
        spanned = [len(np.unique(distinct // w % r)) for r, w in zip(order, weights)]
        if all(k in (1, r) for k, r in zip(spanned, order)) and \
                len(distinct) == math.prod(k for k in spanned):
            return [(r, k > 1) for r, k in zip(order, spanned)]
    return None


def _orderings(items: list[int]):
    """Distinct orderings of a multiset (one for a power of two)."""
    if not items:
        yield ()
        return
    for first in sorted(set(items)):
        rest = list(items)
        rest.remove(first)
        for tail in _orderings(rest):
            yield (first,) + tail


def _slowest_first(indices: list[int], values: list[np.ndarray]) -> list[int]:
    """Sorted by the first position at which each one's values leave their first value,
    latest first (never: slowest of all, in mesh order)."""
    def first_change(i):
        moved = np.nonzero(values[i] != values[i][0])[0]
        return -(int(moved[0]) if len(moved) else len(values[i]) + 1)

    return sorted(indices, key=first_change)


def _merged(digits: list[Block], perm: list[int]) -> SubMesh:
    """Merge digits adjacent on their axis and in `perm`, in order, of the same role."""
    runs: list[list[int]] = []
    for p in perm:
        last = runs[-1][-1] if runs else None
        if last is not None and p == last + 1 and digits[p].axis == digits[last].axis \
                and digits[p].spanned == digits[last].spanned:
            runs[-1].append(p)
        else:
            runs.append([p])
    runs_in_layout = sorted(runs, key=lambda r: r[0])
    blocks = tuple(Block(digits[r[0]].axis, math.prod(digits[i].size for i in r),
                         digits[r[0]].spanned) for r in runs_in_layout)
    return SubMesh(blocks, tuple(runs_in_layout.index(r) for r in runs))
