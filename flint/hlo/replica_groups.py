"""Replica groups in the three HLO text syntaxes, expanded to a [groups, size] array.

- explicit: `{{0,1},{2,3}}`; `{}` means one group of every participant.
- iota:     `[G,S]<=[d0,d1,...]` or `[G,S]<=[d0,d1,...]T(p0,p1,...)`: iota(prod d) reshaped to
            d, transposed by p, reshaped to [G,S] (xla/hlo/ir/collective_device_list.h,
            IotaReplicaGroupList).
- mesh axes: `mesh['a'=4,'b'=2] {'b'}` (optionally `, device_ids=(...)` before the braces and
  sub-axes `'a':(2)2`): a named device mesh and the axes the collective spans
  (xla/hlo/ir/replica_group.h, MeshAxesReplicaGroupList).
"""
from __future__ import annotations

import re

import numpy as np

from flint.errors import FlintError

_IOTA = re.compile(r"^\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?$")


def parse_replica_groups(text: str | None, num_devices: int) -> np.ndarray:
    """Expand replica-group text to an int array of shape [num_groups, group_size]."""
    text = (text or "").strip()
    if text in ("", "{}"):
        return np.arange(num_devices, dtype=np.int64).reshape(1, num_devices)
    m = _IOTA.match(text)
    if m:
        return _expand_iota(m)
    if text.startswith("{"):
        return _expand_explicit(text)
    if text.startswith("mesh["):
        return _expand_mesh_axes(text)
    raise FlintError(f"unrecognised replica_groups syntax {text[:60]!r}")


def _expand_iota(m: re.Match) -> np.ndarray:
    groups, size = int(m.group(1)), int(m.group(2))
    dims = [int(d) for d in m.group(3).split(",")]
    ids = np.arange(int(np.prod(dims)), dtype=np.int64).reshape(dims)
    if m.group(4):
        ids = ids.transpose([int(p) for p in m.group(4).split(",")])
    if ids.size != groups * size:
        raise FlintError(f"iota replica groups [{groups},{size}] do not cover {ids.size} ids")
    return ids.reshape(groups, size)


def _expand_explicit(text: str) -> np.ndarray:
    inner = text.strip()[1:-1].strip()
    rows = re.findall(r"\{([^{}]*)\}", inner)
    if not rows and inner:
        raise FlintError(f"malformed replica_groups {text[:60]!r}")
    groups = [[int(x) for x in r.split(",") if x.strip()] for r in rows]
    sizes = {len(g) for g in groups}
    if len(sizes) != 1:
        raise FlintError(f"replica groups of unequal sizes {sorted(sizes)} are not supported")
    return np.array(groups, dtype=np.int64)


_MESH_FORM = re.compile(r"^mesh\[(.*?)\](?:,\s*device_ids=\((.*?)\))?\s*\{(.*)\}$", re.S)
_MESH_AXIS = re.compile(r"'([^']*)'=(\d+)")
_AXIS_REF = re.compile(r"'([^']*)'(?::\((\d+)\)(\d+))?")


def _expand_mesh_axes(text: str) -> np.ndarray:
    """`mesh['a'=4,'b'=4] {'b'}`, with optional `, device_ids=(...)` and sub-axis refs
    `'a':(pre)size`. Groups are the devices that agree on every axis not referenced; inside
    a group the first listed reference varies slowest."""
    m = _MESH_FORM.match(text.strip())
    if not m:
        raise FlintError(f"malformed mesh-axes replica groups {text[:60]!r}")
    axes = [(name, int(size)) for name, size in _MESH_AXIS.findall(m.group(1))]
    names = [a for a, _ in axes]
    n = int(np.prod([s for _, s in axes]))
    devices = _mesh_device_order(m.group(2), n)
    refs = []
    for name, pre, size in _AXIS_REF.findall(m.group(3)):
        if name not in names:
            raise FlintError(f"mesh-axes replica groups reference unknown axis {name!r}")
        full = axes[names.index(name)][1]
        refs.append((names.index(name), int(pre) if pre else 1, int(size) if size else full))
    if not refs:
        raise FlintError(f"mesh-axes replica groups name no axis: {text[:60]!r}")
    # Split every mesh dim into sub-dims so that each reference is one whole sub-dim.
    dims: list[int] = []
    grouped: dict[int, int] = {}
    for d, (_, full) in enumerate(axes):
        mine = sorted((pre, size, i) for i, (dd, pre, size) in enumerate(refs) if dd == d)
        covered = 1
        for pre, size, i in mine:
            if pre % covered or full % (pre * size):
                raise FlintError(f"mesh sub-axis ({pre}){size} does not tile axis of size {full}")
            if pre != covered:
                dims.append(pre // covered)
            grouped[i] = len(dims)
            dims.append(size)
            covered = pre * size
        if covered != full:
            dims.append(full // covered)
    order = [grouped[i] for i in range(len(refs))]
    rest = [k for k in range(len(dims)) if k not in order]
    size = int(np.prod([dims[k] for k in order]))
    return devices.reshape(dims).transpose(rest + order).reshape(-1, size)


def _mesh_device_order(spec: str | None, n: int) -> np.ndarray:
    if not spec:
        return np.arange(n, dtype=np.int64)
    m = re.match(r"^\[([\d,]+)\](?:T\(([\d,]+)\))?$", spec.strip())
    if m:
        dims = [int(x) for x in m.group(1).split(",")]
        ids = np.arange(n, dtype=np.int64).reshape(dims)
        if m.group(2):
            ids = ids.transpose([int(x) for x in m.group(2).split(",")])
        return ids.reshape(-1)
    ids = np.array([int(x) for x in spec.split(",")], dtype=np.int64)
    if ids.size != n:
        raise FlintError(f"mesh device_ids list has {ids.size} ids for {n} devices")
    return ids


def parse_source_target_pairs(text: str | None) -> np.ndarray:
    """`{{0,1},{1,2}}` -> int array [num_pairs, 2]."""
    rows = re.findall(r"\{(\d+),(\d+)\}", text or "")
    return np.array(rows, dtype=np.int64).reshape(-1, 2)


def mesh_axes_spanned(groups: np.ndarray, mesh_axes: list[tuple[str, int]]) -> tuple[str, ...]:
    """Names of the mesh axes along which members of a group differ.

    Ranks are row-major positions in the device mesh (the order in which jit assigns
    partitions to `mesh.devices.flat`).
    """
    if not mesh_axes or groups.size == 0:
        return ()
    sizes = [s for _, s in mesh_axes]
    if groups.max() >= int(np.prod(sizes)):
        return ()
    coords = np.unravel_index(groups, sizes)
    spanned = []
    for (name, _), c in zip(mesh_axes, coords):
        if np.any(c != c[:, :1]):
            spanned.append(name)
    return tuple(spanned)
