"""A GPT written the way Flax NNX users write one (sharding annotations on the parameters,
optax AdamW through nnx.Optimizer), extracted by Flint without changes:

    flint extract examples/flax_nnx_gpt.py:train_step --devices 4096 --mesh fsdp=512,model=8

`example_args(mesh)` builds the model abstractly (nnx.eval_shape: no memory) inside
Flint's virtual mesh, so `nnx.with_partitioning` sees the cluster's axes and the batch
follows the mesh. Needs `pip install '.[ecosystem]'` (flax, optax).
"""
import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import PartitionSpec as P

VOCAB, D_MODEL, HEADS, LAYERS, FFN, SEQ = 32768, 1024, 16, 4, 4096, 1024
SEQS_PER_REPLICA = 1
# The batch's leading dimension is split over the FSDP axis; parameters carry
# their own specs (nnx.with_partitioning), so no other rule is needed.
rules = [(r"^batch/", P("fsdp"))]
GRAPHDEF = None      # set by example_args: the static structure of (model, optimizer)


def _init(sharding):
    return nnx.with_partitioning(nnx.initializers.normal(0.02), sharding)


def _linear(d_in, d_out, sharding, rngs):
    # bf16 compute, f32 master weights (mixed precision)
    return nnx.Linear(d_in, d_out, use_bias=False, dtype=jnp.bfloat16,
                      param_dtype=jnp.float32, kernel_init=_init(sharding), rngs=rngs)


class Attention(nnx.Module):
    def __init__(self, rngs):
        self.q, self.k, self.v = (_linear(D_MODEL, D_MODEL, ("fsdp", "model"), rngs)
                                  for _ in range(3))
        self.o = _linear(D_MODEL, D_MODEL, ("model", "fsdp"), rngs)

    def __call__(self, x):
        b, t, _ = x.shape
        heads = [jax.lax.with_sharding_constraint(
                     f(x).reshape(b, t, HEADS, D_MODEL // HEADS), P("fsdp", None, "model"))
                 for f in (self.q, self.k, self.v)]          # heads split over TP
        y = jax.nn.dot_product_attention(*heads, is_causal=True)
        return self.o(y.reshape(b, t, D_MODEL))


class Block(nnx.Module):
    def __init__(self, rngs):
        self.ln1 = nnx.LayerNorm(D_MODEL, rngs=rngs)
        self.attn = Attention(rngs)
        self.ln2 = nnx.LayerNorm(D_MODEL, rngs=rngs)
        self.up = _linear(D_MODEL, FFN, ("fsdp", "model"), rngs)
        self.down = _linear(FFN, D_MODEL, ("model", "fsdp"), rngs)

    def __call__(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.down(jax.nn.gelu(self.up(self.ln2(x))))


class GPT(nnx.Module):
    def __init__(self, rngs):
        self.embed = nnx.Embed(VOCAB, D_MODEL, embedding_init=_init(("model", "fsdp")),
                               rngs=rngs)
        self.blocks = nnx.List([Block(rngs) for _ in range(LAYERS)])
        self.ln_f = nnx.LayerNorm(D_MODEL, rngs=rngs)
        self.head = _linear(D_MODEL, VOCAB, ("fsdp", "model"), rngs)

    def __call__(self, tokens):
        # activations stay batch-sharded between layers (as MaxText constrains them), so
        # XLA gathers parameters, not activations
        x = _batch_sharded(self.embed(tokens).astype(jnp.bfloat16))
        for block in self.blocks:
            x = _batch_sharded(block(x))
        return jax.lax.with_sharding_constraint(self.head(self.ln_f(x)),
                                                P("fsdp", None, "model"))


def _batch_sharded(x):
    return jax.lax.with_sharding_constraint(x, P("fsdp", None, None))


def train_step(state, batch):
    model, optimizer = nnx.merge(GRAPHDEF, state)

    def loss_fn(model):
        logits = model(batch["tokens"]).astype(jnp.float32)
        return optax.softmax_cross_entropy_with_integer_labels(
            logits, batch["targets"]).mean()

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return nnx.state((model, optimizer)), loss


def example_args(mesh):
    """(state, batch): the model and AdamW state as ShapeDtypeStructs with their specs,
    and one sequence per data-parallel replica of `mesh`."""
    global GRAPHDEF

    def build():
        model = GPT(nnx.Rngs(0))
        return model, nnx.Optimizer(model, optax.adamw(3e-4), wrt=nnx.Param)

    GRAPHDEF, state = nnx.split(nnx.eval_shape(build))
    replicas = mesh.shape["fsdp"]
    tokens = jax.ShapeDtypeStruct((SEQS_PER_REPLICA * replicas, SEQ), jnp.int32)
    return state, {"tokens": tokens, "targets": tokens}
