"""Grouped GEMMs (a MoE layer's experts in one kernel), tile by tile.

A grouped GEMM runs G problems (one per local expert, M = that expert's tokens) in one
launch: CUTLASS's grouped GEMM (examples 24_gemm_grouped for sm80, 57_hopper_grouped_gemm
for sm90) and Transformer Engine's/Megatron-Core's GroupedMLP hand the tiles of every
problem to a persistent scheduler that deals them out over the SMs. So the kernel costs the
tiles of all problems together, each expert's M rounded up to whole tiles (the tile waste
of small or uneven experts), in waves over the SMs, each tile a main loop of ceil(K / 64)
steps plus the pipeline's fill and drain, with the tile shapes and rates of kernels.py.
When K differs between problems (weight gradients, where K is the token count) the waves
are the tiles' main-loop steps over the SMs, at least the longest tile. An expert that gets
no token costs nothing. TPUs (megablox kernels): each problem padded to the matrix unit.

The node carries the problems as meta["grouped_gemm"] = [[m, n, k], ...] (written by
passes/moe_routing.py); every other node goes to the wrapped compute model unchanged.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from flint.graph import Node
from flint.hardware_models import kernels
from flint.hardware_models.compute import tensor_dtype


def grouped_gemm_time(problems, rate: float, sms: int) -> float:
    """Seconds for the main loops of all problems at `rate` FLOP/s over `sms` SMs."""
    live = [(m, n, k) for m, n, k in problems if m > 0 and n > 0 and k > 0]
    if not live:
        return 0.0
    if sms <= 0:
        return sum(2.0 * m * n * k for m, n, k in live) / rate
    per_sm = rate / sms
    best = math.inf
    for rows, cols, tile_eff in kernels.TILES:
        step = 2.0 * rows * cols * kernels.TILE_K / (per_sm * tile_eff)
        tile_steps, longest = 0, 0
        for m, n, k in live:
            steps = math.ceil(k / kernels.TILE_K) + kernels.PIPELINE_STEPS
            tile_steps += math.ceil(m / rows) * math.ceil(n / cols) * steps
            longest = max(longest, steps)
        same_k = len({k for _, _, k in live}) == 1
        if same_k:
            tiles = tile_steps // longest
            steps_total = math.ceil(tiles / sms) * longest
        else:
            steps_total = max(math.ceil(tile_steps / sms), longest)
        best = min(best, steps_total * step)
    return best


def tpu_grouped_time(problems, rate: float, mxu: int) -> float:
    return sum(kernels.tpu_matmul_time(kernels.GemmShape(1, m, n, k), rate, mxu)
               for m, n, k in problems if m > 0 and n > 0 and k > 0)


@dataclass(frozen=True)
class GroupedGemmCompute:
    """The compute model, with grouped-GEMM nodes priced by their per-expert problems."""

    inner: object

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def compute_time(self, node: Node, free: int | None = None) -> float:
        problems = node.meta.get("grouped_gemm")
        if not problems or not node.flops:
            return self.inner.compute_time(node, free)
        spec = self.inner.spec
        rate = spec.peak(tensor_dtype(node, spec.kind, getattr(self.inner, "allow_tf32", False))) \
            * self.inner.figure("gemm_fraction")
        if spec.kind == "tpu":
            return tpu_grouped_time(problems, rate, spec.matrix_unit or kernels.TPU_MXU)
        # a grouped GEMM's tiles are spread over the SMs free beside other kernels
        sms = self.inner.sms
        return grouped_gemm_time(problems, rate, sms) * kernels.sm_share(sms, free)

    def bound(self, node: Node) -> tuple[float, float]:
        _, t_bytes = self.inner.bound(node)
        return self.compute_time(node), t_bytes

    def time(self, node: Node) -> float:
        if not node.meta.get("grouped_gemm"):
            return self.inner.time(node)
        t_flops, t_bytes = self.bound(node)
        return max(t_flops, t_bytes) + self.inner.launch_overhead()


def with_grouped_gemms(compute, graph) -> object:
    """Wrap `compute` when the graph holds grouped-GEMM nodes."""
    if any("grouped_gemm" in n.meta for n in graph.nodes):
        return GroupedGemmCompute(compute)
    return compute
