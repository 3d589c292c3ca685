"""Kernel populations: who made a node's kernel, and what its memory-bound work costs.

A node's meta `kernel_source` says how the run's kernels are made (passes/kernel_population
stamps it from the run's framework); torch front-end nodes (meta `aten`) without one are
PyTorch eager, every other node XLA's:

- `library`: hand-vectorized library kernels (Transformer Engine / Megatron-Core fused
  norms, casts, activations, optimizer): 16-byte vector loads, full grids; they stream at
  the achievable share of HBM bandwidth (the spec's `hbm_fraction`). Megatron launches
  them from eager PyTorch, one host launch each.
- `generated`: XLA's fusion emitters, of two generations (node meta `xla_emitters`, the
  run's field; XLA_EMITTERS below). Loop (elementwise) fusions are unrolled and vectorized
  by XLA's loop emitter (up to 4 elements per thread, XLA `ComputeMaxUnrollFactor`), so
  they stream in both. What follows is the `legacy` generation, the LLVM emitters; the
  `mlir` one differs as XLA_EMITTERS says. Reductions, transposes and lone
  gathers/scatters are not (vectorized()): XLA's reduction emitter tiles a row reduction as
  16 elements per thread over up to 1024 threads per block and a column reduction as
  32 x 32 threads of 128 rows each (XLA gpu/reduction_utils.cc `GetReductionTiling`,
  `ReductionInfo::Create`), one scalar load per thread and step: each SM sustains the
  per-SM rate of unvectorized kernels (kernels.GENERATED_BYTES_PER_SM_S), and only as many
  SMs work as the grid has blocks (a column reduction keeping few elements launches
  few blocks). A dynamic-update-slice fusion run in place is emitted with one thread per
  update element and no unrolling (XLA gpu/fusions/in_place_dynamic_update_slice.cc:
  launch dimensions from the update shape, unroll factor 1): each thread keeps one element
  of each update in flight, so a lone bf16 update streams at half the per-SM rate of
  4-byte loads and two horizontally fused ones at the full rate (meta
  `update_element_bytes`, stamped by passes/lower_hlo.py). XLA launches its kernels from
  command buffers (CUDA graphs): no host cost, and no gap between kernels, unless the run
  turned them off (node meta `cuda_graphs: false`: every thunk is launched on its own and
  the stream idles the launch gap before each kernel, stream_kernels).
- `eager`: PyTorch eager, one kernel per aten op, every intermediate through HBM (the
  graph keeps them: no fusion pass runs). PyTorch's elementwise and reduction kernels load
  vectorized (ATen's vectorized_elementwise_kernel, reduce_kernel's vectorized input) and
  stream like library kernels, except elementwise ops with a broadcast or mixed-dtype
  operand, which run ATen's unrolled (scalar) kernel and are bounded per SM like XLA's
  unvectorized kernels (eager_vectorized); each kernel is launched by the host, which
  issues them one after another (LAUNCH_S each, schedule.simulate): many small kernels
  are launch-bound.
- `inductor`: torch.compile's Triton kernels (passes/fuse.py merges their pointwise and
  reduction chains): vectorized 128-bit accesses, streaming; launched one by one from
  Inductor's wrapper code like eager kernels (CUDA graphs only with mode="reduce-overhead").
"""
from __future__ import annotations

import math

from flint.graph import OpClass
from flint.hardware_models.kernels import GENERATED_LOAD_BYTES
from flint.hlo.shapes import DTYPE_BITS, parse_shape

