"""Rebuild a communicator for a mesh whose axes changed size (used by `passes.rescale`).

Replica groups: see `passes.rescale_groups` (the sub-mesh they form, resized with the
outermost block of each axis absorbing the change). Source-target pairs are rebuilt when
they stay inside axes that keep their size, shift along one axis, or transpose the mesh
(the resharding permutation XLA emits when a tensor dim moves between axes); anything else
is a FlintError.
"""
from __future__ import annotations

import itertools
import math

import numpy as np

from flint.errors import FlintError
from flint.graph import Communicator
from flint.hlo.replica_groups import mesh_axes_spanned
from flint.passes.rescale_groups import describe

Mesh = tuple[tuple[str, int], ...]


def rebuild(comm: Communicator, old: Mesh, new: Mesh) -> Communicator:
    """`comm` re-expressed on the mesh `new` (same axis names as `old`, sizes may differ)."""
    if comm.kind == "pairs":
        return _rebuild_pairs(comm, old, new)
    return _rebuild_groups(comm, old, new)


# --- replica groups ------------------------------------------------------------------
def _rebuild_groups(comm: Communicator, old: Mesh, new: Mesh) -> Communicator:
    groups = comm.groups()
    sizes, new_sizes = [s for _, s in old], [s for _, s in new]
    if groups.size == 0 or groups.max() >= math.prod(sizes):
        raise FlintError(f"communicator {comm.id} names ranks outside the {math.prod(sizes)}-"
                         f"device mesh; rescale needs groups placed on the mesh")
    sub = describe(groups, sizes, comm.id)
    listed = {tuple(r) for r in groups.tolist()}
    regenerated = {tuple(r) for r in sub.groups().tolist()}
    if not listed <= regenerated:
        raise FlintError(f"communicator {comm.id} ({comm.spec[:40]}) is not a regular "
                         f"sub-mesh of {_show(old)}; rescale cannot resize it")
    sub = sub.resized(sizes, new_sizes, [n for n, _ in old], comm.id)
    out = sub.groups()
    if listed == regenerated:
        spec = sub.iota()
    else:
        # Only some groups listed (a Chakra rank's own process group): keep those groups.
        out = _rows_containing(out, [_moved(r[0], sizes, new_sizes, comm.id)
                                     for r in groups.tolist()])
        spec = "{" + ",".join("{" + ",".join(map(str, r)) + "}" for r in out.tolist()) + "}"
    return Communicator(comm.id, "groups", spec, math.prod(new_sizes), int(out.shape[1]),
                        int(out.shape[0]), mesh_axes_spanned(out, list(new)))


def _moved(rank: int, old: list[int], new: list[int], cid: int) -> int:
    """The rank at the same mesh coordinates on the new mesh."""
    c = np.unravel_index(rank, old)
    if any(int(x) >= s for x, s in zip(c, new)):
        raise FlintError(f"communicator {cid} holds rank {rank}, which the "
                         f"{math.prod(new)}-device mesh does not have")
    return int(np.ravel_multi_index(c, new))


def _rows_containing(groups: np.ndarray, ranks: list[int]) -> np.ndarray:
    rows = [int(np.nonzero((groups == r).any(axis=1))[0][0]) for r in ranks]
    return groups[sorted(set(rows), key=rows.index)]


def _show(mesh: Mesh) -> str:
    return ",".join(f"{n}={s}" for n, s in mesh)


# --- source-target pairs ---------------------------------------------------------------
def _rebuild_pairs(comm: Communicator, old: Mesh, new: Mesh) -> Communicator:
    pairs = comm.groups()
    sizes, new_sizes = [s for _, s in old], [s for _, s in new]
    n_old, n_new = math.prod(sizes), math.prod(new_sizes)
    if pairs.size and pairs.max() >= n_old:
        raise FlintError(f"communicator {comm.id} names ranks outside the {n_old}-device mesh")
    if not len(pairs):
        return Communicator(comm.id, "pairs", "{}", n_new, 2, 0, ())
    out = None
    for build in (_local_pairs, _shifted_pairs, _transposed_pairs):
        out = build(pairs, sizes, new_sizes)
        if out is not None:
            break
    if out is None:
        raise FlintError(f"communicator {comm.id}: its source-target pairs are neither "
                         f"inside mesh axes that keep their size, a shift along one axis, "
                         f"nor a transpose of the mesh; rescale cannot place them on "
                         f"{n_new} devices")
    out = out[np.lexsort((out[:, 1], out[:, 0]))]
    spec = "{" + ",".join(f"{{{s},{t}}}" for s, t in out.tolist()) + "}"
    return Communicator(comm.id, "pairs", spec, n_new, 2, int(len(out)),
                        mesh_axes_spanned(out, list(new)))


