"""Time of one compute or memory node: the kernel model of kernels.py on the spec's figures.

time = floor + max(compute time, bytes / bandwidth of the node's kernel population)

Tensor-core work (GEMM, convolution, attention) runs at the operand dtype's dense peak
times the achievable fraction for its kernel family, quantized into tiles and waves over
the SMs (kernels.py; attention by era in attention_kernels.py); other arithmetic runs on
the vector units at the FP32 peak. Memory-bound work moves its bytes at the bandwidth of
the population that made the kernel (populations.py: library, XLA-generated, PyTorch
eager, Inductor). `flint calibrate` replaces the fractions and the floor with values
fitted to real traces (under `efficiency:` in a spec).

f32 GEMMs: XLA runs them as TF32 on GPUs (its default precision). PyTorch runs them in
full FP32 unless the program allows TF32 (`torch.backends.cuda.matmul.allow_tf32`, or
`torch.set_float32_matmul_precision("high")`), so a torch node (meta `aten`) is priced at
the FP32 rate unless the graph's meta says `allow_tf32: true`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from flint.graph import TENSOR_CLASSES, Node, OpClass
from flint.hardware_models import attention_kernels, kernels, populations
from flint.hardware_models.spec import HardwareSpec
from flint.hlo.shapes import DTYPE_BITS

TRANSCENDENTAL_FLOPS = 4.0   # SFU ops: ~4 FMA slots each (a quarter-rate unit per SM quad)
# GPU generations whose cuBLAS GEMMs are warp-specialized persistent kernels
# (kernels.gemm_time).
ASYNC_GENERATIONS = ("hopper", "blackwell")


@dataclass(frozen=True)
class RooflineCompute:
    spec: HardwareSpec
    efficiency: dict = field(default_factory=dict)   # calibrated figures, over the spec's
    allow_tf32: bool = False                         # the torch program allows TF32 GEMMs

    def figure(self, name: str) -> float:
        return kernels.figure(self.spec, name, self.efficiency)

    def launch_overhead(self) -> float:
        """The kernel floor in seconds (kept under its old name for library users)."""
        return self.figure("kernel_floor")

    def bound(self, node: Node) -> tuple[float, float]:
        """(seconds if compute-bound, seconds if memory-bound) for one execution."""
        t_flops = self.compute_time(node)
        moved = node.bytes_read + node.bytes_written
        return t_flops, moved / self.memory_bandwidth(node) if moved else 0.0

    def memory_bandwidth(self, node: Node) -> float:
        """Bytes/s a memory-bound node sustains: the stream share of HBM bandwidth, and
        for unvectorized kernels (XLA's reductions and transposes over the SMs their grid
        occupies, PyTorch's broadcasting or mixed-dtype elementwise kernels) the per-SM
        bound of populations.py. A calibrated `hbm_fraction` replaces the stream share;
        the per-SM bounds are physics of the kernel's code and stay."""
        bw = self.spec.hbm_bandwidth * self.figure("hbm_fraction")
        if not self.sms or node.op_class in TENSOR_CLASSES:
            return bw
        source, per_sm = populations.population(node), kernels.GENERATED_BYTES_PER_SM_S
        if source == "generated":
            cap = populations.generated_bandwidth(node, self.sms, per_sm)
            if cap:
                bw = min(bw, cap)
        elif source == "eager" and not populations.eager_vectorized(node):
            bw = min(bw, self.sms * per_sm)
        return bw

    def compute_time(self, node: Node, free: int | None = None) -> float:
        """Seconds of the node's arithmetic; `free`: the SMs a tensor-core kernel's CTAs
        can take while other kernels hold the rest (interference.py), its tiles still
        the ones chosen for the whole GPU (kernels.gemm_time)."""
        if node.op_class in TENSOR_CLASSES and node.flops:
            peak = self.spec.peak(tensor_dtype(node, self.spec.kind, self.allow_tf32))
            if node.op_class == OpClass.ATTENTION:
                return self._attention_time(node, peak, free)
            rate = peak * self.figure("gemm_fraction")
            # one chunk of a GEMM split for communication overlap (passes.tp_comm_overlap):
            # Transformer Engine runs the chunks on rotating streams (its num_max_streams)
            # so together they fill the GPU as the whole GEMM does: 1/split of its time
            split = int(node.meta.get("gemm_split") or 1)
            output = node.meta.get("gemm_output") or (node.outputs[0] if node.outputs
                                                      else "")
            if self.spec.kind == "tpu":
                shape = kernels.tpu_gemm_shape(node.flops * split, node.outputs)
                if shape is None:
                    return node.flops / rate
                return kernels.tpu_matmul_time(shape, rate,
                                               self.spec.matrix_unit or kernels.TPU_MXU) / split
            shape = kernels.gemm_shape(node.flops * split, output)
            if shape is None:
                return node.flops / rate * kernels.sm_share(self.sms, free)
            dtype = tensor_dtype(node, self.spec.kind, self.allow_tf32)
            simt = dtype in ("f32", "f64")
            t = kernels.gemm_time(shape, rate, self.sms, self.persistent and not simt,
                                  kernels.TILE_K_SIMT if simt else kernels.TILE_K,
                                  free) / split
            if self.persistent and not simt:    # TMA needs 16-byte aligned strides
                element = 4 if dtype == "tf32" else DTYPE_BITS.get(dtype, 16) // 8
                t /= kernels.alignment_share(shape, max(element, 1), node.operands)
            return t
        work = node.flops + TRANSCENDENTAL_FLOPS * node.transcendentals
        if not work:
            return 0.0
        return work / (self.spec.peak("f32") * self.figure("vector_fraction"))

    def _attention_time(self, node: Node, peak: float, free: int | None = None) -> float:
        attn = node.meta.get("attention") if isinstance(node.meta.get("attention"),
                                                        dict) else None
        kind = attention_family(node, self.generation)
        if kind == "unfused" and self.sms:
            t = attention_kernels.unfused_time(
                attn, peak * self.figure("gemm_fraction"), self.sms,
                self.spec.hbm_bandwidth * self.figure("hbm_fraction"), self.launch_overhead(),
                self.persistent, populations.population(node) == "eager")
            if t is not None:
                return t * kernels.sm_share(self.sms, free)
        rate, exp_rate = attention_rate(self.spec, peak, kind in attention_kernels.NATIVE,
                                        self.efficiency)
        if kind == "flash1":
            rate *= attention_kernels.FLASH1_SHARE
        return attention_kernels.fused_time(node.flops, attn, rate, self.sms, exp_rate, free)

    @property
    def sms(self) -> int:
        return int(self.spec.cores) if self.spec.kind == "gpu" else 0

    @property
    def generation(self) -> str:
        """The GPU architecture the spec names ("" when it names none)."""
        from flint.hardware_models.nccl import generation

        return generation(self.spec.name, self.spec.model)

    @property
    def persistent(self) -> bool:
        return self.spec.kind == "gpu" and self.generation in ASYNC_GENERATIONS

    def time(self, node: Node) -> float:
        recorded = node.meta.get("recorded_s")
        if recorded is not None and not node.flops and not (node.bytes_read + node.bytes_written):
            return float(recorded)   # an imported trace node with nothing but its duration
        t_flops, t_bytes = self.bound(node)
        return max(t_flops, t_bytes) + self.launch_overhead() + self.memory_latency(node)

    def memory_latency(self, node: Node) -> float:
        """A fused memory-bound GPU kernel's DRAM round trip (kernels.MEMORY_LATENCY_S).
        Fusion (XLA, Inductor, library kernels) keeps a chain's intermediates in
        registers, so what a fused kernel reads was written kernels ago and comes from
        DRAM; an eager op reads what the op before it just wrote, still in L2 (public
        Kineto traces: eager kernels on tens of KB run at the kernel floor). GEMM and
        attention pipelines count their fill in their own steps."""
        if (not self.sms or node.op_class in TENSOR_CLASSES
                or not (node.bytes_read or node.bytes_written)
                or populations.population(node) == "eager"):
            return 0.0
        return kernels.MEMORY_LATENCY_S


def attention_family(node: Node, generation: str = "") -> str:
    """The kernel family an attention node runs (attention_kernels.FUSED or unfused): the
    one it names, else SDPA's default for a node PyTorch launches, else the GPU's own;
    as the GPU `generation` runs it (attention_kernels.GENERATION_FAMILIES)."""
    attn = node.meta.get("attention")
    attn = attn if isinstance(attn, dict) else None
    torch_made = populations.population(node) in ("eager", "inductor")
    return attention_kernels.family(
        attn, attention_kernels.SDPA_DEFAULT if torch_made else "native", generation)


def attention_rate(spec: HardwareSpec, peak: float, native: bool,
                   calibrated: dict | None = None) -> tuple[float, float]:
    """(the fused-attention family's rate at head dim 128, exponentials included; the GPU's
    exponentials per second). A native family with no figure of this GPU's own (calibrated
    or in its spec) takes attention_kernels.native_rate: Hopper's GEMM share, this GPU's
    exponentials."""
    from flint.hardware_models.nccl import generation

    sms = int(spec.cores) if spec.kind == "gpu" else 0
    exp_rate = sms * spec.clock * (spec.exponentials_per_clock
                                   or kernels.SFU_EXP_PER_CLOCK_PER_SM)
    name = "attention_fraction_native" if native else "attention_fraction"
    if native and exp_rate and not kernels.given(spec, name, calibrated) and generation(
            spec.name, spec.model):
        return attention_kernels.native_rate(peak, sms, exp_rate), exp_rate
    return peak * kernels.figure(spec, name, calibrated), exp_rate


def tensor_dtype(node: Node, kind: str, allow_tf32: bool | None = None) -> str:
    """The dtype a tensor-core node runs in: an f32 GEMM on a GPU is TF32 for XLA (its
    default precision) and for torch programs that allow it, FP32 for other torch nodes."""
    dtype = node.operands[0].split("[", 1)[0] if node.operands else "bf16"
    if dtype == "f32" and kind == "gpu":
        if "aten" in node.meta and not allow_tf32:
            return "f32"
        return "tf32"
    return dtype
