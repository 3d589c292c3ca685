"""A full training step for zoo models: forward, loss, backward, AdamW; and its shardings.

Mesh axis names carry the parallelism: `data`/`dp` shard the batch, `fsdp` shards the batch
and every parameter and optimizer state (ZeRO-3), `model`/`tensor`/`tp` is Megatron tensor
parallelism; sequence parallelism shards activations' sequence dim over the TP axis;
`context`/`cp` is context parallelism: the sequence is sharded over it end to end and each
attention all-gathers the keys and values over it (Llama 3's all-gather context
parallelism, Llama Team 2024, section 3.3.2), the gradients of K and V reduce-scattered
back.
"""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from flint.errors import FlintError
from flint.models import ZOO_REMAT_POLICIES, decoder, mlp
from flint.models import lora as lora_mod
from flint.models.parallelism import Parallelism, ZooWorkload


def adamw_update(params, grads, state, lr=3e-4, b1=0.9, b2=0.95, eps=1e-8, wd=0.1):
    """AdamW (Loshchilov & Hutter 2019) with bias correction, decoupled weight decay."""
    count = state["count"] + 1
    c1 = 1 - b1 ** count.astype(jnp.float32)
    c2 = 1 - b2 ** count.astype(jnp.float32)
    mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state["mu"], grads)
    nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, state["nu"], grads)
    new = jax.tree.map(lambda p, m, v: p - lr * ((m / c1) / (jnp.sqrt(v / c2) + eps) + wd * p),
                       params, mu, nu)
    return new, {"mu": mu, "nu": nu, "count": count}


def cross_entropy(logits, targets):
    """Mean token cross entropy. Under tensor parallelism the logits stay vocab-sharded
    (the LM head is column-parallel): the max/sum of logsumexp and the picked logit are
    partial reductions plus a small all-reduce over the TP group, i.e. Megatron's
    vocab-parallel cross entropy; the [tokens, vocab] logits are never gathered."""
    lse = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return jnp.mean(lse - picked)


def spec_tree(tree, rules) -> object:
    """Map each leaf's '/'-joined key path to the first matching (regex, spec) rule."""
    compiled = [(re.compile(r), s) for r, s in rules]

    def pick(path, _):
        key = "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)
        for rx, spec in compiled:
            if rx.search(key):
                return spec
        return P()

    return jax.tree_util.tree_map_with_path(pick, tree)


