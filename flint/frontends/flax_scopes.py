"""Layer names for Flax NNX models: each module call runs in a `jax.named_scope` named by
its attribute path, so op_names read `.../blocks_2/attn/dot_general` and the per-layer
roll-up shows the model's structure instead of "(none)".

Flax Linen already scopes its module calls (`flax_profile`, on by default); NNX does not.
While Flint traces a step, `nnx.merge` (how a jitted NNX step rebuilds its modules from
state) is wrapped to give every merged module its scope name (an attribute, which NNX
keeps as static data through the split/merge of nnx.grad), and the module classes'
__call__ enter that scope. Everything is restored when tracing ends; nothing happens unless the
step's process already imported flax.nnx.
"""
from __future__ import annotations

import contextlib
import sys

SCOPE_ATTR = "_flint_scope"


def _scope_name(path: tuple) -> str:
    """('blocks', 2, 'attn') -> 'attn'; ('blocks', 2) -> 'blocks_2' (nested scopes build
    the rest of the path)."""
    last = path[-1]
    if isinstance(last, int) and len(path) > 1:
        return f"{path[-2]}_{last}"
    return str(last)


@contextlib.contextmanager
def nnx_module_scopes():
    nnx = sys.modules.get("flax.nnx")
    if nnx is None or not hasattr(nnx, "merge") or not hasattr(nnx, "iter_modules"):
        yield
        return
    import jax

    patched: dict[type, object] = {}
    merge = nnx.merge

    def scoped(call):
        def __call__(self, *args, **kwargs):
            name = getattr(self, SCOPE_ATTR, None)
            if name is None:
                return call(self, *args, **kwargs)
            with jax.named_scope(name):
                return call(self, *args, **kwargs)
        __call__.__wrapped__ = call
        return __call__

    def record(obj):
        if isinstance(obj, (tuple, list)):
            for item in obj:
                record(item)
            return
        if not isinstance(obj, nnx.Module):
            return
        for path, module in nnx.iter_modules(obj):
            cls = type(module)
            if not path or "__call__" not in dir(cls):
                continue
            # a plain attribute is static graph data, so it survives the split/merge that
            # nnx.grad and friends do inside the step
            object.__setattr__(module, SCOPE_ATTR, _scope_name(tuple(path)))
            if cls not in patched and "__call__" in cls.__dict__:
                patched[cls] = cls.__dict__["__call__"]
                cls.__call__ = scoped(patched[cls])

    def merge_with_scopes(*args, **kwargs):
        out = merge(*args, **kwargs)
        record(out)
        return out

    nnx.merge = merge_with_scopes
    try:
        yield
    finally:
        nnx.merge = merge
        for cls, call in patched.items():
            cls.__call__ = call
