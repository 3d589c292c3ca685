"""One entry to every front end: an `ExtractRequest` names the step (a zoo model, a user's
SCRIPT.py:FUNCTION, a StableHLO file) and the cluster it runs on; `extract(request)`
compiles or traces it and returns the workload graph. `flint extract`, sweeps, `flint
validate --model` and the scripts all come through here.

    from flint.frontends import ExtractRequest, extract
    graph, timings = extract(ExtractRequest(model="llama3-8b", devices=4096))
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from flint.errors import FlintError
from flint.models import REMAT_POLICIES

FRAMEWORKS = ("jax", "torch")


@dataclass(frozen=True)
class ExtractRequest:
    """What to extract. `target` None: the built-in `model` (a zoo/preset name, a model YAML
    or a Hugging Face config.json); otherwise SCRIPT.py:FUNCTION, a .mlir/.mlirbc file or an
    XLA dump (DIR[:MODULE] or an HLO file)."""

    target: str | None = None
    devices: int = 4096
    mesh: str | None = None             # e.g. "data=512,model=8"; None: the default for it
    hardware: str = "h100-sxm"          # compile target (flint.frontends.targets)
    model: str = "llama3-8b"
    framework: str = "jax"              # jax | torch (a .mlir target is StableHLO)
    devices_per_host: int | None = None
    # zoo model options
    scan: bool = True                   # layers in lax.scan (False: unrolled)
    layers: int | None = None
    seq_len: int | None = None
    batch_per_replica: int = 1
    remat: str | None = None            # None: selective
    sequence_parallel: bool = False
    dims: dict = field(default_factory=dict)    # model dimension overrides (layers, hidden..)
    gemm_precision: str | None = None
    # script option: the function of the script giving the step's example arguments
    args_fn: str = "example_args"
    # torch option: fuse pointwise chains as torch.compile would
    fuse: bool = True
    # graph passes run after lowering, e.g. "expand-loops"
    passes: str = ""

    @property
    def is_stablehlo(self) -> bool:
        return (self.target or "").endswith((".mlir", ".mlirbc"))

    @property
    def is_hlo_dump(self) -> bool:
        """An XLA dump (DIR[:MODULE] or an HLO text/proto file), not a script."""
        from flint.hlo.dump import is_hlo_target

        return is_hlo_target(self.target)

    def check(self) -> None:
        """Bad options fail here, before JAX starts (and configure JAX for compile-only
        devices, which must happen before it starts)."""
        from flint.cluster import check_device_count
        from flint.frontends.targets import prepare_environment, resolve_target
        from flint.passes import parse_pipeline

        if self.framework not in FRAMEWORKS:
            raise FlintError(f"unknown --framework {self.framework!r}; use jax or torch")
        check_device_count(self.devices)
        if self.remat is not None and self.remat not in REMAT_POLICIES:
            raise FlintError(f"unknown --remat {self.remat!r}; use {' | '.join(REMAT_POLICIES)}")
        if self.devices_per_host is not None and self.devices_per_host < 1:
            raise FlintError(f"--devices-per-host must be at least 1, not {self.devices_per_host}")
        prepare_environment()
        resolve_target(self.hardware)
        parse_pipeline(self.passes)


def extract(request: ExtractRequest, stage: Callable[[str], None] | None = None,
            after_pass: Callable | None = None):
    """(graph, timings in seconds) of the request's step, its passes run. `stage(text)`
    hears what is happening; `after_pass(pass_or_None, graph)` sees the lowered graph
    (None) and the graph after each pass."""
    from flint.passes import parse_pipeline, run_pipeline

    request.check()
    stage = stage or (lambda text: None)
    t_start = time.perf_counter()
    if request.framework == "torch" or request.is_stablehlo or request.is_hlo_dump:
        from flint.frontends.steps import other_frontend_graph

        graph, timings = other_frontend_graph(request, stage)
    else:
        graph, timings = _jax_graph(request, stage)
    if after_pass is not None:
        after_pass(None, graph)
    graph = run_pipeline(graph, parse_pipeline(request.passes), callback=after_pass)
    return graph, dict(timings, total_s=time.perf_counter() - t_start)


def _jax_graph(request: ExtractRequest, stage):
    from flint.frontends.steps import captured_step

    devices = request.devices
    step, args, label, info = captured_step(request)
    stage(f"tracing and lowering {label} for {devices} devices")
    import sys
    import warnings

    from flint.frontends.sharding_report import ShardingWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ShardingWarning)
        lowered = step.lower(*args)
    for w in caught:       # Flint's own on one plain line each; others as Python shows them
        if issubclass(w.category, ShardingWarning):
            print(f"flint: warning: {w.message}", file=sys.stderr)
        else:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    stage(f"compiling with XLA for {devices} x {step.cfg.hardware} (no hardware runs)")
    compiled = lowered.compile()
    stage("lowering optimized HLO into the workload graph")
    graph = compiled.workload()
    graph.meta["model"] = label
    if info.get("model_flops"):
        graph.meta.update(model_flops_per_device=info["model_flops"] / devices,
                          model_flops_source="model config (PaLM appendix B)")
    if info.get("experts"):
        graph.meta["moe"] = {k: info[k] for k in ("experts", "top_k", "ep", "capacity_factor")}
    return graph, compiled.timings
