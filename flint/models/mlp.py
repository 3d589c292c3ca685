"""A stack of MLP blocks (Linear-GELU-Linear), the textbook data / tensor parallel example.

With a TP axis each block is Megatron-style (Shoeybi et al. 2019, Fig. 3a): the first
matrix is split by columns and the second by rows, so the forward pass needs one
all-reduce per block and the backward pass one more.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from flint.models.parallelism import Parallelism, ZooWorkload

ZOO = {"mlp": dict(d=1024, f=4096, layers=4)}


def build(model: str, mesh, batch_per_replica: int = 8, layers: int | None = None):
    cfg = dict(ZOO[model])
    if layers is not None:
        cfg["layers"] = layers
    par = Parallelism.from_mesh(mesh)
    sizes = dict(mesh)
    dp = 1
    for a in par.batch_axes:
        dp *= sizes[a]
    d, f, n = cfg["d"], cfg["f"], cfg["layers"]
    params = {f"block_{i}": {"w1": jax.ShapeDtypeStruct((d, f), jnp.float32),
                             "w2": jax.ShapeDtypeStruct((f, d), jnp.float32)} for i in range(n)}
    batch = batch_per_replica * dp
    x = jax.ShapeDtypeStruct((batch, d), jnp.float32)
    tp = par.tp_axis
    fsdp = par.axis(par.fsdp_axes)
    pspec = {k: {"w1": P(fsdp, tp), "w2": P(tp, fsdp)} for k in params}
    bspec = P(par.axis(par.batch_axes), None)

    def train_step(params, x, y):
        def loss_fn(p):
            h = x
            for i in range(n):
                with jax.named_scope(f"block_{i}"):
                    blk = p[f"block_{i}"]
                    h = jax.lax.with_sharding_constraint(jax.nn.gelu(h @ blk["w1"]) @ blk["w2"],
                                                         bspec)
            return jnp.mean((h - y) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        with jax.named_scope("optimizer"):
            params = jax.tree.map(lambda w, g: w - 1e-3 * g, params, grads)
        return params, loss

    info = {"params": n * 2 * d * f, "global_batch": batch, "layers": n, "d": d, "f": f,
            "model_flops": 6 * n * 2 * d * f * batch}
    return ZooWorkload(model, train_step, (params, x, x), (pspec, bspec, bspec),
                       (pspec, P()), (0,), info)