def build(model, mesh: tuple[tuple[str, int], ...], batch_per_replica: int = 1,
          seq_len: int | None = None, scan: bool | None = None, remat: str | None = None,
          sequence_parallel: bool = False, layers: int | None = None,
          dims: dict | None = None, gemm_precision: str | None = None,
          attention: str | None = None, lora: tuple = ()) -> ZooWorkload:
    """The model's training step for a mesh (global batch = batch_per_replica x DP).
    `model` is a zoo/preset name, a model YAML or HF config.json path, a mapping of dims
    or a DecoderConfig (flint.models.describe); `dims` overrides dims by user key;
    `lora` = (rank, targets[, base]): LoRA fine-tuning (flint.models.lora) with the frozen
    base held in bf16 or (base "fp8") its linears in FP8; () trains every weight."""
    if isinstance(model, str) and model in mlp.ZOO:
        return mlp.build(model, mesh, batch_per_replica, layers)
    from flint.models.describe import resolve_model

    cfg = resolve_model(model, dims)
    overrides = {k: v for k, v in dict(seq_len=seq_len, scan=scan, remat=remat,
                                       n_layers=layers, gemm_precision=gemm_precision,
                                       attention=attention).items() if v is not None}
    cfg = cfg.with_(**overrides)
    if lora:
        cfg = lora_mod.with_lora(cfg, *lora[:2])
    fp8_base = len(lora) > 2 and lora[2] == "fp8"
    if cfg.remat not in ZOO_REMAT_POLICIES:
        raise FlintError(f"unknown remat policy {cfg.remat!r}; use "
                         f"{' | '.join(ZOO_REMAT_POLICIES)}")
    if cfg.gemm_precision not in decoder.GEMM_PRECISIONS:
        raise FlintError(f"unknown GEMM precision {cfg.gemm_precision!r}; use "
                         f"{' | '.join(decoder.GEMM_PRECISIONS)}")
    par = Parallelism.from_mesh(mesh, sequence_parallel)
    sizes = dict(mesh)
    experts = _expert_sharding(cfg, par, sizes)
    dp = 1
    for a in par.batch_axes:
        dp *= sizes[a]
    batch = batch_per_replica * dp
    params = decoder.param_shapes(cfg)
    if cfg.lora_rank:           # frozen base weights beside the trained adapters
        frozen, adapters = lora_mod.split(params, cfg.compute_dtype, fp8_base)
        params = {"frozen": frozen, "lora": adapters}
    trained = params["lora"] if cfg.lora_rank else params
    opt = {"mu": trained, "nu": trained, "count": jax.ShapeDtypeStruct((), jnp.int32)}
    tokens = jax.ShapeDtypeStruct((batch, cfg.seq_len), jnp.int32)
    data = {"tokens": tokens, "targets": tokens}
    batch_axis = par.axis(par.batch_axes)
    fsdp = par.axis(par.fsdp_axes)
    pspec = spec_tree(params, decoder.sharding_rules(cfg, fsdp, par.tp_axis, par.expert_axis))
    tspec = pspec["lora"] if cfg.lora_rank else pspec
    ospec = {"mu": tspec, "nu": tspec, "count": P()}
    cp = par.context_axis
    dspec = {"tokens": P(batch_axis, cp), "targets": P(batch_axis, cp)}
    seq = tuple(a for a in (cp, par.tp_axis if sequence_parallel else None) if a)
    act = P(batch_axis, par.axis(seq), None)
    # Context parallelism: every rank's queries attend to the whole sequence's keys/values.
    kv = P(batch_axis, None, P.UNCONSTRAINED, None) if cp else None
    attn = P(batch_axis, cp, par.tp_axis, None)

    def train_step(params, opt_state, batch):
        def loss_fn(p):
            if cfg.lora_rank:       # only the adapters are differentiated
                p = lora_mod.merged(params["frozen"], p)
            logits = decoder.forward(p, batch["tokens"], cfg, act, attn, kv, experts)
            return cross_entropy(logits, batch["targets"])

        loss, grads = jax.value_and_grad(loss_fn)(params["lora"] if cfg.lora_rank else params)
        with jax.named_scope("optimizer"):
            if cfg.lora_rank:
                adapters, opt_state = adamw_update(params["lora"], grads, opt_state)
                return {"frozen": params["frozen"], "lora": adapters}, opt_state, loss
            params, opt_state = adamw_update(params, grads, opt_state)
        return params, opt_state, loss

    tokens = batch * cfg.seq_len
    model_flops = decoder.model_flops(cfg, tokens)
    base = cfg.with_(lora_rank=0, lora_weights=())
    info = {"params": decoder.param_count(base), "tokens": tokens, "model_flops": model_flops,
            "global_batch": batch, "seq_len": cfg.seq_len, "layers": cfg.n_layers,
            "scan": cfg.scan, "remat": cfg.remat, "attention": cfg.attention,
            "gemm_precision": cfg.gemm_precision}
    if cfg.lora_rank:
        info.update(lora_rank=cfg.lora_rank, lora_weights=list(cfg.lora_weights),
                    lora_base="fp8" if fp8_base else cfg.compute_dtype,
                    trained_params=lora_mod.adapter_count(params["lora"]))
    if cfg.is_moe:
        info.update(experts=cfg.n_experts, top_k=cfg.top_k, ep=sizes.get(par.expert_axis, 1),
                    capacity_factor=cfg.capacity_factor)
    return ZooWorkload(cfg.name, train_step, (params, opt, data), (pspec, ospec, dspec),
                       (pspec, ospec, P()), (0, 1), info)


def _expert_sharding(cfg, par: Parallelism, sizes: dict):
    """Where a MoE model's experts live; an expert axis needs experts that divide by it."""
    ep = sizes.get(par.expert_axis, 1) if par.expert_axis else 1
    if ep > 1 and not cfg.is_moe:
        raise FlintError(f"mesh axis {par.expert_axis}={ep}: {cfg.name} has no experts to shard")
    if not cfg.is_moe:
        return None
    if cfg.n_experts % ep:
        raise FlintError(f"{cfg.n_experts} experts do not divide over {par.expert_axis}={ep}")
    from flint.models.moe import ExpertSharding

    return ExpertSharding(par.expert_axis, par.batch_axes, par.fsdp_axes, par.tp_axis,
                          par.sequence_parallel, par.context_axis)
