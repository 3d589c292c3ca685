"""Plain JAX the way large-model code writes it: parameters stacked per layer and run
with `lax.scan`, each layer under `jax.checkpoint` with a policy naming what to save
(`save_only_these_names`: the attention output and the MLP input, by `checkpoint_name`),
and the MLP written per device with `shard_map` (Megatron's column/row split: one psum
over `model` after the down projection). Batch over `data`.

    flint extract examples/jax_scan_remat.py:train_step --devices 64 --mesh data=8,model=8

Plain SGD keeps the example about the forward/backward program.
"""
from functools import partial

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import PartitionSpec as P

VOCAB, D, HEADS, FFN, LAYERS, SEQ = 16384, 1024, 16, 4096, 8, 1024
SEQS_PER_REPLICA = 2
POLICY = jax.checkpoint_policies.save_only_these_names("attention_out", "mlp_in")
rules = [(r"^params/layers/(wq|wk|wv|w_up)$", P(None, None, "model")),
         (r"^params/layers/(wo|w_down)$", P(None, "model", None)),
         (r"^params/(embed|head)$", P(None, "model")),
         (r"^batch/", P("data"))]


def mlp(x, w_up, w_down):
    """Per device: x [b, s, D] whole, w_up [D, F/tp], w_down [F/tp, D]; the partial sums
    of the row-parallel projection are added over `model`."""
    h = jax.nn.gelu(x @ w_up)
    return jax.lax.psum(h @ w_down, "model")


def layer(x, p):
    b, s, _ = x.shape
    h = x.astype(jnp.bfloat16)
    q, k, v = (jnp.einsum("bsd,de->bse", h, p[w].astype(jnp.bfloat16))
               .reshape(b, s, HEADS, D // HEADS) for w in ("wq", "wk", "wv"))
    y = jax.nn.dot_product_attention(q, k, v, is_causal=True).reshape(b, s, D)
    x = x + checkpoint_name(y @ p["wo"].astype(jnp.bfloat16), "attention_out")
    h = checkpoint_name(x.astype(jnp.bfloat16), "mlp_in")
    mesh = jax.sharding.get_abstract_mesh()
    sharded = jax.shard_map(mlp, mesh=mesh, in_specs=(P("data"), P(None, "model"),
                                                      P("model", None)),
                            out_specs=P("data"))
    return x + sharded(h, p["w_up"].astype(jnp.bfloat16),
                       p["w_down"].astype(jnp.bfloat16)), None


def loss_fn(params, batch):
    x = params["embed"][batch["tokens"]]
    x, _ = jax.lax.scan(jax.checkpoint(layer, policy=POLICY), x, params["layers"])
    logits = (x.astype(jnp.bfloat16) @ params["head"].astype(jnp.bfloat16)).astype(jnp.float32)
    labels = jax.nn.one_hot(batch["targets"], VOCAB)
    return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * labels, axis=-1))


@partial(jax.jit, donate_argnums=0)
def train_step(params, batch):
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    return jax.tree.map(lambda w, g: w - 1e-3 * g, params, grads), loss


def example_args(mesh):
    f32 = jnp.float32
    stack = {k: jax.ShapeDtypeStruct((LAYERS, D, D), f32) for k in ("wq", "wk", "wv", "wo")}
    stack.update(w_up=jax.ShapeDtypeStruct((LAYERS, D, FFN), f32),
                 w_down=jax.ShapeDtypeStruct((LAYERS, FFN, D), f32))
    params = {"embed": jax.ShapeDtypeStruct((VOCAB, D), f32), "layers": stack,
              "head": jax.ShapeDtypeStruct((D, VOCAB), f32)}
    tokens = jax.ShapeDtypeStruct((SEQS_PER_REPLICA * mesh.shape["data"], SEQ), jnp.int32)
    return params, {"tokens": tokens, "targets": tokens}
