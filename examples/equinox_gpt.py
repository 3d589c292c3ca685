"""A GPT written the way equinox users write one (modules holding their activation
functions, `eqx.filter_jit`, `eqx.filter_value_and_grad`, optax AdamW), extracted by Flint
without an adapter: the functions are closed over, the arrays traced.

    flint extract examples/equinox_gpt.py:train_step --devices 64 --mesh data=64

Data parallelism: the batch is split over `data` (the rule below), parameters and AdamW
state are replicated, so the gradients are all-reduced. Needs `pip install '.[ecosystem]'`
(equinox, optax).
"""
import equinox as eqx
import jax
import jax.numpy as jnp
import optax
from jax.sharding import PartitionSpec as P

VOCAB, D_MODEL, HEADS, LAYERS, SEQ = 8192, 512, 8, 4, 512
SEQS_PER_REPLICA = 4
rules = [(r"^batch/", P("data"))]
optimizer = optax.adamw(3e-4)


class Block(eqx.Module):
    norm1: eqx.nn.LayerNorm
    attention: eqx.nn.MultiheadAttention
    norm2: eqx.nn.LayerNorm
    mlp: eqx.nn.MLP                    # holds its activation function (jax.nn.gelu)

    def __init__(self, key):
        k1, k2 = jax.random.split(key)
        self.norm1 = eqx.nn.LayerNorm(D_MODEL)
        self.attention = eqx.nn.MultiheadAttention(HEADS, D_MODEL, key=k1)
        self.norm2 = eqx.nn.LayerNorm(D_MODEL)
        self.mlp = eqx.nn.MLP(D_MODEL, D_MODEL, 4 * D_MODEL, depth=1,
                              activation=jax.nn.gelu, key=k2)

    def __call__(self, x, mask):
        h = jax.vmap(self.norm1)(x)
        x = x + self.attention(h, h, h, mask=mask)
        return x + jax.vmap(self.mlp)(jax.vmap(self.norm2)(x))


class GPT(eqx.Module):
    embed: eqx.nn.Embedding
    positions: jax.Array
    blocks: list
    norm: eqx.nn.LayerNorm
    head: eqx.nn.Linear

    def __init__(self, key):
        keys = jax.random.split(key, LAYERS + 3)
        self.embed = eqx.nn.Embedding(VOCAB, D_MODEL, key=keys[0])
        self.positions = 0.02 * jax.random.normal(keys[1], (SEQ, D_MODEL))
        self.blocks = [Block(k) for k in keys[3:]]
        self.norm = eqx.nn.LayerNorm(D_MODEL)
        self.head = eqx.nn.Linear(D_MODEL, VOCAB, use_bias=False, key=keys[2])

    def __call__(self, tokens):                      # one sequence: [SEQ]
        x = jax.vmap(self.embed)(tokens) + self.positions
        mask = jnp.tril(jnp.ones((SEQ, SEQ), dtype=bool))
        for block in self.blocks:
            x = block(x, mask)
        return jax.vmap(self.head)(jax.vmap(self.norm)(x))


def loss_fn(model, tokens, targets):
    logits = jax.vmap(model)(tokens)
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()


@eqx.filter_jit
def train_step(model, opt_state, batch):
    loss, grads = eqx.filter_value_and_grad(loss_fn)(model, batch["tokens"], batch["targets"])
    updates, opt_state = optimizer.update(grads, opt_state, eqx.filter(model, eqx.is_array))
    return eqx.apply_updates(model, updates), opt_state, loss


def example_args(mesh):
    """(model, AdamW state, batch) as shapes only (eqx.filter_eval_shape: no memory);
    SEQS_PER_REPLICA sequences per data-parallel replica."""
    def init():
        model = GPT(jax.random.key(0))
        return model, optimizer.init(eqx.filter(model, eqx.is_array))

    model, opt_state = eqx.filter_eval_shape(init)
    tokens = jax.ShapeDtypeStruct((SEQS_PER_REPLICA * mesh.shape["data"], SEQ), jnp.int32)
    return model, opt_state, {"tokens": tokens, "targets": tokens}
