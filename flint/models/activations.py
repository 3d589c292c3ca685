"""The activations a Megatron-Core + Transformer Engine layer keeps for its backward.

A JAX program saves what XLA's rematerialization leaves live, which is not what Megatron
saves (XLA keeps the sequence-gathered GEMM inputs, f32 norm intermediates, and both bf16
and FP8 copies of a tensor; Megatron keeps a few named tensors and re-gathers the rest).
For runs whose kernels are Megatron's, a layer's saved bytes follow Korthikanti et al.,
"Reducing Activation Recomputation in Large Transformer Models" (MLSys 2023, arXiv
2205.05198), section 4 and Table 2 (34 s b h / t bytes per layer with tensor and sequence
parallelism and selective recompute, for a GPT layer with 4h GeLU, multi-head attention
and no dropout masks), counted tensor by tensor so that it holds for grouped-query
attention, gated MLPs, FP8 and context parallelism:

- LayerNorm inputs (2 per layer) and the GEMM inputs they produce (QKV, FC1), sharded
  over the sequence with sequence parallelism (Transformer Engine's LayerNormLinear keeps
  its local shard and re-gathers it in the backward); FP8 runs keep the GEMM inputs as
  their FP8 casts (1 byte, what TE's FP8 GEMMs read in the backward);
- Q, K and V (the recomputed attention core's inputs), the core's output (the projection's
  input), FC1's output (both halves of a gated MLP) and FC2's input, split over TP;
- without recompute of the core and without a fused attention kernel: the S x S scores
  and softmax (2 + 2 bytes per element and head);
- full recompute keeps only the layer's input.
Mixture-of-experts layers (Megatron-Core's MoELayer with its token dispatcher): the
router's input and the expert MLP's tensors for the top_k copies of each token this rank
routes (with balanced routing a rank's experts receive as many tokens as it sends),
plus shared experts as a dense MLP. Multi-head latent attention keeps its query and
key/value latents, and Q, K, V at their own head dims.
Dropout masks are not counted (modern recipes run without dropout).
"""
from __future__ import annotations


def megatron_layer_bytes(cfg, run) -> float:
    """Bytes one dense decoder layer keeps from its forward to its backward, per GPU and
    micro-batch. `cfg`: flint.models.decoder.DecoderConfig; `run`: flint.run.TrainingRun."""
    s = run.seq_len / run.cp                 # the sequence this rank holds
    b, h, t = run.micro_batch, cfg.d_model, run.tp
    seq_shard = t if run.sp else 1           # sequence-parallel tensors
    act = 2.0                                # bf16 activations
    # a quantized GEMM input is kept as its cast: FP8 one byte; NVFP4 half a byte and its
    # E4M3 block scale per 16 elements (the column-wise cast the weight gradient reads)
    gemm_in = {"fp8": 1.0, "mxfp8": 1.0, "nvfp4": 0.5 + 1 / 16}.get(run.precision, act)
    residual = act * s * b * h / seq_shard
    if run.remat == "full":
        return residual                      # the layer's input only
    heads = cfg.n_heads
    if cfg.kv_lora:     # MLA: queries/keys of head_dim + rope_dim, values of v_head
        h_q = heads * (cfg.head_dim + cfg.rope_dim)
        h_k, h_v = h_q, heads * cfg.v_head
        latents = act * s * b * (cfg.q_lora + cfg.kv_lora + cfg.rope_dim)
    else:
        h_q = heads * cfg.head_dim
        h_k = h_v = cfg.n_kv_heads * cfg.head_dim
        latents = 0.0
    attention = (residual                                  # LayerNorm 1 input
                 + gemm_in * s * b * h / seq_shard         # QKV GEMM input
                 + latents
                 + act * s * b * (h_q + h_k + h_v) / t     # Q, K, V
                 + act * s * b * h_v / t                   # core output = projection input
                 + (gemm_in * s * b * h_v / t if gemm_in != act else 0.0))  # its FP8 cast
    gated = 2 if cfg.mlp == "swiglu" else 1

    def mlp_tensors(tokens: float, ffn: int) -> float:
        return (act * tokens * gated * ffn / t             # FC1 output
                + gemm_in * tokens * ffn / t)              # FC2 input

    mlp = residual + gemm_in * s * b * h / seq_shard       # LayerNorm 2 input, FC1 input
    if cfg.n_experts:
        routed = s * b * cfg.top_k                          # token copies this rank routes
        # dispatched token copies: the whole sequence's (gathered over TP), each rank
        # holding its 1/t of every expert's FFN
        mlp += gemm_in * routed * h + mlp_tensors(routed, cfg.moe_ffn)
        if cfg.n_shared_experts:
            mlp += mlp_tensors(s * b, cfg.n_shared_experts * cfg.moe_ffn)
    else:
        mlp += mlp_tensors(s * b, cfg.d_ff)
    from flint.stage import attention_core

    scores = 0.0
    if run.remat == "none" and attention_core(run) == "unfused":
        # scores and softmax probabilities, [heads / t, s, s] each (keys over the whole
        # sequence: context parallelism gathers them)
        scores = 4.0 * b * (heads / t) * s * run.seq_len
    return attention + mlp + scores


def stamp_megatron_activations(graph, cfg, run) -> None:
    """Each layer of a layered graph keeps what Megatron-Core + Transformer Engine keep for
    the backward (megatron_layer_bytes), not what XLA's program left live."""
    per_layer = megatron_layer_bytes(cfg, run)
    for n in graph.nodes:
        if n.name.startswith("fwd.layer_") and "composite" in n.meta:
            n.meta["saved_bytes"] = per_layer
    graph.meta["activation_memory"] = "Megatron-Core + Transformer Engine (Korthikanti et al.)"
