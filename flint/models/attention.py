"""Fused (flash) attention for the zoo decoders, as production trains them.

On GPUs, production JAX uses cuDNN's fused attention (`jax.nn.dot_product_attention(...,
implementation="cudnn")`), which XLA emits as one `__cudnn$fmha*` custom call per call.
A compile-only CUDA target cannot emit it: JAX checks the cuDNN version at trace time
("RuntimeError: cuDNN not found." with no cuDNN libraries installed), and XLA needs a
cuDNN handle to build the graph. So the attention core is written here the way a
flash-attention kernel computes it (a custom VJP whose residuals are Q, K, V, O and the
log-sum-exp, never the S x S probabilities; the backward recomputes them), inside a
named scope that carries its per-device shapes:

    flashattn_fwd_b{B}_h{H}_kv{Hkv}_sq{Sq}_skv{Skv}_d{D}_{causal|full}

`passes.attention.CollapseAttention` turns the ops of each such scope into ONE attention
node (and one for the backward) with the FLOPs, bytes and shapes of a flash kernel.
Under a mesh the core runs in `shard_map` (as MaxText wraps its kernels), so the shapes
in the name are what one device computes.
"""
from __future__ import annotations

import contextlib
import contextvars
import math
from functools import partial

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from flint.passes.attention import scope_name


# The core below holds each call's S x S scores in fp32, as no flash kernel does. That is only
# a compile device (the collapse pass prices the call from its scope's shapes), but a compile
# target checks the program against its memory: a long sequence on a small-HBM chip (seq 8192,
# 3 sequences and 32 heads per chip: 25.8 GB of scores per call on a 32 GB TPU v6e) fails
# XLA's check. Under `tiled_scores(budget)` the core runs over query tiles (a Python loop in
# the same scope, so the pass still sees one call) whose fp32 scores take at most `budget`
# bytes each; the request's extraction retries a program XLA refused for memory so.
_SCORE_BUDGET: contextvars.ContextVar[int] = contextvars.ContextVar("score_budget", default=0)
MIN_QUERY_TILE = 128     # rows per tile at least: a full MXU / tensor-core edge


@contextlib.contextmanager
def tiled_scores(budget: int):
    token = _SCORE_BUDGET.set(budget)
    try:
        yield
    finally:
        _SCORE_BUDGET.reset(token)


