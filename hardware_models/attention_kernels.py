"""Attention kernels by era: unfused (scores through HBM), FlashAttention (v1),
FlashAttention-2, FlashAttention-3 and cuDNN fused attention.

meta["attention"]["impl"] names the kernel a run uses: "unfused" (2021 Megatron, PyTorch's
math SDPA: QK^T and PV as batched GEMMs with the S x S scores written to and read back from
HBM by the softmax), "flash1" (FlashAttention v1, 2022-05 to 2023-07: the same tiling with
the work split per head and batch and more non-matmul work, priced as FlashAttention-2's
kernel at FLASH1_SHARE of its rate), "flash2" (FlashAttention-2 and the portable kernels
of its class: PyTorch's flash/memory-efficient SDPA, Triton), "flash3" (FlashAttention-3,
Hopper), "cudnn" (cuDNN fused attention), "native" or absent (the GPU generation's fastest library
kernel: FlashAttention-3 / cuDNN on Hopper and later, FlashAttention-2 on Ampere; the
spec's `attention_fraction_native` says which rate that reaches).

Fused kernels run one CTA per (batch, head, 128-row block of queries) that walks the
key/value blocks it needs (all of them, or those up to its diagonal when causal), plus the
pipeline's fill and drain; CTAs run in waves over the SMs. A block is two GEMMs (QK^T, PV;
five in the backward pass) at the family's tensor rate, then one exponential per score on
the special-function units. The FlashAttention-3 paper's forward figures (arXiv
2407.08608, Fig. 5, H100) fix how the two add up: per 128 x 128 block its time grows
linearly with the head dim from an intercept that equals the block's 16,384 exponentials
at 16 per clock per SM (497 / 648 / 756 TFLOP/s at head dim 64 / 128 / 256 are a
constant ~0.5 us plus GEMM time proportional to the head dim), for FlashAttention-2 and
-3 alike: the exponentials do not hide behind the GEMMs of the same CTA. The family's rate
is its published forward figure at head dim 128 on long sequences, exponentials included
(the spec's `attention_fraction` / `attention_fraction_native`); the GEMM-only rate is
recovered from it. The backward's five GEMMs run at the rate that leaves the same anchor
block at BACKWARD_SHARE of the forward's rate (FA3 paper, Fig. 7). Unfused attention is
priced as its GEMMs (kernels.gemm_time, each bound by its own operand and score traffic)
plus the softmax's passes over the scores.
"""
from __future__ import annotations

import math

from flint.hardware_models import kernels

