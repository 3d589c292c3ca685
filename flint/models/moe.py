"""Mixture-of-experts decoder layers (routed + shared experts, top-k) and multi-head latent
attention, for the zoo decoder (flint.models.decoder), as Megatron-Core and MaxText run them.

A MoE layer replaces the dense MLP: a router (d_model x experts, f32 logits) picks each
token's top-k experts (softmax over the k picked logits, Mixtral-style normalized gates); the
tokens are permuted into a per-expert buffer, sent to the ranks that hold their experts with
one all-to-all over the `expert` mesh axis (the dispatch), run through the local experts'
SwiGLU FFNs as grouped GEMMs (one batched GEMM per projection, experts as the batch), sent
back with a second all-to-all (the combine) and un-permuted, weighted by their gates.
Shared experts (DeepSeek) are a dense SwiGLU MLP of n_shared x moe_ffn beside it.

Expert parallelism is written the way Megatron-Core writes it, explicitly, inside one
`shard_map` over the whole mesh: the expert weights [E, d, f] are sharded over the expert
axis (E), ZeRO-3 over the FSDP axes (d; gathered before use, gradients reduce-scattered by
the all-gather's transpose) and over the tensor-parallel axis (f: expert tensor parallelism
equal to TP, Megatron-Core's default; the partial sums are reduced after the combine, a
reduce-scatter back to the sequence shards under sequence parallelism). The expert axis also
shards the batch, as EP ranks are data-parallel ranks for everything but the experts.

Token counts: the compiled program routes every expert exactly `capacity` tokens per
sequence, capacity = ceil(cf x seq x top_k / experts) with cf = capacity_factor, or 1 when
dropless: the balanced counts that vendors' benchmarks force ("force-balance the token
distribution among experts"). Skewed routing is a property of the data, not of the
program: `passes.moe_routing` re-prices the dispatch, the expert GEMMs and the combine for
a distribution of per-expert counts (balanced, Zipf, a load-imbalance factor, a histogram).

Multi-head latent attention (DeepSeek-V2, arXiv 2405.04434, section 2.1): queries through a
rank-q_lora bottleneck, keys and values from a shared rank-kv_lora latent plus one rotary
key of rope_dim shared by all heads; query/key head dim = head_size + rope_dim, value head
dim v_head, run as is by the flash kernel (FlashAttention-3 and cuDNN, which Megatron's
Transformer Engine calls, take unequal dims; FlashAttention-2 would pad values to the
query/key dim, 1.5x the P.V work for DeepSeek-V3).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import PartitionSpec as P

from flint.models.layers import matmul, norm, rope


@dataclass(frozen=True)
class ExpertSharding:
    """How a MoE layer's work is laid out on the mesh (all None/empty: one device)."""

    axis: str | None = None           # expert-parallel mesh axis
    batch: tuple[str, ...] = ()       # mesh axes sharding the batch (the expert axis among them)
    fsdp: tuple[str, ...] = ()        # axes sharding the experts' d_model dim (ZeRO-3)
    tp: str | None = None             # expert tensor parallelism (ETP = TP)
    sequence_parallel: bool = False
    # context parallelism: the sequence is split over this axis too; each context rank
    # routes its own tokens to the experts of its EP group (experts replicated over it,
    # their gradients summed over it as over the data axes)
    context: str | None = None


def capacity(cfg, seq: int) -> int:
    """Tokens each expert takes per sequence in the compiled program."""
    cf = cfg.capacity_factor or 1.0
    return max(1, math.ceil(cf * seq * cfg.top_k / cfg.n_experts))


# --- parameters -------------------------------------------------------------------------

def _attention_params(cfg, s, lead) -> dict:
    d, h = cfg.d_model, cfg.n_heads
    if not cfg.kv_lora:
        hd = cfg.head_dim
        return {"wq": s(*lead, d, h * hd), "wk": s(*lead, d, cfg.n_kv_heads * hd),
                "wv": s(*lead, d, cfg.n_kv_heads * hd), "wo": s(*lead, h * hd, d)}
    qk = cfg.head_dim + cfg.rope_dim
    p = {"wkv_a": s(*lead, d, cfg.kv_lora + cfg.rope_dim), "kv_norm": s(*lead, cfg.kv_lora),
         "wkv_b": s(*lead, cfg.kv_lora, h * (cfg.head_dim + cfg.v_head)),
         "wo": s(*lead, h * cfg.v_head, d)}
    if cfg.q_lora:
        p.update({"wq_a": s(*lead, d, cfg.q_lora), "q_norm": s(*lead, cfg.q_lora),
                  "wq_b": s(*lead, cfg.q_lora, h * qk)})
    else:
        p["wq"] = s(*lead, d, h * qk)
    return p


