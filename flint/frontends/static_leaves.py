"""Arguments whose pytrees hold more than arrays: equinox modules (their activation
functions are leaves), configs with Python numbers or strings in them.

jax.jit traces every leaf, and a function is no JAX type. As `equinox.filter_jit` does,
Flint traces the array leaves (anything with a shape and a dtype: arrays,
ShapeDtypeStructs) and closes the step over the others, which stay Python values while
it traces; outputs are filtered the same way (only their arrays leave the program).
"""
from __future__ import annotations

import jax


def is_array(leaf) -> bool:
    return hasattr(leaf, "shape") and hasattr(leaf, "dtype")


def split(args: tuple) -> tuple[tuple, tuple, bool]:
    """(dynamic args: array leaves with None for the others, static args: the other
    leaves with None for the arrays, whether any leaf is static)."""
    dynamic, static, found = [], [], False
    for arg in args:
        leaves, treedef = jax.tree_util.tree_flatten(arg)
        arrays = [x if is_array(x) else None for x in leaves]
        others = [None if is_array(x) else x for x in leaves]
        found = found or any(x is not None for x in others)
        dynamic.append(treedef.unflatten(arrays))
        static.append((treedef, others))
    return tuple(dynamic), tuple(static), found


def combine(dynamic: tuple, static: tuple) -> tuple:
    """The arguments again, from split's two halves (inside the traced function)."""
    out = []
    for dyn, (treedef, others) in zip(dynamic, static):
        # None is never a leaf of the original tree: it marks where an array goes
        arrays = iter(jax.tree_util.tree_leaves(dyn))
        out.append(treedef.unflatten([next(arrays) if o is None else o for o in others]))
    return tuple(out)


def closed_over(fn, static: tuple):
    """`fn` as a function of the dynamic halves of its arguments, returning only the
    arrays of its result."""
    def step(*dynamic):
        out = fn(*combine(dynamic, static))
        return jax.tree.map(lambda x: x if is_array(x) else None, out)

    step.__name__ = getattr(fn, "__name__", "step")
    return step