ATTENTION_BLOCK_ROWS = 128      # query rows per CTA in FlashAttention-2/3 and cuDNN kernels
# The native kernels' anchor: FlashAttention-3 on H100 SXM5 reaches 648 TFLOP/s forward
# (FA3 paper, Fig. 5: bf16, head dim 128, 4k-16k tokens) of a 989.4 TFLOP/s dense peak
# over 132 SMs at 1.83 GHz, 16 exponentials per clock per SM. With a block's exponentials
# taken out, its two GEMMs run at NATIVE_MMA_SHARE (0.97) of the dense peak.
FA3_H100 = {"rate": 648e12, "peak": 989.4e12, "sms": 132, "exp_rate": 132 * 16 * 1.83e9}
# the anchor's block: two GEMMs (QK^T, PV) of 128 x 128 at head dim 128
ANCHOR_BLOCK_FLOPS = 2.0 * 2 * ATTENTION_BLOCK_ROWS ** 2 * 128
# FlashAttention v1 against FlashAttention-2 on the same GPU: the FA2 paper's abstract
# (Dao, arXiv 2307.08691) puts FlashAttention at "only 25-40% of the theoretical maximum
# FLOPs/s" on A100 and FlashAttention-2 at 50-73% ("around 2x speedup"): the ratio of the
# two ranges' midpoints. Rule for other GPUs: the same ratio to the spec's FlashAttention-2
# figure (attention_fraction), FlashAttention v1 having no kernels of its own for later
# architectures.
FA1_A100_RANGE, FA2_A100_RANGE = (0.25, 0.40), (0.50, 0.73)
# A fused kernel's backward against its forward on the same GPU. Per 128 x 128 block the
# backward runs five GEMMs (S recomputed, dP, dV, dK, dQ) against the forward's two,
# recomputes the block's exponentials once, forms dS = P * (dP - D) and accumulates dQ in
# fp32 across the key blocks (atomic adds in FlashAttention-2, a separate reduction in
# FlashAttention-3). Measured, all three library families run their backward at about
# the same share of their forward rate at head dim 128 on long sequences: FlashAttention-3
# paper (Shah et al., arXiv 2407.08608), Fig. 7 (backward) against Fig. 5 (forward), bf16,
# H100 SXM5, 16k tokens: FlashAttention-2 322 / 370, cuDNN 516 / 595, FlashAttention-3
# 561 / 648 TFLOP/s (0.870, 0.867, 0.866). The exponentials are paid once per score, so
# the share falls on the GEMM part: the backward's GEMM rate is what leaves the anchor's
# backward at BACKWARD_SHARE of its forward with one block of exponentials in it (head dim
# 64 then follows, FA2 and FA3 within 3% and cuDNN within 11% on long sequences:
# scripts/compare_kernels.py). Rule for other GPUs: the same
# share of each GPU's own forward figure (the extra work is the algorithm's, per block).
BACKWARD_SHARE = 0.867
FLASH1_SHARE = sum(FA1_A100_RANGE) / sum(FA2_A100_RANGE)
FUSED = ("flash1", "flash2", "flash3", "cudnn", "native")
NATIVE = ("flash3", "cudnn", "native")
# Unfused softmax passes over the S x S scores in HBM, besides the GEMMs that write and
# read them. Megatron-LM (library kernels): one fused scale-mask-softmax kernel reads the
# scores and writes the probabilities (FusedScaleMaskSoftmax); its backward reads the
# probabilities and their gradient and writes the scores' gradient. PyTorch eager: a
# causal mask is its own masked_fill (read and write), and softmax over rows longer than
# 1024 elements runs cunn_SoftMaxForward, which reads a row three times (max, sum of
# exponentials, output) and writes it once; its backward reads the output and its gradient
# twice and writes once (aten/src/ATen/native/cuda/SoftMax.cu). Rows of at most 1024
# elements and 4096 bytes run its persistent kernel instead, a row read once, but the
# FlashAttention-3 paper's PyTorch "standard attention" at sequence 512 and 1024 runs
# slower than even the three-read count allows (scripts/compare_kernels.py, forward: one
# read puts those 8 points 30-52% too fast, three reads 2% too slow to 39% too fast), so
# every row keeps the three-read count: the short-row gap is not explained.
UNFUSED_SOFTMAX_PASSES = {("library", False): 2, ("library", True): 3,
                          ("eager", False): 4, ("eager", True): 5}
EAGER_MASK_PASSES = 2


# PyTorch's scaled_dot_product_attention: the fused kernels it selects among on NVIDIA GPUs
# for the inputs of a training step (its flash back end, FlashAttention-2, and cuDNN's),
# and the one a torch-made attention node that names none runs. SDPA picks its backend by
# a fixed priority with its vendored FlashAttention-2 first (aten/src/ATen/native/
# transformers/sdp_utils: flash, efficient, math, cudnn; pytorch/pytorch issue #138907),
# and a PyTorch H100 profile shows exactly that kernel (`pytorch_flash::flash_fwd_kernel`
# in ../shared/traces/tracelens_qwen1.5-0.5b_fwd_1xH100): FlashAttention-2 class on every
# GPU, not the generation's FlashAttention-3 / cuDNN kernels that Megatron-Core
# (Transformer Engine) and XLA (cuDNN) run. Later PyTorch puts cuDNN first on sm90, sm100
# and sm103 (pytorch/pytorch PRs #162073 for 2.9, #170800), but not in builds against CUDA
# before 12.9 (PR #171627, 2026-01; huggingface/transformers PR #48163, 2026-08, still
# finds FlashAttention-2 there); the H200 capture's torch 2.11 + CUDA 13.0 step ran cuDNN's
# kernels (scripts/tables/h200_capture/torch_step_trace.json.gz). The default stays the
# published PyTorch runs' FlashAttention-2; a run or a traced program on such a build
# names cudnn (a trace recorded on a GPU names the kernel it ran).
SDPA_KERNELS = ("flash2", "cudnn")
SDPA_DEFAULT = "flash2"
# GPU generations with no fused attention kernel: their attention is unfused (a run's
# `flash` compiles the unfused program there: flint.stage.attention_core). Volta (V100,
# sm_70): FlashAttention v1 and v2 support Turing and later only (Dao-AILab/flash-attention
# issue #148: Volta's m8n8k4 MMA needs another shared-memory layout, "no longer planning
# to work on V100"), cuDNN's fused attention and PyTorch's flash SDPA back end need sm80
# (pytorch aten/src/ATen/native/transformers/cuda/sdp_utils.cpp); Megatron-LM of the V100
# era (2019-2020) runs QK^T and PV as batched GEMMs around its FusedScaleMaskSoftmax
# (megatron/model/fused_softmax.py).
UNFUSED_GENERATIONS = ("volta",)
#
# What a graph's fused-attention node runs on a generation that lacks the kernel it names
# (a graph compiled for another GPU's target names cuDNN's): on Volta, unfused (above); on
# AMD Instinct CDNA 3, the GPU's own fused kernels (Transformer Engine on ROCm runs
# Composable Kernel's fused attention with AITER's v3 assembly kernels by default:
# ROCm/TransformerEngine README, NVTE_CK_USES_FWD_V3 / NVTE_CK_USES_BWD_V3 = 1), priced at
# the spec's `attention_fraction_native`.
GENERATION_FAMILIES = {"volta": dict.fromkeys(("native", "cudnn", "flash3"), "unfused"),
                       "cdna3": {"cudnn": "native", "flash3": "native"}}