def query_tiles(b: int, h: int, s: int, t: int) -> int:
    """How many query tiles the core runs in: the fewest (a power of two dividing `s`, tiles
    of MIN_QUERY_TILE rows at least) whose fp32 scores fit the budget; 1 without one."""
    budget, tiles = _SCORE_BUDGET.get(), 1
    while (budget and 4 * b * h * (s // tiles) * t > budget and s % (2 * tiles) == 0
           and s // (2 * tiles) >= MIN_QUERY_TILE):
        tiles *= 2
    return tiles


def attention(q, k, v, causal: bool = True, spec: P | None = None):
    """q/k [B, S|T, H|Hkv, D], v [B, T, Hkv, Dv] -> [B, S, H, Dv]. `spec` is the sharding of q
    (batch axes, None, tensor-parallel axis, None); K/V heads are repeated to H when the
    tensor-parallel degree does not divide them (as Megatron does)."""
    if spec is None or not _has_mesh():
        return _core(q, k, v, causal)
    mesh = jax.sharding.get_abstract_mesh()
    tp = spec[2]
    tp_size = math.prod(mesh.shape[a] for a in ((tp,) if isinstance(tp, str) else tp or ()))
    if k.shape[2] % tp_size:
        rep = q.shape[2] // k.shape[2]
        k, v = jnp.repeat(k, rep, axis=2), jnp.repeat(v, rep, axis=2)
    heads = q.shape[2]
    if heads % tp_size:
        # Heads that do not split evenly over the tensor-parallel ranks (GPT-2's 12 over 8)
        # run padded to the next multiple: the busiest rank's work, which sets the step.
        pad = [(0, 0), (0, 0), (0, -heads % tp_size), (0, 0)]
        q, k, v = (jnp.pad(t, pad) for t in (q, k, v))
    # Keys and values are whole along the sequence (gathered first under context
    # parallelism, where only the queries are split).
    kv_spec = P(spec[0], None, *spec[2:])
    fn = jax.shard_map(partial(_core, causal=causal), mesh=mesh,
                       in_specs=(spec, kv_spec, kv_spec), out_specs=spec, check_vma=False)
    return fn(q, k, v)[:, :, :heads]


def _has_mesh() -> bool:
    mesh = jax.sharding.get_abstract_mesh()
    return mesh is not None and not mesh.empty


def _core(q, k, v, causal: bool):
    b, s, h, d = q.shape
    t, kv = k.shape[1], k.shape[2]
    names = {ph: scope_name(ph, b, h, kv, s, t, d, causal, v.shape[-1])
             for ph in ("fwd", "bwd")}

    @jax.custom_vjp
    def flash(q, k, v):
        # the primal runs where nothing differentiates this call: an inference step, or a
        # layer whose backward re-runs it whole (models.recompute)
        with jax.named_scope(names["fwd"]):
            return _forward(q, k, v, causal)[0]

    def fwd(q, k, v):
        with jax.named_scope(names["fwd"]):
            o, lse = _forward(q, k, v, causal)
        return o, (q, k, v, o, lse)

    def bwd(res, do):
        with jax.named_scope(names["bwd"]):
            return _backward(*res, do, causal)

    flash.defvjp(fwd, bwd)
    return flash(q, k, v)


def _scores(q, k, causal, offset: int, total: int):
    """Scores of queries `offset` to `offset + q.shape[1]` of the `total` this rank holds."""
    b, s, h, d = q.shape
    kv = k.shape[2]
    qg = q.reshape(b, s, kv, h // kv, d)
    sc = jnp.einsum("bqkgd,bskd->bkgqs", qg, k, preferred_element_type=jnp.float32)
    sc = sc / jnp.sqrt(jnp.float32(d))
    if causal:
        # s queries against t >= s keys: with context parallelism a rank holds a balanced
        # share of the sequence's rows (zig-zag), so its mask is the diagonal scaled to
        # t / s, about half of its s x t scores, as passes.attention counts them.
        t = k.shape[1]
        rows, cols = jnp.arange(s)[:, None], jnp.arange(t)[None, :]
        rows = rows + offset if offset else rows
        mask = cols * total < (rows + 1) * t
        sc = jnp.where(mask, sc, jnp.finfo(jnp.float32).min)
    return sc


def _forward(q, k, v, causal):
    b, s, h, _ = q.shape
    tiles = query_tiles(b, h, s, k.shape[1])
    if tiles == 1:
        return _forward_tile(q, k, v, causal, 0, s)
    n = s // tiles
    # barriers keep XLA from sinking the tiles' row slices into the projection GEMMs that
    # make q (and the joins into the ones that read o): a GEMM between pieces of the call
    # would leave it uncollapsed (passes/attention.py takes no projection into a call)
    q, k, v = jax.lax.optimization_barrier((q, k, v))
    parts = [_forward_tile(q[:, i * n:(i + 1) * n], k, v, causal, i * n, s)
             for i in range(tiles)]
    return jax.lax.optimization_barrier((jnp.concatenate([o for o, _ in parts], axis=1),
                                         jnp.concatenate([lse for _, lse in parts], axis=-1)))


def _forward_tile(q, k, v, causal, offset, total):
    b, s, h, d = q.shape
    sc = _scores(q, k, causal, offset, total)
    lse = jax.nn.logsumexp(sc, axis=-1)                       # [b, kv, g, s]
    p = jnp.exp(sc - lse[..., None]).astype(q.dtype)
    o = jnp.einsum("bkgqs,bskd->bqkgd", p, v, preferred_element_type=jnp.float32)
    return o.astype(q.dtype).reshape(b, s, h, v.shape[-1]), lse


def _backward(q, k, v, o, lse, do, causal):
    b, s, h, _ = q.shape
    tiles = query_tiles(b, h, s, k.shape[1])
    if tiles == 1:
        return _backward_tile(q, k, v, o, lse, do, causal, 0, s)
    n = s // tiles
    rows = lambda t, i: t[:, i * n:(i + 1) * n]              # noqa: E731  query rows
    q, k, v, o, lse, do = jax.lax.optimization_barrier((q, k, v, o, lse, do))  # as forward
    parts = [_backward_tile(rows(q, i), k, v, rows(o, i), lse[..., i * n:(i + 1) * n],
                            rows(do, i), causal, i * n, s) for i in range(tiles)]
    dk = sum(p[1].astype(jnp.float32) for p in parts).astype(k.dtype)
    dv = sum(p[2].astype(jnp.float32) for p in parts).astype(v.dtype)
    return jax.lax.optimization_barrier(
        (jnp.concatenate([p[0] for p in parts], axis=1), dk, dv))


def _backward_tile(q, k, v, o, lse, do, causal, offset, total):
    b, s, h, d = q.shape
    kv = k.shape[2]
    # recomputed, as flash does
    p = jnp.exp(_scores(q, k, causal, offset, total) - lse[..., None])
    dv = v.shape[-1]
    dog = do.reshape(b, s, kv, h // kv, dv)
    og = o.reshape(b, s, kv, h // kv, dv)
    dv = jnp.einsum("bkgqs,bqkgd->bskd", p.astype(q.dtype), dog,
                    preferred_element_type=jnp.float32)
    dp = jnp.einsum("bqkgd,bskd->bkgqs", dog, v, preferred_element_type=jnp.float32)
    delta = jnp.einsum("bqkgd,bqkgd->bkgq", dog.astype(jnp.float32), og.astype(jnp.float32))
    ds = (p * (dp - delta[..., None]) / jnp.sqrt(jnp.float32(d))).astype(q.dtype)
    qg = q.reshape(b, s, kv, h // kv, d)
    dq = jnp.einsum("bkgqs,bskd->bqkgd", ds, k, preferred_element_type=jnp.float32)
    dk = jnp.einsum("bkgqs,bqkgd->bskd", ds, qg, preferred_element_type=jnp.float32)
    return (dq.reshape(b, s, h, d).astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype))
