"""A user's `jax.nn.dot_product_attention(..., implementation="cudnn")` on a compile-only GPU.

JAX checks the cuDNN version while it traces that call ("RuntimeError: cuDNN not found."
with no cuDNN library on the machine), so a program written for GPUs fails to trace here
although nothing runs. On a GPU the call is one cuDNN flash-attention kernel per
direction (the fused `__cudnn$fmha*` custom calls in XLA's dump of such a run), so while
Flint traces a GPU target the call is written as the flash core the zoo uses
(flint.models.attention: Q, K, V, O and the log-sum-exp as residuals, no S x S scores),
which `CollapseAttention` prices as one fused kernel of the same shapes. Only the plain
causal or full form is priced this way; a bias, a mask, sequence lengths or a local window
is refused by name rather than priced as a kernel it is not. Other implementations are
left to JAX.
"""
from __future__ import annotations

from contextlib import contextmanager

import jax

from flint.errors import FlintError

_PRICED = {"is_causal", "scale"}       # the kernel's cost does not depend on the scale


@contextmanager
def cudnn_attention_as_flash(platform: str):
    if platform != "gpu":
        yield
        return
    original = jax.nn.dot_product_attention

    def dot_product_attention(query, key, value, *args, implementation=None, **kwargs):
        if implementation != "cudnn":
            return original(query, key, value, *args, implementation=implementation, **kwargs)
        given = [n for n, v in zip(("bias", "mask"), args) if v is not None]
        given += [n for n, v in kwargs.items() if n not in _PRICED and v is not None]
        if given:
            raise FlintError(f"jax.nn.dot_product_attention(implementation='cudnn') with "
                             f"{', '.join(given)}: Flint prices cuDNN's attention as a full or "
                             f"causal flash kernel only")
        from flint.models.attention import _core

        return _core(query, key, value, bool(kwargs.get("is_causal", False)))

    jax.nn.dot_product_attention = dot_product_attention
    try:
        yield
    finally:
        jax.nn.dot_product_attention = original
