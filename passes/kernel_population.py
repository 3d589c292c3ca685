"""Who made a graph's kernels: a run's framework, said on every node.

The graph comes from XLA (Flint compiles the step), but the run it stands for may launch
other kernels for the same work. `megatron`: Megatron-Core with Transformer Engine, whose
norms, activations, casts and optimizer are hand-vectorized library kernels that stream
at the achievable share of HBM bandwidth (node meta `kernel_source: library`);
`xla`: XLA's own fusions, whose reductions the cost model bounds per SM
(hardware_models/populations.py) as the run's `xla_emitters` emit them (the MLIR emitters
of XLA since 2024, or the LLVM emitters before them; node meta `xla_emitters`);
`torch-eager`: PyTorch eager, one kernel per aten op, each launched by the host
(`kernel_source: eager`); `torch-compile`: Inductor's Triton
kernels (`inductor`; fuse the graph's pointwise chains first, passes/fuse.py). GEMMs and
attention are library kernels in all of them.

`attention_kernel` names the fused-attention kernel the run's library version has where
the compiled step leaves it to the GPU's generation: `flash1`, FlashAttention v1 (a
framework pinned to it, as InternEvo's flash-attention 1.0.5 submodule), `flash2`,
`flash3` or `cudnn` (a run that says which one it runs, e.g. PyTorch's SDPA on cuDNN);
without one, the PyTorch frameworks run SDPA's FlashAttention-2 (FRAMEWORK_ATTENTION). It
is stamped as meta["attention"]["impl"] on every fused-attention node that names no kernel
of its own (a traced aten op that names its SDPA back end keeps it:
passes.aten_cost.SDPA_BACKEND); hardware_models.attention_kernels prices it. Unfused
attention is a different program and is compiled as such.

`launch_blocking` (CUDA_LAUNCH_BLOCKING=1: each kernel launch returns only when the kernel
has finished) is stamped as meta["launch_blocking"] on every node, for the frameworks
whose host launches kernels one by one; hardware_models.schedule then makes each of them
wait for its launch's round trip.

`cuda_graphs` says whether the run's kernels are launched from CUDA graphs: XLA's command
buffers (its default, `--xla_gpu_enable_command_buffer`; `false` for a run with them
off), Megatron-Core's `--enable-cuda-graph`, PyTorch's torch.cuda.graph or Inductor's
mode="reduce-overhead". Without it, each framework's default: XLA yes, the others no. It
is stamped as meta["cuda_graphs"]; a kernel launched on its own waits the GPU's launch gap
after the stream's last one (hardware_models.populations.stream_kernels).

Contract: returns a copy whose nodes carry meta["kernel_source"] (one of
hardware_models.populations.POPULATIONS) and meta["framework"] on the graph; shapes,
flops, bytes and edges are unchanged. Raises FlintError for an unknown framework or
attention kernel.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from flint.errors import FlintError
from flint.graph import WorkloadGraph
from flint.hardware_models.attention_kernels import SDPA_DEFAULT
from flint.hardware_models.populations import XLA_EMITTERS

FRAMEWORKS = {"megatron": "library", "xla": "generated", "torch-eager": "eager",
              "torch-compile": "inductor"}
# "": the framework's own for the GPU (below); the rest name a fused kernel
# (hardware_models.attention_kernels.FUSED)
ATTENTION_KERNELS = ("", "flash1", "flash2", "flash3", "cudnn")
# The fused attention a framework runs where the run names none: PyTorch's SDPA default
# (hardware_models.attention_kernels.SDPA_DEFAULT, with its sources); Megatron-Core and
# XLA run the GPU generation's own.
FRAMEWORK_ATTENTION = {"torch-eager": SDPA_DEFAULT, "torch-compile": SDPA_DEFAULT}


@dataclass(frozen=True)
class KernelPopulation:
    framework: str = "megatron"
    attention_kernel: str = ""
    launch_blocking: bool = False
    xla_emitters: str = "mlir"
    cuda_graphs: bool | None = None
    name: ClassVar[str] = "kernel-population"

    def __post_init__(self):
        if self.framework not in FRAMEWORKS:
            raise FlintError(f"kernel-population: unknown framework {self.framework!r}; use "
                             f"{' | '.join(FRAMEWORKS)}")
        if self.attention_kernel not in ATTENTION_KERNELS:
            raise FlintError(f"kernel-population: unknown attention kernel "
                             f"{self.attention_kernel!r}; use "
                             f"{' | '.join(k for k in ATTENTION_KERNELS if k)} or leave it out")
        if self.xla_emitters not in XLA_EMITTERS:
            raise FlintError(f"kernel-population: unknown xla_emitters {self.xla_emitters!r}; "
                             f"use {' | '.join(XLA_EMITTERS)}")
        if self.xla_emitters != "mlir" and self.framework != "xla":
            raise FlintError(f"kernel-population: xla_emitters is for framework xla, not "
                             f"{self.framework}")
        if self.launch_blocking and self.framework == "xla":
            raise FlintError("kernel-population: launch_blocking is for frameworks that "
                             "launch kernels from the host (XLA launches command buffers)")

    def run(self, graph: WorkloadGraph) -> WorkloadGraph:
        source = FRAMEWORKS[self.framework]
        nodes = [replace(n, meta=self._stamped(n.meta, source)) for n in graph.nodes]
        return replace(graph, nodes=nodes, meta=dict(graph.meta, framework=self.framework))

    def _stamped(self, meta: dict, source: str) -> dict:
        out = dict(meta, kernel_source=source)
        if self.cuda_graphs is not None:
            out["cuda_graphs"] = self.cuda_graphs
        if self.framework == "xla":
            out["xla_emitters"] = self.xla_emitters
        if self.launch_blocking:
            out["launch_blocking"] = True
        attn = meta.get("attention")
        # the run's named kernel wins; the framework's default only where the node names none
        kernel = self.attention_kernel or (
            FRAMEWORK_ATTENTION.get(self.framework, "")
            if isinstance(attn, dict) and attn.get("impl") in (None, "native") else "")
        named = named_attention(attn, kernel) if kernel else None
        if named is not None:
            out["attention"] = named
        return out


def named_attention(attn, kernel: str) -> dict | None:
    """A node's meta["attention"] running `kernel`; None where there is no fused attention
    to name (no attention meta, or unfused: a different program, compiled as such)."""
    if not isinstance(attn, dict) or attn.get("impl") == "unfused":
        return None
    return dict(attn, impl=kernel)
