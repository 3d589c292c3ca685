"""Compile a small scanned two-layer MLP step for N compile-only devices with XLA's dump
on, and save the graph of the direct path: `python hlo_dump_step.py DUMP_DIR HARDWARE OUT`.
XLA reads XLA_FLAGS when its backends start, so this runs in its own process."""
import os
import sys

dump_dir, hardware, out = sys.argv[1:4]
os.environ["XLA_FLAGS"] = (f"--xla_dump_to={dump_dir} --xla_dump_hlo_as_text "
                           f"--xla_dump_hlo_as_proto")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import flint  # noqa: E402


def train_step(params, batch):
    def loss(params):
        def layer(x, w):
            return jnp.tanh(x @ w["w_in"]) @ w["w_out"], None
        y, _ = jax.lax.scan(layer, batch, params)
        return jnp.mean(y.astype(jnp.float32) ** 2)
    grads = jax.grad(loss)(params)
    return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads)


step = flint.capture(jax.jit(train_step), devices=8, mesh={"data": 4, "model": 2},
                     hardware=hardware,
                     rules=[(r"w_in$", P(None, None, "model")),
                            (r"w_out$", P(None, "model", None)), (r"batch", P("data"))])
params = {"w_in": jax.ShapeDtypeStruct((3, 128, 256), jnp.bfloat16),
          "w_out": jax.ShapeDtypeStruct((3, 256, 128), jnp.bfloat16)}
batch = jax.ShapeDtypeStruct((32, 128), jnp.bfloat16)
step.workload(params, batch).save(out)
# A second, tiny module in the same dump (as real programs have: initializers, helpers):
# `flint extract DIR` must pick the train step, `DIR:NAME` the one named.
jax.jit(lambda x: x * 2, static_argnums=()).lower(jnp.ones(4)).compile()