def _layer_params(cfg, s, lead, moe: bool) -> dict:
    d = cfg.d_model
    p = {"attn_norm": s(*lead, d), "mlp_norm": s(*lead, d), **_attention_params(cfg, s, lead)}
    if not moe:
        p.update({"w_up": s(*lead, d, cfg.d_ff), "w_gate": s(*lead, d, cfg.d_ff),
                  "w_down": s(*lead, cfg.d_ff, d)})
        return p
    e, f = cfg.n_experts, cfg.moe_ffn
    p.update({"router": s(*lead, d, e), "e_up": s(*lead, e, d, f),
              "e_gate": s(*lead, e, d, f), "e_down": s(*lead, e, f, d)})
    if cfg.n_shared_experts:
        fs = cfg.n_shared_experts * f
        p.update({"s_up": s(*lead, d, fs), "s_gate": s(*lead, d, fs), "s_down": s(*lead, fs, d)})
    return p


def layer_params(cfg, s, _dense_layer=None) -> dict:
    """{"layers": ...} (and {"dense_layers": ...} for leading dense layers under scan)."""
    moe_at = [cfg.is_moe and i >= cfg.first_dense for i in range(cfg.n_layers)]
    if not cfg.scan:
        return {"layers": {f"layer_{i}": _layer_params(cfg, s, (), m)
                           for i, m in enumerate(moe_at)}}
    dense = sum(not m for m in moe_at)
    out = {}
    if dense and dense < cfg.n_layers:
        out["dense_layers"] = _layer_params(cfg, s, (dense,), False)
    out["layers"] = _layer_params(cfg, s, (cfg.n_layers - dense if dense < cfg.n_layers
                                           else cfg.n_layers,), dense < cfg.n_layers)
    return out


def sharding_rules(cfg, fsdp, tp, expert=None) -> list:
    """Expert weights over (expert, fsdp, tp); MLA's low-rank projections keep their small
    latent dim whole (column-parallel only on the heads' side); routers replicated."""
    lead = (None,) if cfg.scan else ()
    return [
        (r"layers/.*(e_up|e_gate)$", P(*lead, expert, fsdp, tp)),
        (r"layers/.*e_down$", P(*lead, expert, tp, fsdp)),
        (r"layers/.*router$", P()),
        (r"layers/.*(s_up|s_gate)$", P(*lead, fsdp, tp)),
        (r"layers/.*s_down$", P(*lead, tp, fsdp)),
        (r"layers/.*(wq_a|wkv_a)$", P(*lead, fsdp, None)),
        (r"layers/.*(wq_b|wkv_b)$", P(*lead, None, tp)),
        (r"layers/.*(q_norm|kv_norm)$", P()),
    ]


# --- counts ------------------------------------------------------------------------------

def _attention_matmul_params(cfg) -> int:
    d, h = cfg.d_model, cfg.n_heads
    if not cfg.kv_lora:
        return d * h * cfg.head_dim * 2 + 2 * d * cfg.n_kv_heads * cfg.head_dim
    qk = cfg.head_dim + cfg.rope_dim
    q = (d * cfg.q_lora + cfg.q_lora * h * qk) if cfg.q_lora else d * h * qk
    kv = d * (cfg.kv_lora + cfg.rope_dim) + cfg.kv_lora * h * (cfg.head_dim + cfg.v_head)
    return q + kv + h * cfg.v_head * d


