"""A Llama-shaped decoder in plain JAX: RMSNorm, rotary embeddings, grouped-query attention
through cuDNN's fused kernel (`jax.nn.dot_product_attention(implementation="cudnn")`),
SwiGLU, 16 layers run with `lax.scan`, bf16 compute on fp32 parameters, AdamW written out.
`scripts/capture_gpu.py` runs this very step on a real GPU (profiled, with XLA's dump) and
Flint predicts it without one:

    flint extract examples/gpu_llama_jax.py:train_step --devices 1 --hardware h200 --estimate

Dims are Llama-like at about 0.9B parameters, so one step fits one GPU without remat.
"""
from functools import partial

import jax
import jax.numpy as jnp

VOCAB, D, HEADS, KV_HEADS, FFN, LAYERS, SEQ = 32000, 2048, 16, 4, 5632, 16, 4096
SEQS_PER_REPLICA = 4
HEAD_DIM = D // HEADS
ATTENTION = "cudnn"     # cuDNN's fused flash kernel (a GPU); None lets JAX choose
LR, BETA1, BETA2, EPS, WEIGHT_DECAY = 3e-4, 0.9, 0.95, 1e-8, 0.1
bf16 = jnp.bfloat16


def rms_norm(x, w):
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + 1e-5)
    return (x32 * w).astype(bf16)


def rotary(x):
    """x [b, s, heads, d]: the rotate-half form of RoPE (base 10000)."""
    s, d = x.shape[1], x.shape[-1]
    inv = 1.0 / (10000.0 ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
    angles = jnp.arange(s, dtype=jnp.float32)[:, None] * inv[None, :]
    cos = jnp.cos(jnp.concatenate([angles, angles], -1))[None, :, None, :]
    sin = jnp.sin(jnp.concatenate([angles, angles], -1))[None, :, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    rotated = jnp.concatenate([-x2, x1], axis=-1)
    return (x.astype(jnp.float32) * cos + rotated.astype(jnp.float32) * sin).astype(bf16)


def layer(x, p):
    b, s, _ = x.shape
    h = rms_norm(x, p["attn_norm"])
    q = (h @ p["wq"].astype(bf16)).reshape(b, s, HEADS, HEAD_DIM)
    k = (h @ p["wk"].astype(bf16)).reshape(b, s, KV_HEADS, HEAD_DIM)
    v = (h @ p["wv"].astype(bf16)).reshape(b, s, KV_HEADS, HEAD_DIM)
    y = jax.nn.dot_product_attention(rotary(q), rotary(k), v, is_causal=True,
                                     implementation=ATTENTION).reshape(b, s, D)
    x = x + (y @ p["wo"].astype(bf16)).astype(jnp.float32)
    h = rms_norm(x, p["mlp_norm"])
    gated = jax.nn.silu(h @ p["w_gate"].astype(bf16)) * (h @ p["w_up"].astype(bf16))
    return x + (gated @ p["w_down"].astype(bf16)).astype(jnp.float32), None


def loss_fn(params, batch):
    x = params["embed"][batch["tokens"]]
    x, _ = jax.lax.scan(layer, x, params["layers"])
    logits = (rms_norm(x, params["final_norm"]) @ params["head"].astype(bf16))
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, batch["targets"][..., None], axis=-1))


def adamw(p, g, m, v, step):
    m = BETA1 * m + (1 - BETA1) * g
    v = BETA2 * v + (1 - BETA2) * g * g
    m_hat = m / (1 - BETA1 ** step)
    v_hat = v / (1 - BETA2 ** step)
    return p - LR * (m_hat / (jnp.sqrt(v_hat) + EPS) + WEIGHT_DECAY * p), m, v


@partial(jax.jit, donate_argnums=0)
def train_step(state, batch):
    loss, grads = jax.value_and_grad(loss_fn)(state["params"], batch)
    step = state["step"] + 1
    new = jax.tree.map(lambda p, g, m, v: adamw(p, g, m, v, step.astype(jnp.float32)),
                       state["params"], grads, state["m"], state["v"])
    pick = lambda i: jax.tree.map(lambda t: t[i], new, is_leaf=lambda t: isinstance(t, tuple))
    return {"params": pick(0), "m": pick(1), "v": pick(2), "step": step}, loss


def param_shapes():
    f32 = jnp.float32
    kv = KV_HEADS * HEAD_DIM
    per_layer = {"attn_norm": (D,), "mlp_norm": (D,), "wq": (D, D), "wk": (D, kv),
                 "wv": (D, kv), "wo": (D, D), "w_gate": (D, FFN), "w_up": (D, FFN),
                 "w_down": (FFN, D)}
    layers = {k: jax.ShapeDtypeStruct((LAYERS, *s), f32) for k, s in per_layer.items()}
    return {"embed": jax.ShapeDtypeStruct((VOCAB, D), f32), "layers": layers,
            "final_norm": jax.ShapeDtypeStruct((D,), f32),
            "head": jax.ShapeDtypeStruct((D, VOCAB), f32)}


def example_args(mesh):
    params = param_shapes()
    state = {"params": params, "m": params, "v": params,
             "step": jax.ShapeDtypeStruct((), jnp.int32)}
    tokens = jax.ShapeDtypeStruct((SEQS_PER_REPLICA * mesh.size, SEQ), jnp.int32)
    return state, {"tokens": tokens, "targets": tokens}
