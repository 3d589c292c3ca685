"""Roofline time of one compute or memory node.

time = max(flops / (peak(dtype) x eff_flops), bytes / (hbm_bandwidth x eff_bytes)) + launch

Tensor-core peaks apply to GEMM, convolution and attention nodes at their operand dtype
(f32 GEMMs run as TF32 on GPUs, XLA's default precision there); other arithmetic runs on
the vector units at the FP32 peak. Efficiencies grow with the size of the work,
eff(w) = max_eff x w / (w + half_work): small kernels cannot fill the machine. The defaults
below are modelling assumptions, not hardware figures: `flint calibrate` replaces them
with values fitted to real traces (stored under `efficiency:` in a spec YAML).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from flint.graph import Node
from flint.hardware_models.spec import HardwareSpec

TENSOR_CLASSES = ("gemm", "conv", "attention")
DEFAULT_EFFICIENCY = {
    # class: (max efficiency, work at which half of it is reached: FLOP or bytes).
    # Large dense bf16 GEMMs reach about 70-75% of the dense tensor peak with cuBLAS on
    # H100/A100 (vendor GEMM benchmarks); a 1024^3 GEMM reaches well under a third.
    "gemm": (0.75, 4e9),
    "conv": (0.65, 4e9),
    "attention": (0.60, 4e9),
    "vector": (0.50, 1e8),
    # Compiler-generated fusions (strided, broadcast-heavy, reductions) sustain well below
    # the copy bandwidth: 65% of HBM peak for large kernels, half of that near 1 MB. (The
    # MaxText H100 profile in shared/traces shows 2.1-2.5 TB/s above 100 MB and ~4 us at
    # 1 MB; these defaults were read off it, calibration refits them per machine.)
    "memory": (0.65, 1e6),
}
# Shortest kernel on the device's timeline (launch itself is hidden by asynchronous launch
# and command buffers): GPU kernels of a few KB take 1.4-2 us in the same profile.
LAUNCH_OVERHEAD_S = {"gpu": 1.5e-6, "tpu": 1e-6, "cpu": 1e-6}


@dataclass(frozen=True)
class RooflineCompute:
    spec: HardwareSpec
    efficiency: dict = field(default_factory=dict)

    def _eff(self, key: str, work: float) -> float:
        cal = {**DEFAULT_EFFICIENCY, **self.spec.efficiency, **self.efficiency}.get(key)
        max_eff, half = cal if isinstance(cal, (tuple, list)) else (cal["max"], cal["half"])
        return max_eff * work / (work + half) if work > 0 else max_eff

    def launch_overhead(self) -> float:
        cal = {**self.spec.efficiency, **self.efficiency}.get("launch")
        return float(cal) if cal is not None else LAUNCH_OVERHEAD_S.get(self.spec.kind, 3e-6)

    def bound(self, node: Node) -> tuple[float, float]:
        """(seconds if compute-bound, seconds if memory-bound) for one execution."""
        if node.op_class in TENSOR_CLASSES:
            peak = self.spec.peak(_tensor_dtype(node, self.spec.kind))
            t_flops = node.flops / (peak * self._eff(node.op_class, node.flops)) if node.flops else 0
        else:
            work = node.flops + 4.0 * node.transcendentals  # SFU ops cost ~4 FMA slots
            peak = self.spec.peak("f32")
            t_flops = work / (peak * self._eff("vector", work)) if work else 0.0
        moved = node.bytes_read + node.bytes_written
        t_bytes = moved / (self.spec.hbm_bandwidth * self._eff("memory", moved)) if moved else 0
        return t_flops, t_bytes

    def time(self, node: Node) -> float:
        recorded = node.meta.get("recorded_s")
        if recorded is not None and not node.flops and not (node.bytes_read + node.bytes_written):
            return float(recorded)   # an imported trace node with nothing but its duration
        t_flops, t_bytes = self.bound(node)
        return max(t_flops, t_bytes) + self.launch_overhead()


def _tensor_dtype(node: Node, kind: str) -> str:
    dtype = node.operands[0].split("[", 1)[0] if node.operands else "bf16"
    if dtype == "f32" and kind == "gpu":
        return "tf32"
    return dtype