POPULATIONS = ("library", "generated", "eager", "inductor")
# XLA's GPU fusion emitters. `legacy`: the LLVM IR emitters, the reductions and in-place
# updates described above. `mlir`: the MLIR emitters, which XLA made the CUDA default in
# 2024 (openxla/xla: "we're about to replace the LLVM emitters", jreiffers on PR #11018,
# 2024-04; "Enable new mlir fusion emitters only for CUDA", PR #12579, 2024-05) and whose
# LLVM predecessors it then deleted. They vectorize reductions (XLA
# gpu/fusions/reduction_base.cc `GetVectorSizeForMlir`: for an even minor dimension that
# leaves every thread work, 2 elements per load for 32-bit inputs and 4 for 16-bit ones
# whose minor dimension is a multiple of 4, so 8 bytes per thread where the LLVM emitter
# loaded one element) and unroll in-place dynamic-update-slices (XLA
# backends/gpu/codegen/emitters/in_place_dynamic_update_slice.cc: the work tile carries
# the loop emitter's unroll factor). Checked on a jax 0.11 H200 trace: its reductions and
# scan updates run at the stream rate (scripts/compare_gpu_capture.py), while the 2024
# JAX-Toolbox MaxText H100 trace's reductions run at the LLVM emitter's per-SM bound.
XLA_EMITTERS = ("mlir", "legacy")
# Host time to launch one kernel: the CUDA runtime and driver submission path measures
# 4-6 us per launch (pegainfer, "From launch overhead to CUDA graph", 2025: cudaLaunchKernel
# into a stream, driver 580 / CUDA 13); "on the order of microseconds" (Modal GPU glossary,
# CUDA Graph). PyTorch's dispatcher and Python frames add to it, so this is a lower bound
# of an eager op's host time. Rule for other GPUs: the same (a host-side cost).
LAUNCH_S = 5e-6
# GPU time lost per kernel where every launch blocks until its kernel has finished
# (CUDA_LAUNCH_BLOCKING=1, a run's `launch_blocking`): the host cannot run ahead, so each
# kernel waits for the whole round trip of its launch, from the launch call to the
# kernel's first instruction: "about 20 us of launch latency ... between the beginning of
# the launch call (in the CUDA API row) and the beginning of the kernel execution" for one
# PyTorch element-wise op on a V100-SXM (NVIDIA Developer Blog, "Understanding the
# Visualization of Overhead and Latency in NVIDIA Nsight Systems", Figure 1). The
# framework's own CPU work before the call (Python, autograd, ATen dispatch) and the
# host's wake-up after the kernel are left out, so this is a lower bound. Rule for other
# GPUs: the same (a host-side cost).
BLOCKING_LAUNCH_S = 20e-6
# Populations whose kernels the host launches one at a time: PyTorch eager, Inductor's
# wrapper, and Megatron-Core/Transformer Engine (eager PyTorch around library kernels);
# XLA launches from command buffers.
HOST_LAUNCHED = ("eager", "inductor", "library")
# XLA's reduction emitter (reduction_utils.cc): threads per block of a row reduction (up
# to 1024; 512 with ptxas < 12.2), elements per thread of its x tile, and the column tile
# (32 x 32 threads, 128 reduced rows per thread).
ROW_THREADS, ROW_TILE_X = 1024, 16
COLUMN_THREADS_X, COLUMN_TILE_Y = 32, 32 * 128
MAX_THREADS_PER_SM = 2048          # sm80/sm90 (CUDA C++ Programming Guide, Table 21)


def population(node) -> str:
    source = node.meta.get("kernel_source")
    if source in POPULATIONS:
        return source
    return "eager" if "aten" in node.meta else "generated"


def host_launches(node) -> int:
    """Kernel launches the host issues for a node (0 where a command buffer does)."""
    if (node.collective is not None or population(node) not in HOST_LAUNCHED
            or node.meta.get("cuda_graphs")):      # a graph launch replays them all
        return 0
    return _kernels(node)


def stream_kernels(node) -> int:
    """Kernels the device's stream starts one after another for a node, each launched on
    its own, so each waits the GPU's launch gap after the stream's previous kernel
    (kernels.DEFAULT_LAUNCH_GAP_S); 0 where a CUDA graph runs them. Node meta
    `cuda_graphs` (passes/kernel_population: the run's) says whether one does; without
    it, XLA's kernels run from command buffers and host-launched populations do not."""
    if node.collective is not None or "composite" in node.meta:
        return 0
    graphs = node.meta.get("cuda_graphs")
    if graphs is None:
        graphs = population(node) not in HOST_LAUNCHED
    return 0 if graphs else _kernels(node)


def _kernels(node) -> int:
    """The kernels a compute node runs (meta `kernels`, else one; none for a view or
    alias, which moves nothing)."""
    if not (node.flops or node.bytes_read or node.bytes_written):
        return 0
    return max(int(node.meta.get("kernels", 1) or 1), 1)


def emitters(node) -> str:
    """The XLA emitter generation of a generated node (`mlir` unless stamped)."""
    return node.meta.get("xla_emitters", "mlir")


def _reduction(node) -> tuple[str, int, int, int] | None:
    """(row | column, reduced elements, kept elements, element bits) of a reduction, from its
    largest operand (the reduced input) and its smallest array output (the result): kept
    leading dims -> a row reduction (the minor dims reduced), kept trailing dims -> a
    column reduction; None when the shapes say neither."""
    if node.op_class != OpClass.REDUCTION or not node.operands or not node.outputs:
        return None
    ins = [(_dims(s), s) for s in node.operands]
    outs = [d for d in (_dims(s) for s in node.outputs) if d]
    if not ins or not outs:
        return None
    src, text = max(ins, key=lambda p: math.prod(p[0]))
    out = min(outs, key=math.prod)
    src, out = [d for d in src if d != 1], [d for d in out if d != 1]
    total, kept = math.prod(src), max(math.prod(out), 1)
    if not src or total <= kept:
        return None
    bits = DTYPE_BITS.get(text.split("[", 1)[0], 32)
    if out == src[:len(out)]:
        return "row", total // kept, kept, bits
    if not out or out == src[len(src) - len(out):]:
        return "column", total // kept, kept, bits
    return None


def _row_threads(reduced: int) -> int:
    return min(ROW_THREADS, _round_up(math.ceil(reduced / ROW_TILE_X), 32))