def _local_pairs(pairs, sizes, new_sizes):
    """Pairs that never cross an axis that changes size, the same pattern at every
    coordinate of those axes: copy the pattern to every new coordinate."""
    changing = [a for a, (o, n) in enumerate(zip(sizes, new_sizes)) if o != n]
    src, dst = np.unravel_index(pairs[:, 0], sizes), np.unravel_index(pairs[:, 1], sizes)
    if any((src[a] != dst[a]).any() for a in changing):
        return None
    keep = [a for a in range(len(sizes)) if a not in changing]
    patterns: dict[tuple, set] = {}
    for i in range(len(pairs)):
        where = tuple(int(src[a][i]) for a in changing)
        patterns.setdefault(where, set()).add(
            (tuple(int(src[a][i]) for a in keep), tuple(int(dst[a][i]) for a in keep)))
    if len(patterns) != math.prod(sizes[a] for a in changing) or \
            len({frozenset(p) for p in patterns.values()}) != 1:
        return None
    pattern = next(iter(patterns.values()))
    out = []
    for where in itertools.product(*(range(new_sizes[a]) for a in changing)):
        for s_keep, d_keep in pattern:
            s, d = [0] * len(sizes), [0] * len(sizes)
            for a, x in zip(changing, where):
                s[a] = d[a] = x
            for a, x, y in zip(keep, s_keep, d_keep):
                s[a], d[a] = x, y
            out.append((int(np.ravel_multi_index(s, new_sizes)),
                        int(np.ravel_multi_index(d, new_sizes))))
    return np.array(out, dtype=np.int64).reshape(-1, 2)


def _shifted_pairs(pairs, sizes, new_sizes):
    """Every rank sends to the rank `delta` further along one axis (with or without
    wrap-around), e.g. a ring or a pipeline hand-off: the same shift on the new mesh."""
    src, dst = np.unravel_index(pairs[:, 0], sizes), np.unravel_index(pairs[:, 1], sizes)
    moved = [a for a in range(len(sizes)) if (src[a] != dst[a]).any()]
    if len(moved) != 1:
        return None
    a = moved[0]
    raw = dst[a] - src[a]
    for delta, wrap in ((int(raw[0]), False), (int(raw[0] % sizes[a]), True)):
        if wrap and delta > sizes[a] // 2:
            delta -= sizes[a]
        if _shift(sizes, a, delta, wrap) == {tuple(p) for p in pairs.tolist()}:
            return np.array(sorted(_shift(new_sizes, a, delta, wrap)), dtype=np.int64)
    return None


def _shift(sizes, a, delta, wrap) -> set:
    ranks = np.arange(math.prod(sizes))
    c = list(np.unravel_index(ranks, sizes))
    t = c[a] + delta
    keep = np.ones(len(ranks), bool) if wrap else (t >= 0) & (t < sizes[a])
    c[a] = t % sizes[a]
    targets = np.ravel_multi_index(c, sizes)
    return set(zip(ranks[keep].tolist(), targets[keep].tolist()))


def _transposed_pairs(pairs, sizes, new_sizes):
    """Rank i sends to position i of the mesh transposed (a resharding that swaps which
    axis a tensor dim is split over): the same transpose of the new mesh."""
    n = math.prod(sizes)
    if len(pairs) != n or (np.sort(pairs[:, 0]) != np.arange(n)).any():
        return None
    target = np.empty(n, dtype=np.int64)
    target[pairs[:, 0]] = pairs[:, 1]
    for perm in itertools.permutations(range(len(sizes))):
        if list(perm) == sorted(perm):
            continue
        if (np.arange(n).reshape(sizes).transpose(perm).ravel() == target).all():
            m = math.prod(new_sizes)
            moved = np.arange(m).reshape(new_sizes).transpose(perm).ravel()
            return np.stack([np.arange(m), moved], axis=1)
    return None
