"""NVFP4 GEMMs as Transformer Engine's NVFP4BlockScaling recipe runs them on Blackwell.

The format (NVIDIA, "Pretraining Large Language Models with NVFP4", arXiv 2509.25149,
section 2; Transformer Engine `recipe.NVFP4BlockScaling`): E2M1 elements (4 bits, largest
magnitude 6), one E4M3 scale per block of 16 elements along the contraction dimension,
and one FP32 scale per tensor from its amax (two-level scaling: the block scale is
(block amax / 6) / (tensor amax / (6 x 448))). The recipe's choices (paper section 4,
TE's defaults: disable_rht, disable_stochastic_rounding and disable_2d_quantization all
False):

- all three GEMMs of a linear (forward, data gradient, weight gradient) run in NVFP4;
- weights are scaled in 16 x 16 blocks, so one quantized weight serves the forward and
  the transposed data-gradient GEMM;
- activations and output gradients are scaled in 1 x 16 blocks; the weight gradient's
  two operands (the input and the output gradient, blocked along the token dimension it
  contracts) first go through a 16-point random Hadamard transform (RHT). TE computes it
  inside the column-wise cast kernel, as a 16 x 16 tensor-core product per block
  (`hadamard_transform_cast_fusion`), and its amax beside the row-wise one; it adds no
  pass over memory, so the twin's column-wise cast stands for it;
- output gradients round stochastically (Philox bits drawn inside TE's cast kernel: no
  pass of their own, not written out here);
- the forward saves the column-wise (RHT) cast of its input for the weight gradient, not
  the bf16 input.

How the twin writes it down: XLA's compile-only GPU targets emit no block-scaled FP4 GEMM
(a dot on f4e2m1fn operands fails in cuBLASLt's rewriter; jax.nn.scaled_dot_general falls
back to dequantized f32 dots), so every E2M1 tensor is held in an f8e4m3fn container and
its GEMM is an FP8 cuBLASLt (or Triton) call; block scales are rounded through another
8-bit type, so they are never taken for elements. Nothing else in an NVFP4 program is
f8e4m3fn (attention and the rest run in bf16), so passes.nvfp4_storage re-types every
f8e4m3fn value of such a graph to f4e2m1fn (half the bytes, the FP4 tensor rate) and
writes the block scales as the bytes TE's cast writes.

Not modelled: Megatron fuses Q, K and V (and gate and up) into one linear, one cast of
their shared input; XLA merges the twin's three GEMMs and shares the cast only when the
cast's amax needs no all-reduce (data-parallel shards do), so a data-parallel NVFP4 (or
per-tensor FP8) step casts that input once per linear.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

E2M1_MAX = 6.0          # largest E2M1 magnitude
E4M3_MAX = 448.0        # largest E4M3 magnitude (the block scales)
BLOCK = 16              # elements per block scale
CONTAINER = jnp.float8_e4m3fn


@jax.custom_vjp
def nvfp4_matmul(x, w):
    """x @ w (x: [..., k], w: [k, n]) with every GEMM in NVFP4."""
    return _forward(x, w)[0]


def _forward(x, w):
    # the input's casts use only this rank's values (see `quantize`), so the casts of an
    # input several linears share (Q, K and V; gate and up) are one, as Megatron's fused
    # linear casts it once
    xq, sx = quantize(x, axis=-1, local=True)        # 1 x 16 blocks along k
    wq, sw = quantize_weight(w)                      # 16 x 16 blocks
    y = jnp.matmul(xq, wq, preferred_element_type=x.dtype) * (sx * sw).astype(x.dtype)
    # the weight gradient's operand, blocked along the tokens it contracts (its RHT is
    # inside TE's column-wise cast kernel: see the module docstring)
    xt, sxt = quantize(x.reshape(-1, x.shape[-1]), axis=0, local=True)
    return y, (xt, sxt, wq, sw, x.shape)


def _fwd(x, w):
    return _forward(x, w)


def _bwd(res, dy):
    xt, sxt, wq, sw, shape = res
    dq, sd = quantize(dy, axis=-1)                   # dgrad: 1 x 16 along n
    dx = jnp.matmul(dq, wq.T, preferred_element_type=dy.dtype) * (sd * sw).astype(dy.dtype)
    dt, sdt = quantize(dy.reshape(-1, dy.shape[-1]), axis=0)   # wgrad: along tokens
    dw = jnp.matmul(xt.T, dt, preferred_element_type=jnp.float32) * (sxt * sdt)
    return dx.reshape(shape), dw.astype(dy.dtype)


nvfp4_matmul.defvjp(_fwd, _bwd)


def quantize(t, axis: int, local: bool = False):
    """(E2M1 elements in their container, the tensor's dequantization scale) of a
    tensor in 1 x 16 blocks along `axis`: the tensor amax (a reduction pass), the block
    amaxes and their scales (one byte per block), then the cast (reads the tensor and the
    scales, writes the elements). `local`: the second-level scale per token (the amax over
    the last dimension) instead of per tensor, the same pass over the tensor with no
    all-reduce across the ranks that hold its shards (Transformer Engine reduces an amax
    over the tensor-parallel group at most, passes.amax_scope); XLA shares the cast of an
    input only between consumers whose casts read no collective."""
    axis = axis % t.ndim
    n = t.shape[axis]
    size = BLOCK if n % BLOCK == 0 else n
    blocks = t.astype(jnp.float32).reshape(t.shape[:axis] + (n // size, size)
                                           + t.shape[axis + 1:])
    return _cast(blocks, (axis + 1,), t.shape, local)


def quantize_weight(w):
    """A weight [k, n] in 16 x 16 blocks: one scale per tile, so the quantized weight reads
    the same transposed (the data gradient's operand)."""
    k, n = w.shape
    if k % BLOCK or n % BLOCK:
        return quantize(w, axis=0)
    tiles = w.astype(jnp.float32).reshape(k // BLOCK, BLOCK, n // BLOCK, BLOCK)
    return _cast(tiles, (1, 3), w.shape)


def _cast(blocks, within: tuple[int, ...], shape, local: bool = False):
    amax = (jnp.max(jnp.abs(blocks), axis=tuple(range(len(shape) - 1, blocks.ndim)),
                    keepdims=True) if local else jnp.max(jnp.abs(blocks)))
    tensor_scale = amax / (E2M1_MAX * E4M3_MAX) + 1e-12
    block_amax = jnp.abs(blocks)
    for axis in within:
        block_amax = _block_max(block_amax, axis)
    # the block scale, rounded to 8 bits (E4M3 in TE, one byte beside the elements; E5M2
    # here, so that f8e4m3fn stays the elements' container alone)
    scale = (block_amax / (E2M1_MAX * tensor_scale)).astype(jnp.float8_e5m2).astype(
        jnp.float32) * tensor_scale
    q = jnp.clip(blocks / scale, -E2M1_MAX, E2M1_MAX)       # the E2M1-range elements
    # The twin's FP8 call cannot apply a scale per block, so the container holds each
    # element times its block scale over one per-tensor scale (the product the real
    # block-scaled GEMM forms): the same values, and the cast still reads the scales.
    # (a local cast's container holds the values themselves: its scale is one number)
    container_scale = 1.0 if local else tensor_scale * E2M1_MAX
    held = (q * (scale / container_scale)).astype(CONTAINER).reshape(shape)
    return held, jnp.float32(container_scale)


def _block_max(t, axis: int):
    """The max over `axis` (one block, size 16) as a tree of elementwise maxima of halves,
    keeping the axis at size 1. XLA still computes the block scales in a kernel of their
    own (it fuses no producer into a consumer that reads each of its values 16 times), one
    that reads the tensor the cast reads again; TE's cast kernel takes the block amax in
    registers, and passes.nvfp4_storage counts that read once, as the cast's."""
    while t.shape[axis] > 1:
        half = t.shape[axis] // 2
        t = jnp.maximum(jax.lax.slice_in_dim(t, 0, half, axis=axis),
                        jax.lax.slice_in_dim(t, half, 2 * half, axis=axis))
    return t