def reduction_blocks(node) -> int | None:
    """Thread blocks XLA launches for a reduction fusion; None when the shapes say neither
    a row nor a column reduction (the grid is then taken as full)."""
    shape = _reduction(node)
    if shape is None:
        return None
    kind, reduced, kept, _ = shape
    if kind == "row":                    # [kept, reduced]
        threads_x = _row_threads(reduced)
        rows_per_block = max(ROW_THREADS // threads_x, 1) if reduced <= ROW_TILE_X * 32 else 1
        return math.ceil(kept / rows_per_block)
    return math.ceil(kept / COLUMN_THREADS_X) * math.ceil(reduced / COLUMN_TILE_Y)


def mlir_reduction_load_bytes(node) -> int:
    """Bytes each thread of XLA's MLIR reduction emitter loads per step: its vector size
    (`GetVectorSizeForMlir`, XLA_EMITTERS) times the element. The minor dimension is the
    reduced one of a row reduction and the kept one of a column reduction (one warp of
    threads across it)."""
    shape = _reduction(node)
    if shape is not None:
        kind, reduced, kept, bits = shape
        minor, threads = (reduced, _row_threads(reduced)) if kind == "row" else (kept, 32)
    else:   # a split or multi-output reduction: its largest input's minor dimension
        ins = [(_dims(s), s) for s in node.operands]
        dims, text = max(ins, key=lambda p: math.prod(p[0])) if ins else ([], "")
        if not dims:
            return GENERATED_LOAD_BYTES
        minor, bits = dims[-1], DTYPE_BITS.get(text.split("[", 1)[0], 32)
        threads = _row_threads(minor)
    if minor % 2 or threads * 2 > minor:
        vector = 1
    elif bits >= 32 or threads * 4 > minor:
        vector = 2
    else:
        vector = 4 if minor % 4 == 0 else 2
    return max(1, vector * bits // 8)


def vectorized(node) -> bool:
    """Whether XLA emits the kernel with vector loads: its loop fusions do. Its input
    fusions (reduction, transpose and scatter heroes, `fusion_kind` kInput) tile one
    element per thread and step, a lone gather, scatter or dynamic-update-slice
    addresses each element from data (an index or an offset known at run time), and an
    in-place dynamic-update-slice fusion runs one thread per update element under the LLVM
    emitters (the MLIR emitter unrolls it: XLA_EMITTERS)."""
    if node.meta.get("update_element_bytes"):
        return emitters(node) == "mlir"       # the MLIR emitter unrolls it like a loop
    if node.op_class == OpClass.REDUCTION or node.meta.get("fusion_kind") == "kInput":
        return False
    return node.op not in ("gather", "scatter", "dynamic-update-slice", "dynamic-slice")


def eager_vectorized(node) -> bool:
    """Whether PyTorch runs an eager elementwise op with its vectorized kernel: only when
    every tensor operand has the output's shape and dtype (ATen's gpu_kernel_impl takes
    vectorized_elementwise_kernel for contiguous, same-dtype TensorIterators; a
    broadcast operand, which iterates with stride 0, or a mixed-dtype op, which casts
    element by element, runs unrolled_elementwise_kernel with an offset calculator and
    scalar accesses)."""
    if node.op_class != OpClass.ELEMENTWISE or not node.outputs:
        return True
    out = node.outputs[0]
    out_dtype, out_elems = out.split("[", 1)[0], math.prod(_dims(out) or [1])
    for shape in node.operands:
        dims = _dims(shape)
        if not dims:              # a scalar operand is a kernel argument, not a tensor
            continue
        if shape.split("[", 1)[0] != out_dtype or math.prod(dims) != out_elems:
            return False
    return True


def generated_bandwidth(node, sms: int, per_sm: float) -> float | None:
    """The bandwidth bound of an XLA-generated kernel (None: a vectorized one streams):
    an unvectorized kernel's bytes in flight scale with its resident threads (Little's
    law), per_sm being the rate of an SM full of them (MAX_THREADS_PER_SM); a reduction's
    grid of 1024-thread blocks fills blocks x 1024 thread slots, at most all of them."""
    if sms <= 0 or vectorized(node):
        return None
    element = node.meta.get("update_element_bytes")
    if element:
        per_sm *= element / GENERATED_LOAD_BYTES
    elif node.op_class == OpClass.REDUCTION and emitters(node) == "mlir":
        per_sm *= mlir_reduction_load_bytes(node) / GENERATED_LOAD_BYTES
    blocks = reduction_blocks(node)
    full = sms * per_sm
    if blocks is None:
        return full
    return min(full, blocks * ROW_THREADS / MAX_THREADS_PER_SM * per_sm)


def _dims(shape: str) -> list[int]:
    try:
        parsed = parse_shape(shape)
    except Exception:  # noqa: BLE001 - tuples, tokens and odd shapes are not arrays here
        return []
    dims = getattr(parsed, "dims", None)
    return [int(d) for d in dims] if dims else []


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m
