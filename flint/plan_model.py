"""The planner's cheap pass: a closed-form step time and memory for every candidate, from
the model's dimensions and the hardware spec's figures only (the same figures the cost
model reads), so tens of thousands of layouts are ranked in about a second and only the
best few are compiled and priced by flint.engine.predict.

    facts = ModelFacts.of(model_config(request))
    est = analytic(candidate, request, facts, Machine(load_spec(request.hardware, what_if)))
    est.step_s, est.memory_bytes, est.memory_floor_bytes, est.parts

Every constant is a spec figure (peak FLOP/s per dtype, the GEMM, attention and HBM
shares of those peaks that kernels.figure reads, link bandwidths with the network
model's bus efficiencies, NCCL's per-step latencies) or a count of the model's own
tensors; the rules:
- compute: the model's FLOPs (flint.models.decoder.model_flops, 6 per weight per token)
  over tp x cp x pp, GEMMs at the precision's peak x gemm_fraction, causal flash
  attention (forward 2 GEMMs, backward 5: 3.5x the forward) at the bf16 peak x the
  native attention share; recompute adds the forward again (full) or the attention
  core's forward (selective);
- every kernel takes at least the spec's kernel_floor (36 per layer and micro-batch);
- memory-bound kernels: each layer's norms, residual adds, rotary embedding and gated
  activation read and write their tensors once in the forward and twice in the backward
  (again in a full recompute), plus the fp32 cross-entropy over the vocabulary;
- communication on the compute stream (Megatron-Core runs these synchronously): TP's
  all-gathers/reduce-scatters (4 per layer forward, 4 backward), CP's key/value
  all-gather and gradient reduce-scatter, EP's dispatch/combine all-to-alls; pipeline
  sends of each micro-batch's boundary activation; data-parallel gradient
  reduce-scatter and parameter all-gather overlapped with the last backward / first
  forward (ZeRO-3: every micro-batch's all-gathers and reduce-scatter overlapped with
  its compute); ring algorithm times (p-1)/p x bytes / bus bandwidth, a group's
  bandwidth the scale-up links' while it stays in the NVLink domain, else its members'
  NICs per domain (NCCL runs one ring per NIC), spine oversubscription past a leaf;
- pipeline: (m + (pp - 1) / vp) x the stage's micro-batch time, times the granularity
  loss of splitting the layers into pp x vp chunks; the Adam update streams its state
  once (read parameter, gradient, two moments, write three back);
- memory per device (the zoo's conventions: fp32 parameters and gradients, 12 bytes of
  Adam state per parameter sharded over data parallelism by ZeRO): weights, gradients,
  optimizer state, activations stored per layer for the layers and micro-batches a
  pipeline stage holds in flight (Korthikanti et al. 2022's accounting applied to this
  model's tensors), the logits. `memory_floor_bytes` keeps only what every policy must
  hold (weights, gradients, optimizer state, each layer's input): a lower bound used to
  prune, never to decide.
The pass ranks; predict decides. The search corrects it by what predict says of the
candidates it prices (flint.plan_search).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

BF16 = 2
FP32 = 4
ADAM_STATE_BYTES = 12          # fp32 master copy is the parameter itself; m and v + master
ADAM_STREAM_BYTES = 28         # read p, g, m, v (4 B each), write p, m, v
# Forward passes a layer's memory-bound kernels make over its tensors (the backward
# reads the saved inputs and the output gradient and writes the input gradient: twice).
BACKWARD_OVER_FORWARD = 2.0
FLASH_BACKWARD_GEMMS = 5 / 2   # FlashAttention-2/3 backward: 5 GEMMs to the forward's 2
CROSS_ENTROPY_PASSES = 4       # fp32 logits: write, softmax read+write, gradient write
# Kernels one layer launches per micro-batch: forward two norms, the QKV GEMM, rotary,
# attention, the output GEMM, a residual add, the up/gate GEMM, the activation, the down
# GEMM, a residual add (12); the backward about twice that. Each runs at least the spec's
# kernel_floor, which bounds a small model's layer from below.
KERNELS_PER_LAYER = 36


@dataclass(frozen=True)
class ModelFacts:
    """The model's counts the closed form needs (computed once per model)."""

    layers: int
    moe_layers: int
    d_model: int
    d_ff: int                  # the dense MLP's hidden (MoE: experts' active hidden)
    gated: bool
    q_dim: int
    kv_dim: int
    score_dims: int            # per head: query/key plus value dims of the S x S GEMMs
    heads: int
    vocab: int
    seq: int
    params: int
    expert_params: int
    top_k: int
    flops_per_token: float     # model_flops per token (6 per weight + attention scores)
    attention_flops_per_token: float   # the attention-score part of it (full S x S)

    @classmethod
    def of(cls, cfg) -> "ModelFacts":
        from flint.models.decoder import model_flops, param_count

        moe_layers = cfg.n_layers - cfg.first_dense if cfg.n_experts else 0
        experts = moe_layers * cfg.n_experts * 3 * cfg.d_model * cfg.moe_ffn
        hd = cfg.head_dim
        if cfg.kv_lora:
            q_dim = cfg.n_heads * (hd + cfg.rope_dim)
            kv_dim = cfg.n_heads * (hd + cfg.rope_dim + cfg.v_head)
            score = hd + cfg.rope_dim + cfg.v_head
        else:
            q_dim, kv_dim, score = cfg.n_heads * hd, 2 * cfg.n_kv_heads * hd, 2 * hd
        ffn = ((cfg.top_k + cfg.n_shared_experts) * cfg.moe_ffn if cfg.n_experts
               else cfg.d_ff)
        attn = 6.0 * cfg.n_layers * cfg.n_heads * score * cfg.seq_len
        return cls(layers=cfg.n_layers, moe_layers=moe_layers, d_model=cfg.d_model,
                   d_ff=ffn, gated=cfg.mlp == "swiglu" or bool(cfg.n_experts), q_dim=q_dim,
                   kv_dim=kv_dim, score_dims=score, heads=cfg.n_heads, vocab=cfg.vocab,
                   seq=cfg.seq_len, params=param_count(cfg), expert_params=experts,
                   top_k=cfg.top_k, flops_per_token=model_flops(cfg, 1),
                   attention_flops_per_token=attn)

    def stored_per_token(self) -> dict:
        """Elements one layer keeps for its backward, per token (no parallelism):
        replicated across TP without sequence parallelism (`h`) or always split (`split`)."""
        h, f = self.d_model, self.d_ff
        mlp = 3 * f if self.gated else 2 * f
        # layer input, norm outputs (2), residual, attention output: sequence-sharded by
        # SP; queries, keys/values, MLP hidden: split over the heads / FFN by TP
        return {"h": 5 * h, "split": self.q_dim + self.kv_dim + self.q_dim + mlp}

    def elementwise_per_token(self) -> dict:
        """Elements one layer's memory-bound kernels move in the forward, per token."""
        h, f = self.d_model, self.d_ff
        # two norms (read, write), two residual adds (read 2, write 1), rotary on q/k,
        # the gated activation (read 2, write 1) or GeLU (read, write)
        return {"h": 2 * 2 * h + 2 * 3 * h,
                "split": 2 * (self.q_dim + self.kv_dim // 2) + (3 * f if self.gated else 2 * f)}


@dataclass(frozen=True)
class Estimate:
    step_s: float
    memory_bytes: float
    memory_floor_bytes: float
    activations_bytes: float   # the activations and logits in memory_bytes (the uncertain part)
    parts: dict                # seconds per component (the why of the closed form)


class Machine:
    """The spec's figures the closed form reads, looked up once (a plan evaluates the
    closed form for tens of thousands of layouts)."""

    def __init__(self, spec):
        from flint.hardware_models.compute import attention_rate
        from flint.hardware_models.kernels import figure
        from flint.hardware_models.nccl import HOP_LATENCY_US
        from flint.hardware_models.network import DEFAULT_BUS_EFFICIENCY

        self.spec = spec
        self.rate = {"bf16": spec.peak("bf16") * figure(spec, "gemm_fraction")}
        for dtype in ("fp8", "fp4"):
            if dtype in spec.peak_flops:
                self.rate[dtype] = spec.peak(dtype) * figure(spec, "gemm_fraction")
        self.attention = attention_rate(spec, spec.peak("bf16"), native=True)[0]
        self.hbm = spec.hbm_bandwidth * figure(spec, "hbm_fraction")
        self.kernel_floor = figure(spec, "kernel_floor")
        self.up = (spec.scale_up_bandwidth or spec.nic_bandwidth) * \
            DEFAULT_BUS_EFFICIENCY["scale_up"]
        self.nic = (spec.nic_bandwidth or spec.scale_up_bandwidth) * \
            DEFAULT_BUS_EFFICIENCY["scale_out"]
        self.hop_up = HOP_LATENCY_US["nvlink"]["ring"]["Simple"] * 1e-6
        self.hop_net = HOP_LATENCY_US["net"]["ring"]["Simple"] * 1e-6
        self._links: dict = {}

    def gemm_rate(self, precision: str) -> float:
        return self.rate[{"bf16": "bf16", "nvfp4": "fp4"}.get(precision, "fp8")]

    def link(self, size: int, stride: int) -> tuple[float, float, bool]:
        """(bus bandwidth B/s per rank, per-step latency s, crosses the network) of a
        group of `size` ranks `stride` devices apart (Megatron's rank order: tp
        innermost): the NVLink's inside the domain, else the NICs of the group's members
        in one domain (NCCL runs a ring per NIC), the spine's oversubscription past a
        leaf."""
        hit = self._links.get((size, stride))
        if hit is None:
            spec, span = self.spec, size * stride
            if span <= spec.scale_up_domain:
                hit = (self.up, self.hop_up, False)
            else:
                nic = self.nic
                if spec.leaf_group and span > spec.leaf_group:
                    nic /= max(spec.oversubscription, 1.0)
                per_domain = max(1, min(size, spec.scale_up_domain // max(stride, 1)))
                hit = (min(self.up, per_domain * nic), self.hop_net, True)
            self._links[(size, stride)] = hit
        return hit

    def ring(self, size: int, stride: int, nbytes: float, passes: float = 1.0) -> float:
        """`passes` ring all-gathers/reduce-scatters of `nbytes` (the gathered size)."""
        if size <= 1 or nbytes <= 0:
            return 0.0
        bw, hop, _ = self.link(size, stride)
        return passes * ((size - 1) / size * nbytes / bw + (size - 1) * hop)

    def all_to_all(self, size: int, stride: int, nbytes: float) -> float:
        """One all-to-all of `nbytes` per rank: the share leaving the NVLink domain goes
        through the rank's own NIC, the rest over NVLink."""
        if size <= 1:
            return 0.0
        up_bw, hop, crosses = self.link(size, stride)
        if not crosses:
            return (size - 1) / size * nbytes / up_bw + hop
        domain = self.spec.scale_up_domain
        inside = max(1, min(size, domain // max(stride, 1)))
        nic_bw, _, _ = self.link(domain * 2, domain)
        return max((size - inside) / size * nbytes / nic_bw,
                   (inside - 1) / size * nbytes / up_bw) + hop


def _stage_micro(c, request, facts: ModelFacts, machine: Machine) -> tuple:
    """One micro-batch on one device of one stage: (GEMM s, attention s, memory-bound s,
    the kernels' floor s, TP s, CP s, EP s, one activation's bytes)."""
    tp, cp, pp, ep, mb = c.tp, c.cp, c.pp, c.ep, c.micro_batch
    sp = tp > 1
    tokens = mb * request.seq_len                  # one micro-batch of one data rank
    tok_dev = tokens / cp                          # its tokens on one context rank
    layers_stage = facts.layers / pp
    flops = facts.flops_per_token * tokens / (tp * cp * pp)
    attn_model = facts.attention_flops_per_token * tokens / (tp * cp * pp)
    gemm = flops - attn_model
    # causal flash attention does half the S x S work; backward 2.5x the forward
    attn_fwd = attn_model / 3 / 2
    attn = attn_fwd * (1 + FLASH_BACKWARD_GEMMS)
    if c.remat == "full":
        gemm, attn = gemm + gemm / 3, attn + attn_fwd
    elif c.remat == "selective":
        attn += attn_fwd
    t_gemm, t_attn = gemm / machine.gemm_rate(c.precision), attn / machine.attention
    ew = facts.elementwise_per_token()
    per_token = ew["h"] / (tp if sp else 1) + ew["split"] / tp
    passes = 1 + BACKWARD_OVER_FORWARD + (1 if c.remat in ("full", "dots") else 0)
    ew_bytes = per_token * tok_dev * layers_stage * BF16 * passes
    ew_bytes += tok_dev * facts.vocab / tp * FP32 * CROSS_ENTROPY_PASSES / pp
    t_mem = ew_bytes / machine.hbm
    min_compute = KERNELS_PER_LAYER * (4 / 3 if c.remat == "full" else 1) * layers_stage * \
        machine.kernel_floor
    act = tok_dev * facts.d_model * BF16           # one activation [tokens, hidden]
    recompute = 1 if c.remat == "full" else 0
    t_tp = machine.ring(tp, 1, act, (8 + 4 * recompute) * layers_stage)
    kv = tok_dev * facts.kv_dim / tp * BF16 * cp   # gathered keys/values of one layer
    t_cp = machine.ring(cp, tp, kv, (2 + recompute) * layers_stage)
    t_ep = 0.0
    if ep > 1 and facts.moe_layers:
        routed = tok_dev / (tp if sp else 1) * facts.top_k * facts.d_model * BF16
        t_ep = machine.all_to_all(ep, tp * cp, routed) * (4 + 2 * recompute) * \
            facts.moe_layers / pp
    return t_gemm, t_attn, t_mem, min_compute, t_tp, t_cp, t_ep, act


def analytic(c, request, facts: ModelFacts, machine: Machine, memo: dict | None = None) \
        -> Estimate:
    """The closed-form step time and memory of candidate `c` (a plan_space.Candidate).
    `memo`: a dict kept across the candidates of one request (their per-micro-batch
    stage costs repeat)."""
    tp, cp, pp, vp, ep, mb = c.tp, c.cp, c.pp, c.vp, c.ep, c.micro_batch
    dp = c.dp
    m = request.global_batch // (dp * mb)
    sp = tp > 1
    tok_dev = mb * request.seq_len / cp            # a micro-batch's tokens on one rank
    layers_stage = facts.layers / pp
    key = (tp, cp, ep, mb, c.remat, c.precision, pp)
    stage = memo.get(key) if memo is not None else None
    if stage is None:
        stage = _stage_micro(c, request, facts, machine)
        if memo is not None:
            memo[key] = stage
    t_gemm, t_attn, t_mem, min_compute, t_tp, t_cp, t_ep, act = stage
    p2p = 0.0
    if pp > 1:
        bw, hop, _ = machine.link(2, c.devices // pp)
        p2p = 2 * vp * (act / (tp if sp else 1) / bw + hop)
    micro = max(t_gemm + t_attn + t_mem, min_compute) + t_tp + t_cp + t_ep + p2p

    # --- pipeline -----------------------------------------------------------------------
    chunks = pp * vp
    granularity = math.ceil(facts.layers / chunks) * chunks / facts.layers
    pipe = (m + (pp - 1) / vp) * micro * granularity

    # --- data parallelism, optimizer ------------------------------------------------------
    expert_share = facts.expert_params / facts.params if facts.params else 0.0
    dense_params = facts.params * (1 - expert_share) / (tp * pp)
    expert_params = facts.params * expert_share / (tp * pp * ep)
    params_dev = dense_params + expert_params
    rest = dp // ep
    shard = (c.hsdp or rest) if c.zero == 3 else 1
    stride = tp * cp * ep
    if c.zero == 3:
        per_mb = machine.ring(shard, stride, params_dev * BF16, 3)
        exposed = m * max(0.0, per_mb - micro)
        replicas = rest // shard
        exposed += machine.ring(replicas, stride * shard, params_dev / shard * BF16, 2)
        state_over = shard
    elif c.zero and c.hsdp and c.hsdp < rest:
        # the optimizer's shard group: reduce-scatter inside it, the shard all-reduced
        # across the groups, the parameters gathered inside it
        grads = (machine.ring(c.hsdp, stride, params_dev * BF16)
                 + machine.ring(rest // c.hsdp, stride * c.hsdp, params_dev / c.hsdp * BF16, 2))
        gather = machine.ring(c.hsdp, stride, params_dev * BF16)
        exposed = max(0.0, grads - micro * 2 / 3) + max(0.0, gather - micro / 3)
        state_over = c.hsdp * ep
    else:
        grads = machine.ring(rest, stride, params_dev * BF16,
                          2 if c.zero == 0 else 1)
        gather = machine.ring(rest, stride, params_dev * BF16) if c.zero else 0.0
        exposed = max(0.0, grads - micro * 2 / 3) + max(0.0, gather - micro / 3)
        state_over = dp if c.zero else 1
    t_opt = params_dev / state_over * ADAM_STREAM_BYTES / machine.hbm
    step = pipe + exposed + t_opt

    # --- memory ---------------------------------------------------------------------------
    weights = params_dev * FP32 / shard
    grads_b = params_dev * FP32 / (shard if c.zero == 3 else state_over if c.zero == 2
                                   else 1)
    optimizer = params_dev * ADAM_STATE_BYTES / state_over
    stored = facts.stored_per_token()
    per_layer = {"h": stored["h"] / (tp if sp else 1), "split": stored["split"] / tp}
    layer_in = facts.d_model / (tp if sp else 1)
    if c.remat == "full":
        kept = layer_in
        working = per_layer["h"] + per_layer["split"]       # one layer recomputed
    elif c.remat == "dots":
        kept, working = per_layer["split"] + layer_in, 0.0
    else:
        kept, working = per_layer["h"] + per_layer["split"], 0.0
    in_flight = 1 if pp == 1 else min(pp, m) * (1 + (pp - 1) / (pp * vp) if vp > 1 else 1)
    acts = (kept * layers_stage * in_flight + working) * tok_dev * BF16
    logits = tok_dev * facts.vocab / tp * FP32 * 2
    memory = weights + grads_b + optimizer + acts + logits
    floor = weights + grads_b + optimizer + layer_in * layers_stage * in_flight * tok_dev * BF16
    parts = {"kernel_floor_s": max(min_compute - t_gemm - t_attn - t_mem, 0.0) * m,
             "gemm_s": t_gemm * m, "attention_s": t_attn * m, "memory_bound_s": t_mem * m,
             "tp_s": t_tp * m, "cp_s": t_cp * m, "ep_s": t_ep * m, "p2p_s": p2p * m,
             "bubble_s": pipe - m * micro, "dp_exposed_s": exposed, "optimizer_s": t_opt}
    return Estimate(step, memory, floor, acts + logits, parts)
