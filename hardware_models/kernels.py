"""How long one GPU kernel runs, from the device's published architecture.

A node's time is   floor + max(compute time, memory time)

- GEMMs (and convolutions) run as CTA tiles spread over the SMs: a kernel takes as many
  waves as ceil(tiles / SMs), each wave as long as one tile's main loop (its K steps plus
  the pipeline's fill and drain; on Hopper and later the persistent kernels pay the fill
  once per SM) at the SM's share of the achievable tensor rate. cuBLAS picks the tile
  shape; the model takes the fastest of the shapes cuBLAS/CUTLASS ship for large bf16
  GEMMs. Small and skinny GEMMs lose to quantization exactly as they do on the device;
  large ones approach the achievable fraction of peak that public cuBLAS figures show
  (`gemm_fraction` in the spec).
- Attention kernels by era: attention_kernels.py (unfused, FlashAttention-2/3, cuDNN).
- Memory-bound work moves its bytes at the achievable share of HBM bandwidth that public
  stream benchmarks reach (`hbm_fraction`), bounded per kernel population
  (populations.py): XLA's reductions keep fewer bytes in flight per SM than vectorized
  kernels, so by Little's law they are bounded by the SMs their grid occupies x a per-SM
  sustained rate.
- Other arithmetic runs on the FP32 vector units; an FP32 peak counts an FMA as two FLOPs
  and elementwise work issues one FLOP per lane and cycle, so it reaches at most half of it.
- Every kernel pays a floor: the time from the start of a grid to the end of its last block
  for a kernel that does almost nothing (`kernel_floor`). XLA on GPU launches through
  command buffers (CUDA graphs), so host launch overhead is not on the device timeline;
  PyTorch eager and Inductor kernels are launched one by one (schedule.py).

TPUs: the matrix unit works on 128 x 128 (v4/v5) tiles; dimensions pad to the tile and
there is no wave model (one or two TensorCores per chip). Host CPUs: the plain roofline.

Each figure comes from the spec (with its source); the defaults below apply where a spec
does not give one and are documented modelling assumptions.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from flint.hardware_models.spec import HardwareSpec

# CTA tiles (rows x columns of C) of cuBLAS/CUTLASS kernels for 16-bit GEMMs on Ampere and
# Hopper: 128x256 and 256x128 are the large-GEMM defaults (CUTLASS profiler's default
# sm80/sm90 bf16 configurations), 128x128 the general fallback, 64x128 the small-M one.
# A 64-row tile runs one warpgroup MMA instead of two: half the data reuse per loaded byte,
# which the model charges as 3/4 of the large tiles' rate (ratio of their arithmetic
# intensities, 64*128/(64+128) vs 128*128/(128+128)).
TILES = ((128, 256, 1.0), (256, 128, 1.0), (128, 128, 1.0), (64, 128, 0.75))
TILE_K = 64                     # K elements per main-loop step (CUTLASS default for 16-bit)
PIPELINE_STEPS = 2              # prologue fill + epilogue, in main-loop steps
TPU_MXU = 128                   # systolic array edge on TPU v4/v5e/v5p (Google Cloud TPU docs);
                                # a spec's `matrix_unit` gives another (v6e: 256)
# Exponentials per clock per SM on the special-function units (CUDA C++ Programming Guide,
# 'Arithmetic Instructions' throughput table: 16 results/clock/SM for exp2 and friends on
# compute capability 8.x and 9.x; the FlashAttention-3 paper quotes 3.9 TFLOP/s of special
# functions for H100 SXM5 = 132 SMs x 16 x 1.83 GHz). Blackwell keeps 16; Blackwell Ultra
# doubles it (NVIDIA Technical Blog, 'Making Softmax More Efficient with NVIDIA Blackwell
# Ultra', 2026), which its specs state as `exponentials_per_clock`.
SFU_EXP_PER_CLOCK_PER_SM = 16

# Per-SM bandwidth that unvectorized compiler-generated memory-bound kernels (XLA's
# reductions, populations.py) sustain on an SM full of their threads. llama.cpp issue #9817 (NVIDIA, 2024): vectorizing the loads of an HBM-bound
# kernel made it 1.33x faster on H100 SXM (HBM3), 1.05x on A100 SXM and 1.01x on GDDR6
# parts: the unvectorized kernel was latency-bound (too few bytes in flight) on H100 only.
# Taking the vectorized kernel at the stream figure, 0.9 x 3.35 TB/s / 1.33 over 132 SMs
# = 17.2 GB/s per SM. Rule for other GPUs: the same per SM (bytes in flight are bounded by
# the SM's thread and register budget, alike on sm80/sm90; DRAM latency is alike too).
GENERATED_BYTES_PER_SM_S = 17.2e9
# The load each thread keeps in flight at that rate (a 4-byte element, below). A kernel
# whose threads load one narrower element each keeps proportionally fewer bytes in flight
# (populations.generated_bandwidth).
GENERATED_LOAD_BYTES = 4
# One DRAM round trip, on the critical path of a fused kernel that reads memory (its first
# loads, its last stores draining; compute.py memory_latency) and absent from the floor of
# a kernel that does almost nothing. By Little's law from the figure above: an SM full of unvectorized threads
# (2048 on sm80/sm90, one 4-byte load in flight each) sustaining 17.2 GB/s waits
# 2048 x 4 B / 17.2 GB/s = 0.48 us per load. Rule for other GPUs: the same (HBM latency in
# ns is alike across HBM2e/HBM3 parts).
MEMORY_LATENCY_S = 2048 * 4 / GENERATED_BYTES_PER_SM_S
# CUTLASS's SIMT (non-tensor-core) SGEMM tiles step K by 8 (default sm80 SIMT threadblock
# 128x128x8), not the tensor-core kernels' 64: a full-FP32 GEMM's main loop in kernels of
# that shape.
TILE_K_SIMT = 8

# Where a spec gives no figure (a modelling assumption, replaced by the spec's sourced
# figure or by calibration): see each GPU spec for the published values.
DEFAULT_FIGURES = {
    "gemm_fraction": 0.75,
    "attention_fraction": 0.45,
    "attention_fraction_native": 0.45,
    "hbm_fraction": 0.85,
    "vector_fraction": 0.5,
}
DEFAULT_FLOOR_S = {"gpu": 1.5e-6, "tpu": 1e-6, "cpu": 1e-6}
# The GPU's idle time between two kernels a stream runs one after the other when each was
# launched on its own (not from a CUDA graph) and the second was already queued: the
# front end starts the next grid only once the last one has drained. Median of the
# kernel-to-kernel gaps under 3 us (the queued ones; longer gaps wait for the host or
# another stream) in public PyTorch (Kineto/CUPTI) profiles: 1.15 us on A100
# (HolisticTraceAnalysis test trace, ResNet-50 DDP, A100-PG509-200; 820 gaps) and 1.18 us
# on H100 (AMD-AGI/TraceLens test trace, Qwen on H100 80GB HBM3; 1201 gaps); the same on
# Ampere and Hopper, so 1.2 us for NVIDIA GPUs. Inside a CUDA graph the gap is gone: the
# kernels of XLA's command buffers in this project's H200 capture (scripts/tables/
# h200_capture/trace, 6433 kernels) start a median -0.03 us after the previous one ends.
# TPUs run a step as one program and CPUs have no launch front end: no gap.
DEFAULT_LAUNCH_GAP_S = {"gpu": 1.2e-6, "tpu": 0.0, "cpu": 0.0}
# The calibratable figures, by op class they govern.
CLASS_FIGURE = {"gemm": "gemm_fraction", "conv": "gemm_fraction",
                "attention": "attention_fraction", "memory": "hbm_fraction",
                "vector": "vector_fraction"}


def given(spec: HardwareSpec, name: str, calibrated: dict | None = None) -> bool:
    """Whether a calibration or the spec states the figure (figure() would not default)."""
    return name in (calibrated or {}) or name in spec.efficiency or bool(getattr(spec, name, 0))


def figure(spec: HardwareSpec, name: str, calibrated: dict | None = None) -> float:
    """A kernel figure: calibrated, else the spec's, else the documented default."""
    for source in (calibrated or {}, spec.efficiency):
        if name in source:
            return float(source[name])
    value = getattr(spec, name, None)
    if value:
        return float(value)
    if name == "kernel_floor":
        return DEFAULT_FLOOR_S.get(spec.kind, 1.5e-6)
    if name == "launch_gap":
        return DEFAULT_LAUNCH_GAP_S.get(spec.kind, 0.0)
    if name == "attention_fraction_native":
        return figure(spec, "attention_fraction", calibrated)
    return DEFAULT_FIGURES[name]