def active_matmul_params(cfg) -> int:
    """Weights one token multiplies through (embedding lookup excluded, LM head included):
    attention, dense MLPs, the router and top_k + shared experts of each MoE layer."""
    d = cfg.d_model
    moe_layers = cfg.n_layers - cfg.first_dense if cfg.is_moe else 0
    dense_layers = cfg.n_layers - moe_layers
    per_expert = 3 * d * cfg.moe_ffn
    n = cfg.n_layers * _attention_matmul_params(cfg) + dense_layers * 3 * d * cfg.d_ff
    n += moe_layers * (d * cfg.n_experts + (cfg.top_k + cfg.n_shared_experts) * per_expert)
    return n + (0 if cfg.tie_embeddings else d * cfg.vocab)


def attention_score_dims(cfg) -> int:
    """Query/key plus value head dims (what the S x S score and P.V GEMMs contract)."""
    if cfg.kv_lora:
        return cfg.head_dim + cfg.rope_dim + cfg.v_head
    return 2 * cfg.head_dim


def model_flops(cfg, tokens: int) -> float:
    """6 flops per active matmul weight per token plus the attention scores (the dense
    decoder's convention: full S x S, recompute not counted)."""
    attn = 6 * cfg.n_layers * cfg.n_heads * attention_score_dims(cfg) * cfg.seq_len
    return tokens * (6 * active_matmul_params(cfg) + attn)


# --- forward ------------------------------------------------------------------------------

def mla_attention(x, p, cfg, attn_spec=None, kv_spec=None):
    from flint.models.attention import attention

    b, s, _ = x.shape
    h, dn, dr, dv = cfg.n_heads, cfg.head_dim, cfg.rope_dim, cfg.v_head
    if cfg.q_lora:
        q = matmul(norm(matmul(x, p["wq_a"], cfg), p["q_norm"], "rms"), p["wq_b"], cfg)
    else:
        q = matmul(x, p["wq"], cfg)
    q = q.reshape(b, s, h, dn + dr)
    kv_a = matmul(x, p["wkv_a"], cfg)
    latent, k_rot = kv_a[..., :cfg.kv_lora], kv_a[..., cfg.kv_lora:]
    kv = matmul(norm(latent, p["kv_norm"], "rms"), p["wkv_b"], cfg).reshape(b, s, h, dn + dv)
    pos = jnp.arange(s)
    q = jnp.concatenate([q[..., :dn], rope(q[..., dn:], pos)], -1)
    k_rot = jnp.broadcast_to(rope(k_rot[:, :, None, :], pos), (b, s, h, dr))
    k = jnp.concatenate([kv[..., :dn], k_rot], -1)
    v = kv[..., dn:]
    if kv_spec is not None:
        k, v = (jax.lax.with_sharding_constraint(t, kv_spec) for t in (k, v))
    out = attention(q, k, v, causal=True, spec=attn_spec)
    out = checkpoint_name(out, "attention_core")
    return matmul(out.reshape(b, s, h * dv), p["wo"], cfg)


def moe_mlp(x, p, cfg, experts: ExpertSharding | None):
    """Routed experts (+ shared experts) of one layer: [b, s, d] -> [b, s, d]."""
    es = experts or ExpertSharding()
    weights = (p["router"], p["e_up"], p["e_gate"], p["e_down"])
    body = lambda x, r, u, g, d: _routed(x, r, u, g, d, cfg, es)  # noqa: E731
    mesh = jax.sharding.get_abstract_mesh()
    if mesh is not None and not mesh.empty:
        batch = es.batch if len(es.batch) != 1 else es.batch[0]
        seq = tuple(a for a in (es.context, es.tp if es.sequence_parallel else None) if a)
        xs = P(batch or None, (seq if len(seq) > 1 else seq[0]) if seq else None, None)
        fsdp = es.fsdp if len(es.fsdp) != 1 else es.fsdp[0]
        col, row = P(es.axis, fsdp or None, es.tp), P(es.axis, es.tp, fsdp or None)
        body = jax.shard_map(body, mesh=mesh, in_specs=(xs, P(), col, col, row),
                             out_specs=xs)
    y = body(x, *weights)
    if cfg.n_shared_experts:
        with jax.named_scope("shared_experts"):
            up = jax.nn.silu(matmul(x, p["s_gate"], cfg)) * matmul(x, p["s_up"], cfg)
            y = y + matmul(up, p["s_down"], cfg)
    return y


