"""LoRA fine-tuning of the zoo's decoders (Hu et al. 2021, "LoRA: Low-Rank Adaptation of
Large Language Models", arXiv 2106.09685): the base weights W0 are frozen and each targeted
projection gains a trained rank-r update, y = x W0 + (alpha / r) (x A) B.

What a step runs then, as XLA compiles it: the forward and the input-gradient GEMMs of every
frozen weight (the backward still flows through them to the adapters below), the adapters'
own skinny GEMMs ([tokens, d] x [d, r], then [tokens, r] x [r, d']) with their weight
gradients, and AdamW over the adapters alone. The train step differentiates the adapters
only, so the frozen weights' weight-gradient GEMMs, gradient reductions and optimizer state
never exist in the program.

Targets are Megatron's linears (Megatron-Bridge src/megatron/bridge/peft/lora.py,
LoRA.target_modules): `qkv` (the fused query/key/value projection), `proj` (attention
output), `fc1` (MLP input: up and, in a gated MLP, the gate, which Megatron fuses into one
linear), `fc2` (MLP output); NeMo's group names `attention` (qkv and proj) and `mlp` (fc1
and fc2) are accepted. Megatron-Bridge's default is all four at dim 32; NeMo 1.x's
(examples/nlp/language_modeling/tuning/conf/megatron_gpt_finetuning_config.yaml,
lora_tuning) is attention_qkv at adapter_dim 32.

Frozen weights are held in the compute dtype (bf16): Megatron's distributed optimizer makes
fp32 main parameters, main gradients and Adam moments only for parameters that require a
gradient, and the PEFT freeze clears requires_grad on every base weight. With base `fp8`
the layers' linears are held in FP8 (NeMo's `fp8_params`, Transformer Engine's
fp8_model_init; NVIDIA's MLPerf Llama 2 70B LoRA config sets it with FP8): an FP8 GEMM reads
them as they are, with no per-step cast of the frozen weights (layers.matmul). The alpha / r
scale is one multiply on the adapter's output, fused into its add; the model leaves it out.
"""
from __future__ import annotations

from flint.frontends.targets import import_jax_quietly

import_jax_quietly()
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from flint.errors import FlintError  # noqa: E402
from flint.models.layers import matmul  # noqa: E402
from flint.models.lora_targets import adapted_weights, parse_targets  # noqa: E402

A, B = "_lora_a", "_lora_b"
# column-parallel weights split their output over TP, row-parallel ones their input
COLUMN = ("wq", "wk", "wv", "w_up", "w_gate")


def with_lora(cfg, rank: int, targets):
    """The decoder config with LoRA adapters of `rank` on `targets` (Megatron linear names,
    a comma string or a sequence of them)."""
    if cfg.is_moe or cfg.kv_lora:
        raise FlintError(f"lora: {cfg.name} is a MoE/MLA model; LoRA is modelled on dense "
                         f"decoders (their q/k/v/o and MLP projections)")
    if int(rank) < 1:
        raise FlintError(f"lora: rank {rank} (a LoRA rank is at least 1)")
    names = parse_targets(targets if isinstance(targets, str) else ",".join(targets))
    return cfg.with_(lora_rank=int(rank), lora_weights=adapted_weights(names))


def adapter_shapes(layer: dict, rank: int, weights) -> dict:
    """A and B of each adapted weight in one layer's parameter dict (shapes [..., d_in, d_out],
    a scanned stack's leading layer dim kept): A [..., d_in, r], B [..., r, d_out]."""
    out = {}
    for name in weights:
        w = layer.get(name)
        if w is None:
            continue
        *lead, d_in, d_out = w.shape
        out[name + A] = jax.ShapeDtypeStruct((*lead, d_in, rank), w.dtype)
        out[name + B] = jax.ShapeDtypeStruct((*lead, rank, d_out), w.dtype)
    return out


def is_adapter(key: str) -> bool:
    return key.endswith((A, B))


# the transformer layers' linears: what Transformer Engine's fp8_model_init holds in FP8
# (its te.Linear modules; the embedding, the output layer and the norms stay bf16)
LINEARS = ("wq", "wk", "wv", "wo", "w_up", "w_gate", "w_down")


def split(params: dict, frozen_dtype, fp8_linears: bool = False) -> tuple[dict, dict]:
    """(frozen, adapters): the base weights in `frozen_dtype` (the layers' linears in FP8
    E4M3 with `fp8_linears`) and the adapters as they are, each in the parameter tree's own
    nesting (a subtree without any of its kind dropped)."""
    frozen, adapters = {}, {}
    for key, value in params.items():
        if isinstance(value, dict):
            f, a = split(value, frozen_dtype, fp8_linears)
            if f:
                frozen[key] = f
            if a:
                adapters[key] = a
        elif is_adapter(key):
            adapters[key] = value
        else:
            dtype = jnp.float8_e4m3fn if fp8_linears and key in LINEARS else frozen_dtype
            frozen[key] = jax.ShapeDtypeStruct(value.shape, jnp.dtype(dtype))
    return frozen, adapters


def merged(frozen: dict, adapters: dict) -> dict:
    """One parameter tree of both (the decoder reads each layer's adapters beside its
    weights)."""
    out = dict(frozen)
    for key, value in adapters.items():
        out[key] = merged(out.get(key, {}), value) if isinstance(value, dict) else value
    return out


def sharding_rules(fsdp, tp, lead: tuple) -> list:
    """Adapters shard as Megatron's ParallelLinearAdapter does: a column-parallel linear's
    A splits its rank over TP and its B the output features; a row-parallel linear's A
    splits its input features (the base weight's TP shard) and its B the output features.
    FSDP shards the d_model side as it does the base weights'."""
    col = "|".join(COLUMN)
    return [(rf"layers/.*({col}){A}$", P(*lead, fsdp, tp)),
            (rf"layers/.*({col}){B}$", P(*lead, None, tp)),
            (rf"layers/.*(wo|w_down){A}$", P(*lead, tp, None)),
            (rf"layers/.*(wo|w_down){B}$", P(*lead, None, fsdp))]


def project(x, p: dict, name: str, cfg):
    """x W (the frozen base GEMM, in the run's GEMM precision) plus the adapter's low-rank
    path in the compute dtype (Megatron-Bridge's adapters are Megatron linears, outside
    Transformer Engine's FP8 autocast)."""
    y = matmul(x, p[name], cfg)
    a = p.get(name + A)
    if a is None:
        return y
    low = jnp.matmul(x, a.astype(x.dtype))
    return y + jnp.matmul(low, p[name + B].astype(x.dtype))


def model_flops(cfg, tokens: int, dense_flops, shapes) -> float:
    """Model flops of a LoRA step: the frozen model's forward and input gradients (4 per
    weight and token, not the full step's 6), the adapters' 6, and attention as in the full
    step (its backward is input gradients only)."""
    base = cfg.with_(lora_rank=0, lora_weights=())
    attention = tokens * 12 * cfg.n_layers * cfg.n_heads * cfg.head_dim * cfg.seq_len
    weights = dense_flops(base, tokens) - attention
    return weights * 4 / 6 + attention + tokens * 6 * adapter_count(shapes(cfg))


def adapter_count(params: dict) -> int:
    import math

    _, adapters = split(params, jnp.float32)
    return sum(math.prod(x.shape) for x in jax.tree.leaves(adapters))
