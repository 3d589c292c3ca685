"""Decoder-only transformers of public shapes (GPT-2 small, Llama 3 8B / 70B), in plain JAX.

Shapes come from the papers: GPT-2 small: 12 layers, d_model 768, 12 heads, vocab 50257,
context 1024 (Radford et al. 2019, "Language Models are Unsupervised Multitask Learners",
Table 2). Llama 3 8B: 32 layers, d_model 4096, FFN 14336, 32 heads, 8 KV heads; Llama 3 70B:
80 layers, d_model 8192, FFN 28672, 64 heads, 8 KV heads; vocab 128256, context 8192
(Llama Team, "The Llama 3 Herd of Models", 2024, Table 3). GPT-3 6.7B: 32 layers, d_model
4096, 32 heads of 128, context 2048, FFN 4 x d_model (Brown et al. 2020, "Language Models are
Few-Shot Learners", Table 2.1), with GPT-2's vocabulary, norms and learned positions.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from flint.frontends.targets import import_jax_quietly

import_jax_quietly()     # every model path starts JAX here: its CUDA-plugin probes stay quiet
import jax  # noqa: E402
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import PartitionSpec as P

from flint.models import OFFLOADED_NAMES, lora
from flint.models.lora import project as _proj
from flint.models.layers import norm as _norm
from flint.models.layers import rope as _rope


@dataclass(frozen=True)
class DecoderConfig:
    name: str
    vocab: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_ff: int
    seq_len: int
    norm: str = "rms"            # rms | layer
    mlp: str = "swiglu"          # swiglu | gelu | relu | relu2
    pos: str = "rope"            # rope | learned
    tie_embeddings: bool = False
    scan: bool = True            # layers in lax.scan (as MaxText does) or unrolled
    remat: str = "none"          # see flint.models.REMAT_POLICIES
    param_dtype: str = "float32"
    compute_dtype: str = "bfloat16"
    attention: str = "flash"     # flash (fused kernel) | xla (materialized S x S scores,
    #                              fp32) | xla-half (the same in the compute dtype)
    gemm_precision: str = "bf16"  # GEMM_PRECISIONS below (flint.models.layers.matmul)
    head_size: int = 0           # per-head dim when not d_model / heads (Qwen3: 128)
    # Mixture of experts (flint.models.moe): 0 experts = a dense decoder.
    n_experts: int = 0
    top_k: int = 0
    moe_ffn: int = 0             # each routed (and shared) expert's hidden dim
    n_shared_experts: int = 0
    first_dense: int = 0         # leading layers with a dense MLP of d_ff (DeepSeek-V3: 3)
    capacity_factor: float = 0.0  # 0: dropless; > 0: tokens beyond cf x balanced dropped
    # Multi-head latent attention (DeepSeek-V2/V3) when kv_lora > 0; head_size is then the
    # non-rotary query/key head dim.
    q_lora: int = 0
    kv_lora: int = 0
    rope_dim: int = 0
    v_head: int = 0
    # LoRA fine-tuning (flint.models.lora): the adapters' rank (0: every weight trained)
    # and the zoo weights they adapt; a training choice, not a dimension of the model
    lora_rank: int = 0
    lora_weights: tuple = ()

    @property
    def head_dim(self) -> int:
        return self.head_size or self.d_model // self.n_heads

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    def with_(self, **kw) -> "DecoderConfig":
        return replace(self, **kw)


ZOO = {
    # Vocab 50257 padded to 50304 (a multiple of 128) as Megatron-LM and nanoGPT do, so
    # vocab-parallel embeddings divide by the TP degree.
    "gpt2-small": DecoderConfig("gpt2-small", 50304, 768, 12, 12, 12, 3072, 1024, norm="layer",
                                mlp="gelu", pos="learned", tie_embeddings=True),
    "gpt3-6.7b": DecoderConfig("gpt3-6.7b", 50304, 4096, 32, 32, 32, 16384, 2048, norm="layer",
                               mlp="gelu", pos="learned", tie_embeddings=True),
    "llama3-8b": DecoderConfig("llama3-8b", 128256, 4096, 32, 32, 8, 14336, 8192),
    "llama3-70b": DecoderConfig("llama3-70b", 128256, 8192, 80, 64, 8, 28672, 8192),
    # A few-layer model of the same structure, small enough to run on host CPUs in tests.
    "tiny": DecoderConfig("tiny", 512, 128, 2, 4, 2, 256, 64),
}


# Activation rematerialization (jax.checkpoint policies), per decoder layer:
#   none: save everything; full: save only the layer input (Megatron "full" recompute);
#   full-rerun: full, with the layer re-run whole in the backward (models/recompute.py);
#   dots: save matmul outputs (XLA recomputes the elementwise work);
#   selective: save everything but the attention core's output, which the backward
#   recomputes (Korthikanti et al. 2022 "selective": with a flash kernel the S x S
#   probabilities are never stored anyway, so only the core's forward is re-run);
#   offload-qkvo / offload-qkv: MaxText's host offload (flint.models.OFFLOADED_NAMES): the
#   layer input and the named projections' outputs are copied to pinned host memory and
#   back (XLA's async host DMAs), the rest (attention core, MLP) recomputed.
# fp8 / fp8-delayed: per-tensor current / delayed scaling; mxfp8: 1x32 blocks; nvfp4: E2M1
GEMM_PRECISIONS = ("bf16", "fp8", "fp8-delayed", "mxfp8", "nvfp4")


def param_shapes(cfg: DecoderConfig) -> dict:
    """Parameter pytree as ShapeDtypeStructs (no memory)."""
    d, f, hd = cfg.d_model, cfg.d_ff, cfg.head_dim
    dt = jnp.dtype(cfg.param_dtype)

    def s(*shape):
        return jax.ShapeDtypeStruct(shape, dt)

    def layer(*lead):
        p = {"attn_norm": s(*lead, d), "wq": s(*lead, d, cfg.n_heads * hd),
             "wk": s(*lead, d, cfg.n_kv_heads * hd), "wv": s(*lead, d, cfg.n_kv_heads * hd),
             "wo": s(*lead, cfg.n_heads * hd, d), "mlp_norm": s(*lead, d),
             "w_up": s(*lead, d, f), "w_down": s(*lead, f, d)}
        if cfg.mlp == "swiglu":
            p["w_gate"] = s(*lead, d, f)
        if cfg.lora_rank:
            p.update(lora.adapter_shapes(p, cfg.lora_rank, cfg.lora_weights))
        return p

    params = {"embed": s(cfg.vocab, d), "final_norm": s(d)}
    if cfg.is_moe or cfg.kv_lora:
        from flint.models import moe

        params.update(moe.layer_params(cfg, s, layer))
    else:
        params["layers"] = (layer(cfg.n_layers) if cfg.scan
                            else {f"layer_{i}": layer() for i in range(cfg.n_layers)})
    if cfg.pos == "learned":
        params["pos_embed"] = s(cfg.seq_len, d)
    if not cfg.tie_embeddings:
        params["lm_head"] = s(d, cfg.vocab)
    return params


def param_count(cfg: DecoderConfig) -> int:
    import math

    return sum(math.prod(x.shape) for x in jax.tree.leaves(param_shapes(cfg)))


def model_flops(cfg: DecoderConfig, tokens: int) -> float:
    """Model flops per step (Chowdhery et al. 2022, PaLM, appendix B): 6 flops per matmul
    weight per token, plus 12 * layers * d_attn * seq per token for attention; recompute
    is not counted, so MFU stays comparable across remat policies."""
    if cfg.is_moe or cfg.kv_lora:
        from flint.models import moe

        return moe.model_flops(cfg, tokens)
    if cfg.lora_rank:
        return lora.model_flops(cfg, tokens, model_flops, param_shapes)
    d_attn = cfg.n_heads * cfg.head_dim
    matmul_params = param_count(cfg) - cfg.vocab * cfg.d_model * (
        0 if cfg.tie_embeddings else 1) - (cfg.seq_len * cfg.d_model if cfg.pos == "learned" else 0)
    return tokens * (6 * matmul_params + 12 * cfg.n_layers * d_attn * cfg.seq_len)


def sharding_rules(cfg: DecoderConfig, fsdp: str | None, tp: str | None,
                   expert: str | None = None) -> list:
    """Partition-spec rules: FSDP shards the d_model side of every matrix over `fsdp`,
    Megatron TP splits attention heads and the MLP hidden dim over `tp` (column-parallel
    wq/wk/wv/w_up/w_gate, row-parallel wo/w_down), embeddings are vocab-parallel."""
    lead = (None,) if cfg.scan else ()
    col, row = P(*lead, fsdp, tp), P(*lead, tp, fsdp)
    moe_rules = []
    if cfg.is_moe or cfg.kv_lora:
        from flint.models import moe

        moe_rules = moe.sharding_rules(cfg, fsdp, tp, expert)
    adapters = lora.sharding_rules(fsdp, tp, lead) if cfg.lora_rank else []
    return moe_rules + adapters + [
        (r"layers/.*(wq|wk|wv|w_up|w_gate)$", col),
        (r"layers/.*(wo|w_down)$", row),
        (r"embed$", P(tp, fsdp)),
        (r"lm_head$", P(fsdp, tp)),
        (r".*", P()),
    ]


def _attention(x, p, cfg: DecoderConfig, attn_spec=None, kv_spec=None):
    b, s, _ = x.shape
    h, kv, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    cd = x.dtype
    # checkpoint names as MaxText's attention gives them (the offload policies read them)
    q = checkpoint_name(_proj(x, p, "wq", cfg), "query_proj").reshape(b, s, kv, h // kv, hd)
    k = checkpoint_name(_proj(x, p, "wk", cfg), "key_proj").reshape(b, s, kv, hd)
    v = checkpoint_name(_proj(x, p, "wv", cfg), "value_proj").reshape(b, s, kv, hd)
    if cfg.pos == "rope":
        pos = jnp.arange(s)
        q = _rope(q.reshape(b, s, h, hd), pos).reshape(b, s, kv, h // kv, hd)
        k = _rope(k, pos)
    if kv_spec is not None:   # context parallelism: gather the keys and values
        k, v = (jax.lax.with_sharding_constraint(t, kv_spec) for t in (k, v))
    if cfg.attention == "flash":
        from flint.models.attention import attention

        out = attention(q.reshape(b, s, h, hd), k, v, causal=True, spec=attn_spec)
        out = checkpoint_name(out, "attention_core")
        return checkpoint_name(_proj(out.reshape(b, s, h * hd), p, "wo", cfg), "out_proj")
    # Megatron's unfused core keeps each rank's heads whole (all of the sequence). Without
    # pinning the heads to the tensor-parallel axis, XLA may shard the S x S scores over
    # the sequence instead under sequence parallelism (all-to-alls of the scores and
    # all-gathered projection weights): not what Megatron-LM runs.
    heads_spec = None
    if attn_spec is not None and kv % _axis_size(attn_spec[2]) == 0:
        batch, _, tp = tuple(attn_spec)[:3]
        heads_spec = P(*tuple(attn_spec)[:3], None, None)
        kv_heads = P(batch, None, tp, None)        # keys/values: the whole sequence
        q = jax.lax.with_sharding_constraint(q, heads_spec)
        k, v = (jax.lax.with_sharding_constraint(t, kv_heads) for t in (k, v))
    # `xla-half`: the scores in the compute dtype, as Megatron's core keeps them (baddbmm
    # writes them in fp16/bf16, its FusedScaleMaskSoftmax reads and writes that dtype and
    # computes in fp32 in registers); `xla`: in fp32, as a JAX program usually asks
    sdt = cd if cfg.attention == "xla-half" else jnp.float32
    scores = jnp.einsum("bqkgd,bskd->bkgqs", q, k, preferred_element_type=sdt)
    scores = scores / jnp.sqrt(jnp.asarray(hd, sdt))
    causal = jnp.tril(jnp.ones((s, s), dtype=bool))
    scores = jnp.where(causal, scores, jnp.finfo(sdt).min)
    # named as the flash core is: `selective` remat recomputes the S x S probabilities in
    # the backward instead of keeping them (Korthikanti et al. 2022's selective recompute
    # of QK^T, softmax and AV)
    probs = checkpoint_name(jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(cd),
                            "attention_core")
    out = jnp.einsum("bkgqs,bskd->bqkgd", probs, v)
    if heads_spec is not None:
        out = jax.lax.with_sharding_constraint(out, heads_spec)
    return _proj(out.reshape(b, s, h * hd), p, "wo", cfg)


def _axis_size(axes) -> int:
    """Devices along a PartitionSpec entry of the current mesh (1 without a mesh)."""
    from flint.models.attention import _has_mesh

    if axes is None or not _has_mesh():
        return 1
    mesh = jax.sharding.get_abstract_mesh()
    return math.prod(mesh.shape[a] for a in ((axes,) if isinstance(axes, str) else axes))


def _mlp(x, p, cfg: DecoderConfig, hidden_spec=None):
    """`hidden_spec` shards the [batch, seq, ffn] hidden activations: Megatron's column-
    then row-parallel MLP keeps them split over the tensor-parallel axis. Without it XLA
    may all-gather the FFN weights instead (it does for FP8 operands)."""
    def constrain(t):
        return t if hidden_spec is None else jax.lax.with_sharding_constraint(t, hidden_spec)

    up = constrain(_proj(x, p, "w_up", cfg))
    if cfg.mlp == "swiglu":
        up = jax.nn.silu(constrain(_proj(x, p, "w_gate", cfg))) * up
    elif cfg.mlp == "relu2":       # squared ReLU (So et al. 2021, Primer), as Nemotron-4
        up = jnp.square(jax.nn.relu(up))
    elif cfg.mlp == "relu":        # plain ReLU (the 2023 MaxText default, OPT)
        up = jax.nn.relu(up)
    else:
        up = jax.nn.gelu(up)
    return _proj(up, p, "w_down", cfg)


def forward(params, tokens, cfg: DecoderConfig, act_spec=None, attn_spec=None, kv_spec=None,
            experts=None):
    """Logits [batch, seq, vocab]. `act_spec` shards the residual stream between layers;
    `attn_spec` shards the attention core's [batch, seq, heads, head_dim] queries;
    `kv_spec` the keys' and values' ([batch, seq, kv heads, head dim]) in attention;
    `experts` (flint.models.moe.ExpertSharding) says how MoE layers shard their experts."""
    cd = jnp.dtype(cfg.compute_dtype)
    # the MLP's hidden activations split like the attention heads: batch, sequence (context
    # parallelism) and the tensor-parallel axis on the FFN dimension
    hidden_spec = None if attn_spec is None else P(*tuple(attn_spec)[:3])

    def constrain(x):
        return x if act_spec is None else jax.lax.with_sharding_constraint(x, act_spec)

    # Megatron's tensor parallelism with sequence parallelism: a column-parallel linear
    # all-gathers its (normed) input over the sequence and multiplies it by its own
    # weight shard; a row-parallel linear's partial outputs are reduce-scattered back to
    # sequence shards before the residual add. Constraining both ends keeps XLA's SPMD
    # partitioner from the alternative it may find cheaper (all-gathering the weights
    # into every rank, as it does for FP8 operands), which is not what Megatron runs.
    gathered = None if attn_spec is None else P(*tuple(attn_spec)[:2], None)

    def gather(x):
        if gathered is None or act_spec is None:
            return x
        return _sp_gather(x, gathered, act_spec)

    with jax.named_scope("embed"):
        x = _embed(params["embed"], tokens, cd, attn_spec)
        if cfg.pos == "learned":
            x = x + params["pos_embed"][: tokens.shape[1]].astype(cd)
        x = constrain(x)

    def layer(x, p):
        x = checkpoint_name(x, "decoder_layer_input")
        attend = _attention
        if cfg.kv_lora:
            from flint.models.moe import mla_attention as attend
        with jax.named_scope("attention"):
            x = constrain(x + attend(gather(_norm(x, p["attn_norm"], cfg.norm)), p, cfg,
                                     attn_spec, kv_spec))
        if "router" in p:
            from flint.models.moe import moe_mlp

            with jax.named_scope("moe"):
                x = x + moe_mlp(_norm(x, p["mlp_norm"], cfg.norm), p, cfg, experts)
            return constrain(x)
        with jax.named_scope("mlp"):
            x = x + _mlp(gather(_norm(x, p["mlp_norm"], cfg.norm)), p, cfg, hidden_spec)
        return constrain(x)

    if cfg.remat == "full":
        layer = jax.checkpoint(layer)
    elif cfg.remat == "full-rerun":
        from flint.models.recompute import rerun_checkpoint

        layer = rerun_checkpoint(layer)
    elif cfg.remat == "dots":
        layer = jax.checkpoint(layer, policy=jax.checkpoint_policies.checkpoint_dots)
    elif cfg.remat == "selective":
        layer = jax.checkpoint(layer, policy=jax.checkpoint_policies.
                               save_anything_except_these_names("attention_core"))
    elif cfg.remat in OFFLOADED_NAMES:
        layer = jax.checkpoint(layer, policy=jax.checkpoint_policies.
                               save_and_offload_only_these_names(
                                   names_which_can_be_saved=[],
                                   names_which_can_be_offloaded=OFFLOADED_NAMES[cfg.remat],
                                   offload_src="device", offload_dst="pinned_host"))
    if cfg.scan:
        def body(x, p):
            with jax.named_scope("layers"):
                return layer(x, p), None
        if "dense_layers" in params:     # MoE models' leading dense layers: their own stack
            x, _ = jax.lax.scan(body, x, params["dense_layers"])
        x, _ = jax.lax.scan(body, x, params["layers"])
    else:
        for i in range(cfg.n_layers):
            with jax.named_scope(f"layer_{i}"):
                x = layer(x, params["layers"][f"layer_{i}"])
    with jax.named_scope("head"):
        x = _norm(x, params["final_norm"], cfg.norm)
        w = params["embed"].T if cfg.tie_embeddings else params["lm_head"]
        logits = jnp.einsum("bsd,dv->bsv", x, w.astype(cd), preferred_element_type=jnp.float32)
        # column-parallel LM head: logits stay split over the vocabulary (the hidden
        # states are gathered, never the [hidden, vocab] weight)
        return logits if attn_spec is None else jax.lax.with_sharding_constraint(
            logits, P(*tuple(attn_spec)[:3]))


def _sp_gather(x, gathered, sharded):
    """`x` all-gathered to `gathered` in the forward; its gradient constrained back to
    `sharded`, so that the partial input gradients of the column-parallel GEMMs are
    reduce-scattered (Megatron's backward of its sequence-parallel all-gather), not
    all-reduced into a gradient every rank holds whole."""
    @jax.custom_vjp
    def f(t):
        return jax.lax.with_sharding_constraint(t, gathered)

    def fwd(t):
        return f(t), None

    def bwd(_, g):
        return (jax.lax.with_sharding_constraint(g, sharded),)

    f.defvjp(fwd, bwd)
    return f(x)


def _embed(table, tokens, cd, attn_spec):
    """Token embeddings. Under tensor parallelism a vocab-parallel lookup (Megatron's
    VocabParallelEmbedding): each rank looks its tokens up in its rows of the table,
    zeroes the ones it does not hold, and the partial embeddings are summed over the
    tensor-parallel group; the table is never gathered."""
    from flint.models.attention import _has_mesh

    tp = None if attn_spec is None else tuple(attn_spec)[2]
    if not isinstance(tp, str) or not _has_mesh():
        return table[tokens].astype(cd)
    mesh = jax.sharding.get_abstract_mesh()
    ranks = mesh.shape[tp]
    if table.shape[0] % ranks:
        return table[tokens].astype(cd)
    rows = table.shape[0] // ranks
    batch, seq = tuple(attn_spec)[:2]

    def local(tab, tok):
        idx = tok - jax.lax.axis_index(tp) * rows
        mine = (idx >= 0) & (idx < rows)
        out = jnp.where(mine[..., None], tab[jnp.clip(idx, 0, rows - 1)].astype(cd), 0)
        return jax.lax.psum(out, tp)

    fn = jax.shard_map(local, mesh=mesh, in_specs=(P(tp, None), P(batch, seq)),
                       out_specs=P(batch, seq, None), check_vma=False)
    return fn(table, tokens)
