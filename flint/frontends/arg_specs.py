"""Turn a step's arguments into ShapeDtypeStructs sharded over the virtual mesh.

A leaf's PartitionSpec comes from, in order: `in_specs` (a pytree prefix of the arguments),
`rules` ((regex, PartitionSpec) pairs searched in the leaf's path `argname/key/...`, e.g.
`params/layers/wq`, first match wins), the leaf's own NamedSharding (its spec is rebound to the virtual mesh), replicated.
"""
from __future__ import annotations

import math
import re

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from flint.errors import FlintError


def _is_spec(x) -> bool:
    return x is None or isinstance(x, P)


def _key(path) -> str:
    return "/".join(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k))))
                    for k in path)


def argument_names(fn, count: int) -> list[str]:
    """The step's parameter names (rules match `params/layers/wq`), else arg0, arg1, ..."""
    import inspect

    base = getattr(fn, "__wrapped__", fn)
    try:
        params = [p.name for p in inspect.signature(base).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    return [params[i] if i < len(params) else f"arg{i}" for i in range(count)]


def abstract_args(args: tuple, mesh: Mesh, in_specs=None, rules=(), static_argnums=(),
                  names: list[str] | None = None) -> tuple:
    """ShapeDtypeStructs with NamedShardings; rule keys are `argname/key/path`."""
    rules_rx = [(re.compile(r), s) for r, s in (rules or ())]
    names = names or [f"arg{i}" for i in range(len(args))]
    out = []
    for i, arg in enumerate(args):
        if i in static_argnums:
            out.append(arg)
            continue
        prefix = None
        if in_specs is not None:
            if not isinstance(in_specs, (tuple, list)) or len(in_specs) != len(args):
                raise FlintError(f"in_specs must be a tuple with one entry per argument "
                                 f"({len(args)}), got {type(in_specs).__name__}")
            prefix = in_specs[i]
        out.append(_one_arg(arg, names[i], prefix, rules_rx, mesh))
    return tuple(out)


def _one_arg(arg, name: str, prefix, rules_rx, mesh: Mesh):
    if prefix is not None:
        try:
            spec_tree = jax.tree.map(lambda s, sub: jax.tree.map(lambda _: s, sub), prefix, arg,
                                     is_leaf=_is_spec)
        except ValueError as e:
            raise FlintError(f"in_specs for {name} do not match its structure: "
                             f"{str(e).splitlines()[0]}") from None
        specs = jax.tree.leaves(spec_tree, is_leaf=_is_spec)
    else:
        specs = None
    leaves, treedef = jax.tree_util.tree_flatten_with_path(arg)
    structs = []
    for j, (path, leaf) in enumerate(leaves):
        key = "/".join(k for k in (name, _key(path)) if k)
        spec = specs[j] if specs is not None else _rule_spec(key, leaf, rules_rx)
        structs.append(_struct(leaf, spec or P(), key, mesh))
    return jax.tree_util.tree_unflatten(treedef, structs)


def _rule_spec(key: str, leaf, rules_rx):
    for rx, spec in rules_rx:
        if rx.search(key):
            return spec
    sharding = getattr(leaf, "sharding", None)
    if isinstance(sharding, NamedSharding):
        return sharding.spec
    return P()


def _struct(leaf, spec: P, where: str, mesh: Mesh) -> jax.ShapeDtypeStruct:
    shape = tuple(getattr(leaf, "shape", ()))
    try:
        dtype = leaf.dtype if hasattr(leaf, "dtype") else jax.numpy.result_type(leaf)
    except TypeError:
        raise FlintError(f"argument {where} is not an array or ShapeDtypeStruct "
                         f"({type(leaf).__name__})") from None
    if len(spec) > len(shape):
        raise FlintError(f"partition spec {spec} of {where} has more entries than its "
                         f"rank-{len(shape)} shape {shape}")
    sizes = dict(zip(mesh.axis_names, mesh.devices.shape))
    for dim, entry in zip(shape, spec):
        names = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        for n in names:
            if n not in sizes:
                raise FlintError(f"partition spec {spec} of {where} names mesh axis {n!r}, "
                                 f"which is not in the mesh ({', '.join(mesh.axis_names)})")
        parts = math.prod(sizes[n] for n in names)
        if dim % parts:
            raise FlintError(f"{where}: dimension of size {dim} cannot be split {parts} ways "
                             f"over mesh axes {'+'.join(names)} (spec {spec})")
    return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, spec))
