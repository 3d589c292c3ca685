"""`flint.virtual_mesh`: the mesh of the virtual cluster, with no devices, for code that
needs a mesh before Flint compiles anything.

Model code that annotates shardings at construction (Flax NNX `nnx.with_partitioning`,
`jax.sharding.reshard`, `NamedSharding(mesh, ...)` built from the current mesh) asks JAX
for the current mesh. Inside `with flint.virtual_mesh({"data": 512, "model": 8}) as mesh:`
that is an AbstractMesh of those axes (`jax.sharding.use_abstract_mesh`), so the model
builds abstractly (under `nnx.eval_shape` / `jax.eval_shape`) exactly as on the cluster;
`mesh.shape["data"]` and `mesh.size` size the batch. Flint's compile then binds the same
axis names to compile-only devices.
"""
from __future__ import annotations

import contextlib
import math

import jax
from jax.sharding import AbstractMesh, AxisType

from flint.cluster import parse_mesh


def abstract_mesh(mesh, devices: int | None = None) -> AbstractMesh:
    """An AbstractMesh of `mesh` (`{"data": 512, "model": 8}`, `"data=512,model=8"` or
    ((name, size), ...)); `devices` resolves a `-1` axis."""
    if isinstance(mesh, AbstractMesh):
        return mesh
    if isinstance(mesh, (tuple, list)):
        axes = tuple((str(n), int(s)) for n, s in mesh)
        parse_mesh(dict(axes), math.prod(s for _, s in axes))   # validates names and sizes
    else:
        if devices is None:
            sizes = mesh.values() if isinstance(mesh, dict) else (
                p.partition("=")[2] for p in str(mesh).split(","))
            devices = math.prod(int(s) for s in sizes if int(s) > 0)
        axes = parse_mesh(mesh, devices)
    return AbstractMesh(tuple(s for _, s in axes), tuple(n for n, _ in axes),
                        axis_types=(AxisType.Auto,) * len(axes))


@contextlib.contextmanager
def virtual_mesh(mesh, devices: int | None = None):
    """Context in which JAX's current mesh is the virtual cluster's (abstract) mesh."""
    am = abstract_mesh(mesh, devices)
    with jax.sharding.use_abstract_mesh(am), flax_linen_under_a_mesh():
        yield am


@contextlib.contextmanager
def flax_linen_under_a_mesh():
    """Flax Linen constrains a partitioned parameter to its spec whenever a mesh is
    current, also while DenseGeneral initializes it flattened to rank 2 (before the
    reshape to its rank-3 shape): "P(None, 'model', None) is only valid for values of
    rank at least 3". Under a virtual mesh that constraint is skipped for a value whose
    rank differs from its names (the parameter is constrained again once reshaped), so
    Linen models build as they do outside a mesh. Nothing changes if Flax is not loaded."""
    import sys

    meta = sys.modules.get("flax.core.meta")
    spmd = sys.modules.get("flax.linen.spmd")
    classes = [c for c in (getattr(meta, "Partitioned", None),
                           getattr(spmd, "LogicallyPartitioned", None)) if c is not None]
    saved = {c: c.__dict__["unbox"] for c in classes if "unbox" in c.__dict__}
    for cls, original in saved.items():
        cls.unbox = _rank_checked(original)
    try:
        yield
    finally:
        for cls, original in saved.items():
            cls.unbox = original


def _rank_checked(unbox):
    def checked(self, apply_constraint=True):
        names = getattr(self, "names", ())
        if apply_constraint and len(names) != getattr(self.value, "ndim", len(names)):
            apply_constraint = False
        return unbox(self, apply_constraint)
    return checked