@dataclass(frozen=True)
class GemmShape:
    batch: int
    m: int
    n: int
    k: int


def gemm_shape(flops: float, output: str) -> GemmShape | None:
    """(batch, M, N, K) from a GEMM's FLOPs and its output shape `bf16[b,...,m,n]`."""
    dims = _dims(output)
    if not dims or flops <= 0:
        return None
    if len(dims) == 1:
        dims = [1, dims[0]]
    batch = math.prod(dims[:-2]) if len(dims) > 2 else 1
    m, n = dims[-2], dims[-1]
    elems = batch * m * n
    if elems <= 0:
        return None
    k = max(1, round(flops / (2.0 * elems)))
    return GemmShape(batch, m, n, k)


def gemm_time(shape: GemmShape, rate: float, sms: int, persistent: bool = False,
              tile_k: int = TILE_K, free: int | None = None) -> float:
    """Seconds for the GEMM's main loops at `rate` FLOP/s over `sms` SMs (no floor).
    `persistent`: warp-specialized persistent kernels (Hopper and later: CUTLASS 3's
    KernelTmaWarpSpecializedPersistent schedules, which cuBLAS 12 ships for sm90), whose
    producer warps load the next tile while the consumers finish this one, so an SM pays
    the pipeline's fill once rather than once per tile.
    `free`: the SMs its CTAs can take when other kernels hold the rest (interference.py).
    The tile stays the one picked for the whole GPU: cuBLAS chooses its kernel from the
    device's SM count, not from what is free when it runs (cuBLAS docs,
    CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET: a caller that expects a concurrent stream to hold
    SMs has to say so), so its tiles fill waves of `free` SMs: a one-wave grid of 128
    tiles on an H100 with 16 SMs held takes two waves."""
    if sms <= 0:
        return 2.0 * shape.batch * shape.m * shape.n * shape.k / rate
    per_sm = rate / sms
    main = math.ceil(shape.k / tile_k)

    def steps(tiles: int, over: int) -> int:
        waves = math.ceil(tiles / over)
        return waves * main + PIPELINE_STEPS if persistent else waves * (main + PIPELINE_STEPS)

    # the tile whose waves' main loops take least; where two tie (twice the tiles in
    # twice the waves of half the work), the larger one: the pipeline's fill is one
    # DRAM round trip whichever the tile, so only the model's fill, counted in steps of
    # each tile's own size, would tell them apart
    best, chosen, rank = math.inf, (0, 0.0), (math.inf, 0)
    for rows, cols, tile_eff in TILES:
        tiles = shape.batch * math.ceil(shape.m / rows) * math.ceil(shape.n / cols)
        step = 2.0 * rows * cols * tile_k / (per_sm * tile_eff)
        loops = round(math.ceil(tiles / sms) * main * step, 15)
        if (loops, tiles) < rank:
            best, chosen, rank = steps(tiles, sms) * step, (tiles, step), (loops, tiles)
    if free is None or free >= sms:
        return best
    return steps(chosen[0], max(int(free), 1)) * chosen[1]