# The GPU generation's own fused kernels in words, where they are not NVIDIA's
NATIVE_NAMES = {"cdna3": "the GPU's own (Composable Kernel / AITER FlashAttention on AMD "
                         "Instinct)"}
# Each family in words, as a prediction states it
FAMILY_NAMES = {"unfused": "unfused (S x S scores through HBM)", "flash1": "FlashAttention v1",
                "flash2": "FlashAttention-2", "flash3": "FlashAttention-3",
                "cudnn": "cuDNN fused attention",
                "native": "the GPU generation's own (FlashAttention-3 / cuDNN class on Hopper "
                          "and later, FlashAttention-2 on Ampere)"}


def compiled_core(attention: str, hardware: str) -> str:
    """The attention core a run's stage compiles: its own, except `flash` (the kernel of
    the framework on the GPU's generation) on a generation without fused attention
    kernels (UNFUSED_GENERATIONS), whose frameworks run it unfused, the S x S scores
    through HBM."""
    if attention != "flash":
        return attention
    from flint.hardware_models.nccl import generation
    from flint.hardware_models.spec import load_spec

    spec = load_spec(hardware)
    if spec.kind == "gpu" and generation(spec.name, spec.model) in UNFUSED_GENERATIONS:
        return "unfused"
    return attention


def family(attn: dict | None, default: str = "native", generation: str = "") -> str:
    """The kernel family an attention node runs: the one it names, else `default` (the
    GPU generation's own, or SDPA_DEFAULT for a node PyTorch launches), as `generation`
    runs it (GENERATION_FAMILIES)."""
    impl = (attn or {}).get("impl") or default
    kind = impl if impl in FUSED + ("unfused",) else "native"
    return GENERATION_FAMILIES.get(generation, {}).get(kind, kind)


def family_name(kind: str, generation: str = "") -> str:
    """A family in words, as a prediction states it."""
    if kind == "native" and generation in NATIVE_NAMES:
        return NATIVE_NAMES[generation]
    return FAMILY_NAMES[kind]


def fused_time(flops: float, attn: dict | None, rate: float, sms: int,
               exp_rate: float = 0.0, free: int | None = None) -> float:
    """A fused (flash) attention kernel; `rate` the family's published tensor rate at head
    dim 128 with the exponentials included, `exp_rate` the GPU's exponentials per second;
    `free`: the SMs its CTAs can take beside other kernels (its grid, one CTA per query
    block and head, fills waves of them; kernels.gemm_time)."""
    slower = kernels.sm_share(sms, free)
    if not attn or sms <= 0:
        return flops / rate * slower
    dims = _dims(attn)
    if dims is None:
        return flops / rate * slower
    batch, heads, seq_q, seq_kv, dim = dims
    rows = cols = ATTENTION_BLOCK_ROWS
    q_blocks, kv_blocks = math.ceil(seq_q / rows), math.ceil(seq_kv / cols)
    if attn.get("causal"):
        visits = sum(min(kv_blocks, math.ceil(min((i + 1) * rows, seq_q) * seq_kv / seq_q / cols))
                     for i in range(q_blocks))
    else:
        visits = q_blocks * kv_blocks
    backward = bool(attn.get("backward"))
    gemms = 5 if backward else 2
    per_sm = rate / sms
    block_mm = 2.0 * gemms * rows * cols * dim
    block_exp = _block_exp(sms, exp_rate)
    # rate is the anchor's effective forward rate, exponentials included: take them out
    # (the backward's anchor: its 2.5x the work at BACKWARD_SHARE of that rate)
    ref_mm = ANCHOR_BLOCK_FLOPS * gemms / 2
    ref_time = ref_mm / (per_sm * (BACKWARD_SHARE if backward else 1.0))
    mm_rate = ref_mm / max(ref_time - block_exp, 0.25 * ref_time)
    t_block = block_mm / mm_rate + block_exp
    ctas = batch * heads * q_blocks
    per_cta = (visits / q_blocks + kernels.PIPELINE_STEPS) * t_block
    over = max(min(free, sms), 1) if free is not None else sms     # the SMs its CTAs get
    return math.ceil(ctas / over) * per_cta


