"""Building blocks the zoo decoders share (dense and mixture-of-experts): RMS/LayerNorm,
rotary embeddings, and GEMMs in the configured precision (bf16, FP8 with per-tensor current
scaling, MXFP8 1x32 blocks, NVFP4: flint.models.nvfp4)."""
from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp


def norm(x, w, kind):
    x32 = x.astype(jnp.float32)
    if kind == "layer":
        x32 = x32 - x32.mean(-1, keepdims=True)
    y = x32 * jax.lax.rsqrt((x32 * x32).mean(-1, keepdims=True) + 1e-6)
    return (y * w).astype(x.dtype)


def rope(x, positions):
    half = x.shape[-1] // 2
    freqs = 500000.0 ** (-jnp.arange(half, dtype=jnp.float32) / half)  # Llama 3 theta
    ang = positions[:, None].astype(jnp.float32) * freqs[None, :]
    sin, cos = jnp.sin(ang)[None, :, None, :], jnp.cos(ang)[None, :, None, :]
    x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).astype(x.dtype)


def matmul(x, w, cfg):
    """x @ w in the compute dtype. bf16 GEMMs accumulate in f32 inside the kernel (cuBLAS
    computeType 32F, the TPU MXU likewise) and round the result to bf16, so a row-parallel
    partial sum is reduced in bf16 as Megatron does; the attention scores and the logits
    ask for f32 results explicitly (preferred_element_type). fp8: both operands quantized to E4M3 with a
    per-tensor scale from the current amax (Transformer Engine's current scaling: a pass
    over the tensor for its amax, then the cast); fp8-delayed: the scale comes from earlier
    steps' amax history (Transformer Engine's DelayedScaling), so the cast is the only pass
    over the tensor (it records the amax as it goes, for later steps); mxfp8:
    one scale per 1x32 block of the contraction dim (OCP MX spec), whose GEMM runs at the
    FP8 tensor rate on Blackwell; nvfp4: E2M1 with 16-element E4M3 block scales, all three
    GEMMs at the FP4 tensor rate (flint.models.nvfp4)."""
    cd = x.dtype
    if w.dtype == jnp.float8_e4m3fn:    # an FP8 parameter: read as it is, never cast
        return _fp8_param_matmul(x, w, cfg.gemm_precision)
    w = w.astype(cd)
    if cfg.gemm_precision == "bf16":
        return jnp.matmul(x, w)
    if cfg.gemm_precision == "nvfp4":
        from flint.models.nvfp4 import nvfp4_matmul

        return nvfp4_matmul(x, w)
    return _fp8_matmul(x, w, cfg.gemm_precision)


@partial(jax.custom_vjp, nondiff_argnums=(2,))
def _fp8_matmul(x, w, kind):
    return _fp8_forward(x, w, kind)[0]


def _fp8_forward(x, w, kind):
    xq, sx = _quantize_fp8(x, kind, axis=-1)
    wq, sw = _quantize_fp8(w, kind, axis=0)
    # the GEMM writes the compute dtype (cuBLASLt FP8 GEMMs accumulate in f32 and write
    # bf16, as Transformer Engine asks), so a row-parallel partial sum is reduced in bf16
    y = jnp.matmul(xq, wq, preferred_element_type=x.dtype)
    if kind in ("fp8", "fp8-delayed"):
        y = y * (sx * sw).astype(x.dtype)
    return y, (xq, sx, wq, sw)


def _fp8_fwd(x, w, kind):
    y, (xq, sx, wq, sw) = _fp8_forward(x, w, kind)
    return y, (xq, sx, wq, sw)


def _fp8_bwd(kind, res, dy):
    """Both backward GEMMs in FP8 too, as Transformer Engine runs them: the output
    gradient in E5M2 (wider range) with a per-tensor scale, against the saved E4M3
    operands (their block scales, for mxfp8, are folded in per tensor here)."""
    xq, sx, wq, sw = res
    sx, sw = jnp.max(sx), jnp.max(sw)
    dq, sd = _quantize_grad(dy, kind)
    dx = jnp.matmul(dq, wq.T, preferred_element_type=dy.dtype) * (sd * sw).astype(dy.dtype)
    lead = "".join(chr(ord("a") + i) for i in range(dy.ndim - 1))
    dw = jnp.einsum(f"{lead}k,{lead}n->kn", xq, dq, preferred_element_type=jnp.float32)
    return dx, (dw * (sx * sd)).astype(dy.dtype)   # both operands were bf16


_fp8_matmul.defvjp(_fp8_fwd, _fp8_bwd)


def _quantize_grad(dy, kind: str):
    """(E5M2 output gradient, its per-tensor scale): from the tensor's amax, or with delayed
    scaling from the amax history (no pass over it)."""
    d32 = dy.astype(jnp.float32)
    sd = (_HISTORY_SCALE if kind == "fp8-delayed"
          else jnp.max(jnp.abs(d32)) / 57344.0 + 1e-12)   # E5M2 max normal is 57344
    return (d32 / sd).astype(jnp.float8_e5m2), sd


@partial(jax.custom_vjp, nondiff_argnums=(2,))
def _fp8_param_matmul(x, w, kind):
    """x @ w for a weight held in FP8 (Transformer Engine's fp8_model_init: a frozen
    LoRA base, flint.models.lora): the activation is quantized as in _fp8_matmul, the
    weight is used as stored with its own per-tensor scale (a number, no pass over it)."""
    return _fp8_param_fwd(x, w, kind)[0]


def _fp8_param_fwd(x, w, kind):
    xq, sx = _quantize_fp8(x, kind, axis=-1)
    y = jnp.matmul(xq, w, preferred_element_type=x.dtype) * (sx * _HISTORY_SCALE).astype(
        x.dtype)
    return y, (w,)


def _fp8_param_bwd(kind, res, dy):
    """The input gradient in FP8 against the stored weight; a frozen weight has no
    gradient (the zeros are never read: XLA drops them)."""
    (w,) = res
    dq, sd = _quantize_grad(dy, kind)
    dx = jnp.matmul(dq, w.T, preferred_element_type=dy.dtype) * (sd * _HISTORY_SCALE).astype(
        dy.dtype)
    return dx, jnp.zeros_like(w)


_fp8_param_matmul.defvjp(_fp8_param_fwd, _fp8_param_bwd)


# delayed scaling's scale: a number from earlier steps (its amax history), no pass over the
# tensor being cast; its value does not matter to the cost
_HISTORY_SCALE = 1.0 / 448.0


def _quantize_fp8(t, kind: str, axis: int):
    f8 = jnp.float8_e4m3fn
    t32 = t.astype(jnp.float32)
    if kind == "fp8-delayed":
        scale = jnp.float32(_HISTORY_SCALE)
        return (t32 / scale).astype(f8), scale
    if kind == "fp8":
        scale = jnp.max(jnp.abs(t32)) / 448.0 + 1e-12      # E4M3 max normal is 448
        return (t32 / scale).astype(f8), scale
    axis = axis % t.ndim
    n = t.shape[axis]
    blocks = t32.reshape(t.shape[:axis] + (n // 32, 32) + t.shape[axis + 1:]) if n % 32 == 0 \
        else t32.reshape(t.shape[:axis] + (1, n) + t.shape[axis + 1:])
    scale = jnp.max(jnp.abs(blocks), axis=axis + 1, keepdims=True) / 448.0 + 1e-12
    return (blocks / scale).astype(f8).reshape(t.shape), scale