def sm_share(sms: int, free: int | None) -> float:
    """How much longer work spread evenly over `sms` SMs takes on `free` of them (1.0 when
    `free` is None or not fewer)."""
    return sms / max(int(free), 1) if sms > 0 and free is not None and free < sms else 1.0


# cuBLAS on GPUs with the Tensor Memory Accelerator (Hopper and later, the generations
# whose GEMMs are TMA-fed persistent kernels, `gemm_time`'s `persistent`): a TMA descriptor
# needs 16-byte aligned global strides (CUDA Driver API, cuTensorMapEncodeTiled:
# "globalStrides ... must be a multiple of 16"), so a GEMM whose N or K is not a multiple
# of 16 bytes runs one of cuBLAS's older kernels with narrower loads. Measured on an H200
# (scripts/capture_gpu_physics.py; scripts/tables/h200_capture/physics.json, 8192 x 4096 x
# 4096 bf16 with N or K moved by 1-6 elements): 253-281 TFLOP/s where that width is a
# multiple of 4 bytes, 0.38 of the ~710 aligned; 84-137 where it is odd (2-byte
# aligned), 0.15; moving M (no operand's stride there) costs nothing measurable. Rule for
# other GPUs: the same shares on every TMA generation (the same fallback kernels); none on
# Ampere and older, whose kernels never used TMA (their penalty is not measured here).
MISALIGNED_GEMM_SHARE = {4: 0.38, 2: 0.15}     # widest alignment in bytes below 16 -> share