def _block_exp(sms: int, exp_rate: float) -> float:
    """Seconds one SM spends on a 128 x 128 block's exponentials."""
    return ATTENTION_BLOCK_ROWS ** 2 / (exp_rate / sms) if exp_rate and sms else 0.0


def mma_share(rate: float, peak: float, sms: int, exp_rate: float) -> float:
    """Share of the dense peak a fused kernel's GEMMs reach, given its anchor `rate` at
    head dim 128 (exponentials included) on a GPU of `sms` SMs and `exp_rate`."""
    ref_mm = ANCHOR_BLOCK_FLOPS
    return ref_mm / (ref_mm / (rate / sms) - _block_exp(sms, exp_rate)) / (peak / sms)


NATIVE_MMA_SHARE = mma_share(**FA3_H100)


def native_rate(peak: float, sms: int, exp_rate: float) -> float:
    """The anchor rate (head dim 128, exponentials included) of a GPU's native fused
    kernels where no measurement of its own is published: their GEMMs at Hopper's share
    of the dense peak (NATIVE_MMA_SHARE), the exponentials at the GPU's own SFU rate, one
    after the other as FA3's figures show on H100. On Blackwell (16 exponentials per clock
    per SM against twice Hopper's tensor rate per SM) the exponentials take about half of
    a block; Blackwell Ultra doubles the SFU rate for that reason (kernels.py)."""
    ref_mm = ANCHOR_BLOCK_FLOPS
    per_sm = peak * NATIVE_MMA_SHARE / sms
    return ref_mm / (ref_mm / per_sm + _block_exp(sms, exp_rate)) * sms


def unfused_time(attn: dict, gemm_rate: float, sms: int, bandwidth: float, floor: float,
                 persistent: bool = False, eager: bool = False,
                 elem_bytes: int = 2) -> float | None:
    """Unfused attention: the score GEMMs (QK^T and PV forward; PV's two and QK^T's two
    gradients backward) as batched GEMMs over batch x heads, each at least as long as
    its operands and result take through HBM, plus the softmax passes over the scores;
    every kernel but the first pays `floor` (the node's own floor is the caller's). A
    causal mask saves nothing: the full S x S scores are computed and masked."""
    dims = _dims(attn)
    if dims is None:
        return None
    batch, heads, sq, skv, d = dims
    bh = batch * heads
    scores = float(bh) * sq * skv * elem_bytes
    qkv = float(bh) * (sq + skv) * d * elem_bytes

    def gemm(m: int, n: int, k: int, out_scores: bool) -> float:
        t = kernels.gemm_time(kernels.GemmShape(bh, m, n, k), gemm_rate, sms, persistent)
        moved = qkv + scores if out_scores else scores + qkv
        return max(t, moved / bandwidth)

    if attn.get("backward"):
        mm = (gemm(skv, d, sq, False) + gemm(sq, skv, d, True)       # dV = P^T dO, dP
              + gemm(sq, d, skv, False) + gemm(skv, d, sq, False))    # dQ = dS K, dK
        launches = 4
    else:
        mm = gemm(sq, skv, d, True) + gemm(sq, d, skv, False)         # S = QK^T, O = PV
        launches = 2
    backward = bool(attn.get("backward"))
    passes = UNFUSED_SOFTMAX_PASSES[("eager" if eager else "library", backward)]
    softmax_kernels = 1
    if eager and attn.get("causal") and not backward:
        passes += EAGER_MASK_PASSES
        softmax_kernels += 1
    return (mm + passes * scores / bandwidth
            + (launches + softmax_kernels - 1) * floor)


def _dims(attn: dict):
    try:
        dims = (int(attn["batch"]), int(attn["heads"]), int(attn["seq_q"]),
                int(attn["seq_kv"]), int(attn["head_dim"]))
    except (KeyError, TypeError, ValueError):
        return None
    return dims if min(dims) > 0 else None
