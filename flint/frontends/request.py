"""One entry to every front end: an `ExtractRequest` names the step (a zoo model, a user's
SCRIPT.py:FUNCTION, a StableHLO file) and the cluster it runs on; `extract(request)`
compiles or traces it and returns the workload graph. `flint extract`, sweeps, `flint
validate --model` and the scripts all come through here.

    from flint.frontends import ExtractRequest, extract
    graph, timings = extract(ExtractRequest(model="llama3-8b", devices=4096))
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Callable

from flint.errors import FlintError
from flint.frontends.options import names_sdpa_kernel
from flint.models import ZOO_REMAT_POLICIES

FRAMEWORKS = ("jax", "torch")
DEFAULT_DEVICES = 4096
DEFAULT_HARDWARE = "h100-sxm"


@dataclass(frozen=True)
class ExtractRequest:
    """What to extract. `target` None: the built-in `model` (a zoo/preset name, a model YAML
    or a Hugging Face config.json); otherwise SCRIPT.py:FUNCTION, a .mlir/.mlirbc file or an
    XLA dump (DIR[:MODULE] or an HLO file)."""

    target: str | None = None
    # None: what the input says (an XLA dump knows its device count and its GPU), else
    # DEFAULT_DEVICES / DEFAULT_HARDWARE; a value given overrules a dump's own
    devices: int | None = None
    mesh: str | None = None             # e.g. "data=512,model=8"; None: the default for it
    hardware: str | None = None         # hardware spec (its compile target compiles)
    model: str = "llama3-8b"
    framework: str = "jax"              # jax | torch (a .mlir target is StableHLO)
    devices_per_host: int | None = None
    # zoo model options
    scan: bool | None = None            # layers in lax.scan (None: JAX scans, torch unrolls)
    layers: int | None = None
    seq_len: int | None = None
    batch_per_replica: int = 1
    remat: str | None = None            # None: selective
    sequence_parallel: bool = False
    dims: dict = field(default_factory=dict)    # model dimension overrides (layers, hidden..)
    gemm_precision: str | None = None
    # LoRA fine-tuning of the zoo model (flint.models.lora): (rank, "qkv,proj,...") or
    # (rank, targets, "fp8") for a base held in FP8; (): every weight trained
    lora: tuple = ()
    # attention core: flash (one fused kernel) | unfused (S x S scores through memory:
    # Megatron-LM's 2021 fused softmax in the JAX twin, one eager aten op per step of the
    # score path in the torch twin); None: flash. A torch step (the twin or the user's
    # own) may name the kernel SDPA runs instead: flash2 (its default) | cudnn
    attention: str | None = None
    # the torch twin's unfused attention (`attention` unfused): dropout probability on its
    # attention probabilities (Megatron-LM's --attention-dropout); 0: none
    attention_dropout: float = 0.0
    # script option: the function of the script giving the step's example arguments
    args_fn: str = "example_args"
    # torch options: fuse pointwise chains as torch.compile would; FSDP2's
    # reshard_after_forward (False: parameters kept gathered from forward to backward)
    fuse: bool = True
    reshard_after_forward: bool = True
    # graph passes run after lowering, e.g. "expand-loops"
    passes: str = ""
    # XLA compile options of the step, as (name, value) pairs (the engine's: a TPU run's
    # collective-matmul threshold, flint.frontends.targets.collective_matmul_options)
    compiler_options: tuple = ()

    @property
    def device_count(self) -> int:
        return DEFAULT_DEVICES if self.devices is None else self.devices

    @property
    def target_hardware(self) -> str:
        return DEFAULT_HARDWARE if self.hardware is None else self.hardware

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
        from flint.frontends.targets import (import_jax_quietly, prepare_environment,
                                             resolve_target)
        from flint.passes import parse_pipeline

        if self.framework not in FRAMEWORKS:
            raise FlintError(f"unknown --framework {self.framework!r}; use jax or torch")
        check_device_count(self.device_count)
        if self.compiler_options and (self.framework != "jax" or self.is_stablehlo
                                      or self.is_hlo_dump):
            raise FlintError("XLA compile options apply to a JAX step Flint compiles, not to "
                             "a torch step, a StableHLO file or an XLA dump")
        if self.lora:
            from flint.models.lora_targets import parse_targets

            if int(self.lora[0]) < 1:
                raise FlintError(f"--lora-rank {self.lora[0]}: a LoRA rank is at least 1")
            parse_targets(self.lora[1])
        if self.remat is not None and self.remat not in ZOO_REMAT_POLICIES:
            raise FlintError(f"unknown --remat {self.remat!r}; use "
                             f"{' | '.join(ZOO_REMAT_POLICIES)}")
        if self.devices_per_host is not None and self.devices_per_host < 1:
            raise FlintError(f"--devices-per-host must be at least 1, not {self.devices_per_host}")
        from flint.frontends.options import check_options

        prepare_environment()
        import_jax_quietly()      # model configs import JAX: quietly, before anything else
        check_options(self)
        resolve_target(self.target_hardware)
        parse_pipeline(self.passes)


def extract(request: ExtractRequest, stage: Callable[[str], None] | None = None,
            after_pass: Callable | None = None):
    """(graph, timings in seconds) of the request's step, its passes run. `stage(text)`
    hears what is happening; `after_pass(pass_or_None, graph)` sees the lowered graph
    (None) and the graph after each pass. Flint's warnings about the program (sharding,
    precision, gradient reduction) go to stderr as one `flint: warning:` line each and
    stay in graph.meta."""
    from flint.passes import parse_pipeline, run_pipeline

    request.check()
    stage = stage or (lambda text: None)
    t_start = time.perf_counter()
    with flint_warnings_on_stderr():
        if request.is_hlo_dump:
            graph, timings = _dump_graph(request, stage)
        elif request.is_stablehlo:
            graph, timings = _stablehlo_graph(request, stage)
        elif request.framework == "torch":
            from flint.frontends.torch_steps import torch_graph

            graph, timings = torch_graph(request, stage)
        else:
            graph, timings = _jax_graph(request, stage)
        if "program_warnings" not in graph.meta:     # dumps and StableHLO
            from flint.frontends.program_checks import record_and_warn

            record_and_warn(graph)
    from flint.frontends.training_facts import record_training

    record_training(graph)
    if names_sdpa_kernel(request):
        graph = with_attention_kernel(graph, request.attention)
    # the zoo twin's E2M1 containers as the GPU stores them (the engine's stage programs
    # come through here too)
    if request.gemm_precision == "nvfp4":
        from flint.passes.nvfp4_storage import Nvfp4Storage

        graph = Nvfp4Storage().run(graph)
    if after_pass is not None:
        after_pass(None, graph)
    graph = run_pipeline(graph, parse_pipeline(request.passes), callback=after_pass)
    return graph, dict(timings, total_s=time.perf_counter() - t_start)


def with_attention_kernel(graph, kernel: str):
    """The graph with its fused attention nodes running `kernel` (a torch step's SDPA back
    end, named by the user: a trace on a host cannot see which one the GPU build picks)."""
    from dataclasses import replace

    from flint.passes.kernel_population import named_attention

    def named(node):
        attn = named_attention(node.meta.get("attention"), kernel)
        return node if attn is None else replace(node, meta=dict(node.meta, attention=attn))

    return replace(graph, nodes=[named(n) for n in graph.nodes])


@contextlib.contextmanager
def flint_warnings_on_stderr():
    """Flint's own warnings (ShardingWarning, ProgramWarning) as one plain
    `flint: warning: ...` line each on stderr; any other warning as Python shows it."""
    import sys
    import warnings

    from flint.frontends.program_checks import ProgramWarning
    from flint.frontends.sharding_report import ShardingWarning

    ours = (ShardingWarning, ProgramWarning)
    with warnings.catch_warnings(record=True) as caught:
        for category in ours:
            warnings.simplefilter("always", category)
        yield
    for w in caught:
        if issubclass(w.category, ours):
            print(f"flint: warning: {w.message}", file=sys.stderr)
        else:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)


def _jax_graph(request: ExtractRequest, stage):
    from flint.frontends.steps import captured_step

    step, args, label, info = captured_step(request)
    devices = step.cfg.devices
    stage(f"tracing and lowering {label} for {devices} devices")
    lowered = step.lower(*args)
    stage(f"compiling with XLA for {devices} x {step.cfg.hardware} (no hardware runs)")
    try:
        compiled = lowered.compile()
    except FlintError as err:
        if request.target is not None or "RESOURCE_EXHAUSTED" not in str(err):
            raise
        compiled = _compile_with_tiled_scores(request, stage, step.cfg.hardware)
    stage("lowering optimized HLO into the workload graph")
    graph = compiled.workload()
    graph.meta["model"] = label
    if info.get("model_flops"):
        graph.meta.update(model_flops_per_device=info["model_flops"] / devices,
                          model_flops_source="model config (PaLM appendix B)")
    if info.get("seq_len"):
        graph.meta["training"] = {k: info[k] for k in ("seq_len", "global_batch", "layers",
                                                       "remat") if k in info}
        graph.meta["training"]["batch_per_replica"] = request.batch_per_replica
        graph.meta["training"]["gemm_precision"] = request.gemm_precision or "bf16"
    if info.get("experts"):
        graph.meta["moe"] = {k: info[k] for k in ("experts", "top_k", "ep", "capacity_factor")}
    if info.get("lora_rank"):      # LoRA: what the step trains (flint.models.lora)
        graph.meta["lora"] = {k: info[k] for k in ("lora_rank", "lora_weights", "lora_base",
                                                   "trained_params")}
    return graph, compiled.timings


def _compile_with_tiled_scores(request: ExtractRequest, stage, hardware: str):
    """A zoo program XLA refused for the target's memory, traced again with its attention
    core over query tiles (flint.models.attention.tiled_scores): the twin's fp32 S x S
    scores, which no flash kernel stores, are what a long sequence overflows. Each tile's
    scores take at most 1/64 of the device memory, an on-chip-sized share; the tiles
    collapse into the same attention call, so the price is the untiled program's."""
    from flint.frontends.steps import captured_step
    from flint.hardware_models.spec import load_spec
    from flint.models.attention import tiled_scores

    budget = max(1, int(load_spec(hardware).hbm_capacity / SCORE_SHARE))
    with tiled_scores(budget):
        step, args, label, _ = captured_step(request)   # a fresh trace under the budget
        stage(f"compiling {label} again, its attention core over query tiles")
        lowered = step.lower(*args)
    compiled = lowered.compile()
    compiled.notes.append(
        f"XLA refused the program for the memory of {hardware}: recompiled with the "
        f"attention core's scores over query tiles of at most {budget / 2**20:.0f} MiB "
        f"each (the twin's S x S scores, which a flash kernel never stores)")
    return compiled


# the share of a device's memory one query tile's fp32 scores may take on the retry
SCORE_SHARE = 64


def _dump_graph(request: ExtractRequest, stage):
    """An XLA dump's graph: the dump knows its device count and GPU, so only values the
    request gives (not None) overrule them."""
    from flint.frontends.hlo_dump import load_dump

    t0 = time.perf_counter()
    stage(f"reading the optimized HLO of {request.target}")
    graph = load_dump(request.target, devices=request.devices, mesh=request.mesh or None,
                      hardware=request.hardware, devices_per_host=request.devices_per_host)
    return graph, {"hlo_dump_s": time.perf_counter() - t0}


def _stablehlo_graph(request: ExtractRequest, stage):
    from flint.cluster import parse_mesh
    from flint.frontends.stablehlo import load_stablehlo

    t0 = time.perf_counter()
    devices, mesh = request.device_count, request.mesh
    stage(f"compiling StableHLO {request.target} for {devices} devices")
    graph = load_stablehlo(request.target, devices=devices,
                           mesh=parse_mesh(mesh, devices) if mesh else None,
                           hardware=request.target_hardware,
                           devices_per_host=request.devices_per_host)
    return graph, {"stablehlo_s": time.perf_counter() - t0}