def alignment_share(shape: GemmShape, element_bytes: int, operands=()) -> float:
    """The share of its aligned rate a GEMM keeps on a TMA generation (1.0 when N and K
    are multiples of 16 bytes). N is the output's; K, derived from the FLOPs, must be a
    dimension of an operand when operands are given (an FP8 GEMM's FLOPs carry its
    scaling: K from them alone can be off by one), else the check is not made."""
    def alignment(dim: int) -> int:
        align = 16
        while align > 1 and (dim * element_bytes) % align:
            align //= 2
        return align

    n, k = alignment(shape.n), alignment(shape.k)
    if min(n, k) >= 16:
        return 1.0          # the usual case: no operand to parse
    if operands and shape.k not in {d for t in operands for d in _dims(t)}:
        return 1.0          # K from the FLOPs is not the GEMM's: no check
    worst = min(n, k)
    return MISALIGNED_GEMM_SHARE[4] if worst >= 4 else MISALIGNED_GEMM_SHARE[2]


def tpu_gemm_shape(flops: float, outputs: list[str]) -> GemmShape | None:
    """(1, M, N, K) of a TPU matmul from its FLOPs and its fusion's outputs. libtpu writes
    dots as convolutions in tiled layouts: the product can carry a trailing unit dim
    (`bf16[8,2048,8192,1]`), a feature dim split in two (`bf16[8192,2,640]`), and sit
    beside a fused reduction's smaller output. So the largest output is the product, its
    unit dims are dropped, its last dim is N and every other dim is M: the MXU streams
    the rows of all of them through one weight tile, so only N and K (and M as a whole)
    are quantized to its edge."""
    best = max(outputs, key=lambda t: math.prod(_dims(t) or [0]), default="")
    dims = [d for d in _dims(best) if d != 1]
    if not dims or flops <= 0:
        return None
    m, n = math.prod(dims[:-1]), dims[-1]
    return GemmShape(1, m, n, max(1, round(flops / (2.0 * m * n))))


def tpu_matmul_time(shape: GemmShape, rate: float, mxu: int = TPU_MXU) -> float:
    padded = [math.ceil(d / mxu) * mxu for d in (shape.m, shape.n, shape.k)]
    return 2.0 * shape.batch * math.prod(padded) / rate


def _dims(shape: str) -> list[int]:
    inner = shape.split("[", 1)[1].split("]", 1)[0] if "[" in shape else ""
    try:
        return [int(d) for d in inner.split(",") if d.strip()]
    except ValueError:
        return []
