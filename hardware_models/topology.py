"""Where ranks sit physically, and which levels of the network a group of ranks spans.

Two shapes of cluster:
- switched (GPUs, CPUs): `devices_per_node` per host, `scale_up_domain` devices behind one
  NVLink/NVSwitch (or Infinity Fabric) domain, then a scale-out fat-tree whose leaf groups
  (`leaf_group` devices, e.g. a DGX SuperPOD scalable unit) are non-blocking; traffic that
  leaves a leaf group shares the spine at `oversubscription`:1. In a rail-optimized fabric
  NCCL keeps traffic on rails (PXN), so the same two numbers describe it.
- torus (TPUs): slices of ICI-connected chips shaped AxB(xC), joined over the data-center
  network (DCN) when a job spans several slices (Multislice). A dimension wraps around when
  it spans the whole pod dimension, or (3-D tori, whose 4x4x4 cubes are joined by optical
  circuit switches) when it is a multiple of 4.

Ranks are mesh positions (the SPMD partition ids XLA uses). They fill nodes, domains and
slices in order, x-fastest inside a slice: the layout jax's mesh utilities produce for a mesh
whose axes follow the physical ones.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from flint.errors import FlintError
from flint.graph import Communicator
from flint.hardware_models.spec import HardwareSpec, parse_torus_shape


@dataclass(frozen=True)
class Topology:
    devices: int
    devices_per_node: int
    scale_up_domain: int                 # devices per scale-up domain (a torus slice on TPUs)
    leaf_group: int                      # devices per non-blocking leaf group (0: the whole fabric)
    oversubscription: float
    torus: tuple[int, ...] = ()          # slice shape, x first; () for switched clusters
    wraps: tuple[bool, ...] = ()

    @property
    def is_torus(self) -> bool:
        return bool(self.torus)

    def coords(self, ranks) -> np.ndarray:
        """Torus coordinates of ranks in their slice, one row per dimension (x fastest,
        the order ranks fill a slice in)."""
        local = np.asarray(ranks) % self.scale_up_domain
        return np.stack(np.unravel_index(local, self.torus[::-1]))[::-1]

    def describe(self) -> str:
        if self.is_torus:
            slices = self.devices // self.scale_up_domain
            ring = "x".join(f"{d}{'(wrap)' if w else ''}" for d, w in zip(self.torus, self.wraps))
            return f"{slices} x torus slice {ring} over DCN" if slices > 1 else f"torus {ring}"
        nodes = math.ceil(self.devices / self.devices_per_node)
        leaf = f", leaf groups of {self.leaf_group}" if self.leaf_group else ""
        return (f"{nodes} node(s) x {min(self.devices, self.devices_per_node)} devices, "
                f"scale-up domain {self.scale_up_domain}{leaf}, "
                f"oversubscription {self.oversubscription:g}:1")


@dataclass(frozen=True)
class Placement:
    """How the first group of a communicator lies on the topology (SPMD groups are alike)."""
    size: int                            # ranks in a group (p)
    domains: int                         # scale-up domains / slices the group touches (k)
    per_domain: int                      # ranks of the group in each domain (m)
    leaves: int = 1                      # leaf groups of the fat-tree it touches
    grid: tuple[tuple[int, bool], ...] = ()   # torus: (extent, wraps) per spanned dimension


def topology_for(spec: HardwareSpec, devices: int) -> Topology:
    """The physical layout of `devices` devices of `spec`; a layout that cannot hold them is
    a FlintError naming the figure at fault."""
    per_node, domain = spec.devices_per_node, spec.scale_up_domain
    if spec.torus or spec.torus_slice:
        return _torus_topology(spec, devices)
    if devices > per_node and devices % per_node:
        raise FlintError(f"{devices} devices do not fill whole {spec.name} nodes of {per_node} "
                         f"devices (use a multiple of {per_node}, or --set devices_per_node=N)")
    if domain % per_node and per_node % domain:
        raise FlintError(f"{spec.name}: scale_up_domain {domain} and devices_per_node "
                         f"{per_node} do not nest (one must divide the other)")
    return Topology(devices, per_node, domain, spec.leaf_group, spec.oversubscription)


def _torus_topology(spec: HardwareSpec, devices: int) -> Topology:
    biggest = parse_torus_shape(spec.torus) if spec.torus else ()
    if spec.torus_slice:
        shape = parse_torus_shape(spec.torus_slice)
        chips = math.prod(shape)
        if devices % chips:
            raise FlintError(f"torus slice {spec.torus_slice} ({chips} chips) does not fit "
                             f"{devices} devices (not a multiple)")
    else:
        shape = _slice_shape(devices, biggest, spec.name)
    chips = math.prod(shape)
    three_d = len(shape) == 3
    full = biggest or shape
    wraps = tuple(d > 2 and (d == full[i] or (three_d and d % 4 == 0))
                  for i, d in enumerate(shape))
    return Topology(devices, spec.devices_per_node, chips, 0, spec.oversubscription,
                    shape, wraps)


def _slice_shape(devices: int, biggest: tuple[int, ...], name: str) -> tuple[int, ...]:
    """The most cubic slice that holds `devices` chips; beyond the largest slice, the largest
    equal slices that tile the job (Multislice)."""
    capacity = math.prod(biggest)
    for slices in range(max(1, math.ceil(devices / capacity)), devices + 1):
        if devices % slices:
            continue
        shape = _most_cubic(devices // slices, biggest)
        if shape:
            return shape
    raise FlintError(f"{devices} devices do not fit {name} torus slices of at most "
                     f"{'x'.join(map(str, biggest))}")


def most_cubic_slice(spec: HardwareSpec, chips: int) -> str:
    """The slice of `chips` chips a job is given on `spec`'s torus, as `AxBxC` (the
    `--set torus=` what-if): the most cubic shape of whole cubes/boards, as Cloud TPU's
    accelerator types (v5p-128: 4x4x4) are."""
    bounds = parse_torus_shape(spec.torus) if spec.torus else ()
    shape = _most_cubic(chips, bounds) if bounds else None
    if not shape:
        raise FlintError(f"{chips} chips are no {spec.name} torus slice")
    return "x".join(map(str, shape))


def _most_cubic(chips: int, bounds: tuple[int, ...]) -> tuple[int, ...] | None:
    """Cloud TPU slices have dimensions of 1, 2 or a multiple of 4 (whole cubes/boards)."""
    best = None
    for shape in _factorizations(chips, len(bounds)):
        if all(d <= b and (d <= 2 or d % 4 == 0) for d, b in zip(shape, bounds)):
            key = (max(shape) / min(shape), shape)
            best = min(best, key) if best else key
    return best[1] if best else None


def _factorizations(n: int, parts: int):
    if parts == 1:
        yield (n,)
        return
    for d in range(1, n + 1):
        if n % d == 0:
            for rest in _factorizations(n // d, parts - 1):
                yield (d,) + rest


@lru_cache(maxsize=4096)
def place(comm: Communicator, topo: Topology) -> Placement:
    """Expanding groups is O(devices): done once per communicator (both are frozen)."""
    groups = comm.groups()
    if comm.kind == "pairs" or groups.size == 0:
        return Placement(2, 1, 2)
    first = np.asarray(groups[0], dtype=np.int64)
    p = int(len(first))
    domains = len(np.unique(first // topo.scale_up_domain))
    leaves = len(np.unique(first // topo.leaf_group)) if topo.leaf_group else 1
    grid: tuple = ()
    if topo.is_torus:
        grid = _grid(first % topo.scale_up_domain, topo)
    return Placement(p, domains, max(1, p // domains), leaves, grid)


def _grid(members: np.ndarray, topo: Topology) -> tuple[tuple[int, bool], ...]:
    """Extents of the sub-grid the group's members in one slice form, per torus dimension;
    () when they do not form a contiguous sub-grid (the network then uses one link)."""
    extents = []
    for dim, values in enumerate(topo.coords(np.unique(members))):
        distinct = np.unique(values)
        if distinct[-1] - distinct[0] + 1 != len(distinct):
            return ()
        if len(distinct) > 1:
            wraps = len(distinct) == topo.torus[dim] and topo.wraps[dim]
            extents.append((int(len(distinct)), bool(wraps)))
    if math.prod(e for e, _ in extents) != len(np.unique(members)):
        return ()
    return tuple(extents)
