"""Turn a step's arguments into ShapeDtypeStructs sharded over the virtual mesh.

A leaf's PartitionSpec comes from, in order: `in_specs` (a pytree prefix of the arguments),
the step's own `jax.jit(in_shardings=...)` (their specs rebound to the virtual mesh; a None
there falls through), `rules` ((regex, PartitionSpec) pairs searched in the leaf's path
`argname/key/...`, e.g. `params/layers/wq`, first match wins), the leaf's own NamedSharding
(its spec is rebound to the virtual mesh), replicated.

Leaves that are not arrays (an equinox module's functions, Python values) are not traced:
the step is closed over them (flint.frontends.static_leaves).

Where each spec came from is recorded per leaf (flint.frontends.sharding_report), since a
leaf that silently stays replicated (a forgotten batch spec) multiplies the step's work.
"""
from __future__ import annotations

import math
import re

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from flint.errors import FlintError
from flint.frontends.static_leaves import is_array


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
                  names: list[str] | None = None, jit_specs=None, report=None) -> tuple:
    """ShapeDtypeStructs with NamedShardings; rule keys are `argname/key/path`.
    `jit_specs`: the step's own jit in_shardings as specs (a prefix, like in_specs).
    `report`: a list that receives one (key, leaf struct, source) row per array leaf and,
    last, ("rules-unmatched", [regex, ...], None)."""
    rules_rx = [(re.compile(r), s) for r, s in (rules or ())]
    used: set[int] = set()
    names = names or [f"arg{i}" for i in range(len(args))]
    out = []
    for i, arg in enumerate(args):
        if i in static_argnums:
            out.append(arg)
            continue
        prefix, source = None, "in_specs"
        if in_specs is not None:
            if not isinstance(in_specs, (tuple, list)) or len(in_specs) != len(args):
                raise FlintError(f"in_specs must be a tuple with one entry per argument "
                                 f"({len(args)}), got {type(in_specs).__name__}")
            prefix = in_specs[i]
        elif jit_specs is not None:
            prefix, source = jit_specs[i], "jit in_shardings"
        out.append(_one_arg(arg, names[i], prefix, source, rules_rx, used, mesh, report))
    if report is not None:
        report.append(("rules-unmatched", [rx.pattern for k, (rx, _) in enumerate(rules_rx)
                                           if k not in used], None))
    return tuple(out)


def _one_arg(arg, name: str, prefix, source: str, rules_rx, used: set, mesh: Mesh, report):
    if prefix is not None:
        try:
            spec_tree = jax.tree.map(lambda s, sub: jax.tree.map(lambda _: s, sub), prefix, arg,
                                     is_leaf=_is_spec)
        except ValueError as e:
            raise FlintError(f"{source} for {name} do not match its structure: "
                             f"{str(e).splitlines()[0]}") from None
        specs = jax.tree.leaves(spec_tree, is_leaf=_is_spec)
    else:
        specs = None
    leaves, treedef = jax.tree_util.tree_flatten_with_path(arg)
    structs = []
    for j, (path, leaf) in enumerate(leaves):
        if not is_array(leaf):            # a function, a Python value: closed over
            structs.append(leaf)
            continue
        key = "/".join(k for k in (name, _key(path)) if k)
        spec, where = None, source
        if specs is not None:
            spec = specs[j]
            if spec is None and source == "jit in_shardings":   # None there: unspecified
                spec, where = _rule_spec(key, leaf, rules_rx, used)
        else:
            spec, where = _rule_spec(key, leaf, rules_rx, used)
        struct = _struct(leaf, spec or P(), key, mesh)
        structs.append(struct)
        if report is not None:
            report.append((key, struct, where))
    return jax.tree_util.tree_unflatten(treedef, structs)


def _rule_spec(key: str, leaf, rules_rx, used: set):
    for k, (rx, spec) in enumerate(rules_rx):
        if rx.search(key):
            used.add(k)
            return spec, f"rule {rx.pattern}"
    sharding = getattr(leaf, "sharding", None)
    if isinstance(sharding, NamedSharding):
        return sharding.spec, "own sharding"
    return P(), "default (replicated)"


def _struct(leaf, spec: P, where: str, mesh: Mesh) -> jax.ShapeDtypeStruct:
    shape = tuple(leaf.shape)
    try:
        dtype = jax.numpy.dtype(leaf.dtype)
    except TypeError:
        raise FlintError(f"argument {where} has dtype {leaf.dtype!r}, which JAX does not "
                         f"know") from None
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
