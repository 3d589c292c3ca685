"""A Transformer written the way Flax Linen users write one: logical axis names on every
parameter (`nn.with_logical_partitioning`) and on activations
(`nn.with_logical_constraint`), mapped to mesh axes by `nn.logical_axis_rules`, as
MaxText and the Flax examples do; optax AdamW. Extracted by Flint without changes:

    flint extract examples/flax_linen_logical.py:train_step --devices 64 --mesh data=8,model=8

`example_args(mesh)` builds the model abstractly (jax.eval_shape: no memory) and turns
its logical specs into the mesh's (`nn.logical_to_mesh_sharding`), as a training script
does before jitting; it runs inside Flint's virtual mesh, and works outside it too.
Needs `pip install '.[ecosystem]'` (flax, optax).
"""
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

VOCAB, D_MODEL, HEADS, LAYERS, FFN, SEQ = 32768, 1024, 16, 4, 4096, 1024
SEQS_PER_REPLICA = 2
# logical axis -> mesh axis (None: not split), as in MaxText's logical_axis_rules
LOGICAL_RULES = (("batch", "data"), ("embed", None), ("mlp", "model"), ("heads", "model"),
                 ("kv", None), ("vocab", "model"), ("length", None))
optimizer = optax.adamw(3e-4)


def _dense(features, axes, name, axis=-1):
    return nn.DenseGeneral(features, axis=axis,
                           use_bias=False, dtype=jnp.bfloat16, param_dtype=jnp.float32,
                           kernel_init=nn.with_logical_partitioning(
                               nn.initializers.normal(0.02), axes), name=name)


class Block(nn.Module):
    @nn.compact
    def __call__(self, x):
        head_dim = D_MODEL // HEADS
        h = nn.LayerNorm(dtype=jnp.bfloat16, name="ln1")(x)
        q, k, v = (_dense((HEADS, head_dim), ("embed", "heads", "kv"), n)(h)
                   for n in ("query", "key", "value"))
        q, k, v = (nn.with_logical_constraint(t, ("batch", "length", "heads", "kv"))
                   for t in (q, k, v))
        y = jax.nn.dot_product_attention(q, k, v, is_causal=True)
        x = x + _dense(D_MODEL, ("heads", "kv", "embed"), "out", axis=(-2, -1))(y)
        x = nn.with_logical_constraint(x, ("batch", "length", "embed"))
        h = nn.LayerNorm(dtype=jnp.bfloat16, name="ln2")(x)
        h = nn.gelu(_dense(FFN, ("embed", "mlp"), "up")(h))
        h = nn.with_logical_constraint(h, ("batch", "length", "mlp"))
        x = x + _dense(D_MODEL, ("mlp", "embed"), "down")(h)
        return nn.with_logical_constraint(x, ("batch", "length", "embed"))


class Transformer(nn.Module):
    @nn.compact
    def __call__(self, tokens):
        x = nn.Embed(VOCAB, D_MODEL, embedding_init=nn.with_logical_partitioning(
            nn.initializers.normal(0.02), ("vocab", "embed")), name="embed")(tokens)
        x = nn.with_logical_constraint(x.astype(jnp.bfloat16), ("batch", "length", "embed"))
        for i in range(LAYERS):
            x = Block(name=f"layers_{i}")(x)
        x = nn.LayerNorm(dtype=jnp.bfloat16, name="ln_f")(x)
        logits = _dense(VOCAB, ("embed", "vocab"), "lm_head")(x)
        return nn.with_logical_constraint(logits, ("batch", "length", "vocab"))


model = Transformer()


def train_step(params, opt_state, batch):
    def loss_fn(params):
        logits = model.apply({"params": params}, batch["tokens"]).astype(jnp.float32)
        return optax.softmax_cross_entropy_with_integer_labels(
            logits, batch["targets"]).mean()

    with nn.logical_axis_rules(LOGICAL_RULES):
        loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


def example_args(mesh):
    """(params, AdamW state, batch) as ShapeDtypeStructs carrying the mesh shardings the
    logical rules give; SEQS_PER_REPLICA sequences per data-parallel replica."""
    tokens = jax.ShapeDtypeStruct((SEQS_PER_REPLICA * mesh.shape["data"], SEQ), jnp.int32)

    def init():
        params = model.init(jax.random.key(0), jnp.zeros(tokens.shape, jnp.int32))["params"]
        return params, optimizer.init(params)

    with nn.logical_axis_rules(LOGICAL_RULES):
        abstract = jax.eval_shape(init)
        logical = nn.get_partition_spec(abstract)
        shardings = nn.logical_to_mesh_sharding(logical, mesh, LOGICAL_RULES)
    params, opt_state = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
        nn.meta.unbox(abstract), shardings)
    batch = NamedSharding(mesh, P("data"))
    return params, opt_state, {
        "tokens": jax.ShapeDtypeStruct(tokens.shape, jnp.int32, sharding=batch),
        "targets": jax.ShapeDtypeStruct(tokens.shape, jnp.int32, sharding=batch)}
