"""Gradient accumulation the JAX way: the global batch split into micro-batches and a
`lax.fori_loop` summing their gradients before one optimizer update (optax AdamW), FSDP
parameters (sharded over `fsdp`, gathered by XLA where used). Flint reads the loop's trip
count from the compiled program, so the step counts every micro-batch.

    flint extract examples/jax_grad_accum.py:train_step --devices 64 --mesh fsdp=64

Needs `pip install '.[ecosystem]'` (optax).
"""
import jax
import jax.numpy as jnp
import optax
from jax.sharding import PartitionSpec as P

VOCAB, D, FFN, LAYERS, SEQ = 8192, 1024, 4096, 4, 512
MICRO_BATCHES, SEQS_PER_MICRO_BATCH = 4, 1            # per FSDP rank
rules = [(r"^(params|opt_state/.*)/.*w_(up|down)$", P("fsdp")),
         (r"^(params|opt_state/.*)/(embed|head)$", P("fsdp")),
         (r"^batch/", P(None, "fsdp"))]
optimizer = optax.adamw(3e-4)


def loss_fn(params, tokens, targets):
    x = params["embed"][tokens].astype(jnp.bfloat16)
    for i in range(LAYERS):
        up = params[f"layer{i}"]["w_up"].astype(jnp.bfloat16)
        down = params[f"layer{i}"]["w_down"].astype(jnp.bfloat16)
        x = x + jax.nn.relu(x @ up) @ down
    logits = (x @ params["head"].astype(jnp.bfloat16)).astype(jnp.float32)
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()


def train_step(params, opt_state, batch):
    """batch["tokens"]: [micro-batches, global micro-batch, SEQ]."""
    def micro_step(i, grads):
        g = jax.grad(loss_fn)(params, batch["tokens"][i], batch["targets"][i])
        return jax.tree.map(jnp.add, grads, g)

    zeros = jax.tree.map(jnp.zeros_like, params)
    grads = jax.lax.fori_loop(0, MICRO_BATCHES, micro_step, zeros)
    grads = jax.tree.map(lambda g: g / MICRO_BATCHES, grads)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state


def example_args(mesh):
    f32 = jnp.float32
    params = {"embed": jax.ShapeDtypeStruct((VOCAB, D), f32),
              "head": jax.ShapeDtypeStruct((D, VOCAB), f32),
              **{f"layer{i}": {"w_up": jax.ShapeDtypeStruct((D, FFN), f32),
                               "w_down": jax.ShapeDtypeStruct((FFN, D), f32)}
                 for i in range(LAYERS)}}
    opt_state = jax.eval_shape(optimizer.init, params)
    tokens = jax.ShapeDtypeStruct(
        (MICRO_BATCHES, SEQS_PER_MICRO_BATCH * mesh.shape["fsdp"], SEQ), jnp.int32)
    return params, opt_state, {"tokens": tokens, "targets": tokens}
