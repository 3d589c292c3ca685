"""Time of one compute or memory node: the kernel model of kernels.py on the spec's figures.

time = floor + max(compute time, bytes / (HBM bandwidth x hbm_fraction))

Tensor-core work (GEMM, convolution, attention) runs at the operand dtype's dense peak
(f32 GEMMs run as TF32 on GPUs, XLA's default precision there) times the achievable
fraction for its kernel family, quantized into tiles and waves over the SMs; other
arithmetic runs on the vector units at the FP32 peak. `flint calibrate` replaces the
fractions and the floor with values fitted to real traces (under `efficiency:` in a spec).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from flint.graph import TENSOR_CLASSES, Node, OpClass
from flint.hardware_models import kernels
from flint.hardware_models.spec import HardwareSpec

TRANSCENDENTAL_FLOPS = 4.0   # SFU ops: ~4 FMA slots each (a quarter-rate unit per SM quad)


@dataclass(frozen=True)
class RooflineCompute:
    spec: HardwareSpec
    efficiency: dict = field(default_factory=dict)   # calibrated figures, over the spec's

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
        """Bytes/s a memory-bound node sustains: the stream share of HBM bandwidth, and for
        compiler-generated GPU kernels (anything not from an ATen/library kernel) the
        per-SM in-flight bound of kernels.GENERATED_BYTES_PER_SM_S. A node whose meta
        says `kernel_source: library` stands for a hand-vectorized library kernel (e.g. a
        Transformer Engine fused norm/cast when the workload models a Megatron run)."""
        bw = self.spec.hbm_bandwidth * self.figure("hbm_fraction")
        generated = ("aten" not in node.meta and node.meta.get("kernel_source") != "library"
                     and node.op_class not in TENSOR_CLASSES)
        if self.sms and generated and "hbm_fraction" not in self.efficiency:
            bw = min(bw, self.sms * kernels.GENERATED_BYTES_PER_SM_S)
        return bw

    def compute_time(self, node: Node) -> float:
        if node.op_class in TENSOR_CLASSES and node.flops:
            peak = self.spec.peak(tensor_dtype(node, self.spec.kind))
            if node.op_class == OpClass.ATTENTION:
                attn = node.meta.get("attention") if isinstance(node.meta.get("attention"),
                                                                dict) else None
                native = not (attn and attn.get("impl") == "flash2")
                frac = self.figure("attention_fraction_native" if native
                                   else "attention_fraction")
                exp_rate = self.sms * kernels.SFU_EXP_PER_CLOCK_PER_SM * self.spec.clock
                return kernels.attention_time(node.flops, attn, peak * frac, self.sms,
                                              exp_rate, overlapped=native)
            rate = peak * self.figure("gemm_fraction")
            shape = kernels.gemm_shape(node.flops, node.outputs[0] if node.outputs else "")
            if shape is None:
                return node.flops / rate
            if self.spec.kind == "tpu":
                return kernels.tpu_matmul_time(shape, rate,
                                               self.spec.matrix_unit or kernels.TPU_MXU)
            return kernels.gemm_time(shape, rate, self.sms)
        work = node.flops + TRANSCENDENTAL_FLOPS * node.transcendentals
        if not work:
            return 0.0
        return work / (self.spec.peak("f32") * self.figure("vector_fraction"))

    @property
    def sms(self) -> int:
        return int(self.spec.cores) if self.spec.kind == "gpu" else 0

    def time(self, node: Node) -> float:
        recorded = node.meta.get("recorded_s")
        if recorded is not None and not node.flops and not (node.bytes_read + node.bytes_written):
            return float(recorded)   # an imported trace node with nothing but its duration
        t_flops, t_bytes = self.bound(node)
        return max(t_flops, t_bytes) + self.launch_overhead()


def tensor_dtype(node: Node, kind: str) -> str:
    dtype = node.operands[0].split("[", 1)[0] if node.operands else "bf16"
    if dtype == "f32" and kind == "gpu":
        return "tf32"
    return dtype