def _routed(x, router, up, gate, down, cfg, es: ExpertSharding):
    """One rank's routed-expert work, everything explicit (inside shard_map)."""
    if es.tp and es.sequence_parallel:
        x = jax.lax.all_gather(x, es.tp, axis=1, tiled=True)
    for ax in es.fsdp:      # ZeRO-3: gather the experts' d_model shards
        up, gate = (jax.lax.all_gather(w, ax, axis=1, tiled=True) for w in (up, gate))
        down = jax.lax.all_gather(down, ax, axis=2, tiled=True)
    # The weights meet tokens that vary over more axes (the data-parallel ones): mark them
    # varying there too, explicitly, so that a custom-VJP GEMM (FP8) returns a gradient of
    # the weight's own type; the mark's transpose is the data-parallel gradient all-reduce.
    up, gate, down = (_vary_like(w, x) for w in (up, gate, down))
    b, s, d = x.shape
    e, k = cfg.n_experts, cfg.top_k
    ep = e // up.shape[0]
    cap = capacity(cfg, s)
    with jax.named_scope("router"):
        logits = jnp.einsum("bsd,de->bse", x, router.astype(x.dtype),
                            preferred_element_type=jnp.float32)
        top, idx = jax.lax.top_k(logits, k)
        gates = jax.nn.softmax(top, axis=-1).astype(x.dtype)
    with jax.named_scope("permute"):
        choice = idx.reshape(b, s * k)
        onehot = jax.nn.one_hot(choice, e, dtype=jnp.int32)
        pos = jnp.sum(jnp.cumsum(onehot, axis=1) * onehot, axis=-1) - 1
        keep = pos < cap
        slot = jnp.where(keep, choice * cap + pos, e * cap)      # dropped: a spare slot
        # Gather, not scatter, as Megatron-Core's permute does (index_select of the rows):
        # which (token, choice) fills each expert slot; empty slots read a zero row.
        source = jax.vmap(lambda sl: jnp.full((e * cap + 1,), s * k, jnp.int32)
                          .at[sl].set(jnp.arange(s * k, dtype=jnp.int32)))(slot)[:, :e * cap]
        buf = jax.vmap(lambda xr, src: jnp.take(xr, src // k, axis=0, mode="fill",
                                                fill_value=0))(x, source)
        buf = buf.reshape(b, e, cap, d)
        send = buf.transpose(1, 0, 2, 3).reshape(ep, e // ep, b, cap, d)
    if ep > 1:
        with jax.named_scope("dispatch"):
            send = jax.lax.all_to_all(send, es.axis, 0, 0, tiled=True)
    # [local experts, tokens from every source rank]
    tokens = send.transpose(1, 0, 2, 3, 4).reshape(e // ep, ep * b * cap, d)
    with jax.named_scope("experts"):
        mm = jax.vmap(lambda t, w: matmul(t, w, cfg))
        h = jax.nn.silu(mm(tokens, gate)) * mm(tokens, up)
        y = mm(h, down)
    back = y.reshape(e // ep, ep, b, cap, d).transpose(1, 0, 2, 3, 4)
    if ep > 1:
        with jax.named_scope("combine"):
            back = jax.lax.all_to_all(back, es.axis, 0, 0, tiled=True)
    with jax.named_scope("unpermute"):
        got = back.reshape(e, b, cap, d).transpose(1, 0, 2, 3).reshape(b, e * cap, d)
        got = jnp.concatenate([got, jnp.zeros((b, 1, d), got.dtype)], axis=1)
        picked = jax.vmap(lambda g, sl: g[sl])(got, slot)               # [b, s*k, d]
        w = jnp.where(keep, gates.reshape(b, s * k), 0).astype(picked.dtype)
        out = jnp.sum((picked * w[..., None]).reshape(b, s, k, d), axis=2)
    if es.tp:     # expert tensor parallelism: the down projections' partial sums
        out = (jax.lax.psum_scatter(out, es.tp, scatter_dimension=1, tiled=True)
               if es.sequence_parallel else jax.lax.psum(out, es.tp))
    return out


def _vary_like(w, like):
    missing = tuple(sorted(set(jax.typeof(like).mat.varying) - set(jax.typeof(w).mat.varying)))
    return jax.lax.pcast(w, missing, to="varying") if missing else w
