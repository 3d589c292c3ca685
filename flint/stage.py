"""One pipeline stage's program: what its compiled template depends on, and nothing else.

The engine (flint.engine) compiles a few unrolled layers of the model on the stage's mesh
and caches the result by this program's key (flint.template_cache); pipeline depth,
micro-batch count, schedule, ZeRO flavour, framework kernels, routing and hardware
what-ifs only change the passes and the pricing.
"""
from __future__ import annotations

import math

from flint.run import TrainingRun

# Unrolled layers per stage template: the first and last template layers stand for the
# model's first and last (they overlap the embedding and the head), the interior ones for
# every other layer. MoE layers compile slower; two of them keep the expert dispatch of
# a first and a last layer.
TEMPLATE_LAYERS = 3
MOE_TEMPLATE_LAYERS = 2
# Data-parallel replicas run the same per-device program; only their gradient reduction's
# group differs. A stage program is compiled with at most COMPILED_DATA replicas on its
# `data` axis (two, so the reduction exists) and re-targeted to the run's data-parallel
# size by passes.rescale, so runs that differ only in data parallelism (device count,
# pipeline depth) share one compile. FSDP, expert, context and tensor axes compile at their
# real sizes (they change the per-device work).
COMPILED_DATA = 2
# Bumped whenever the zoo's workload changes so cached programs of older code are not
# reused; the torch twin's own (3: torchtitan's op-level SAC, RMSNorm weight in bf16;
# 4: an out= write, FSDP2's parameter copy-out, no longer keeps the buffer it overwrites)
WORKLOAD_VERSION, TORCH_WORKLOAD_VERSION = 5, 4


def compile_target(run: TrainingRun) -> str:
    """The compile-only target the run's hardware spec names."""
    from flint.frontends.targets import resolve_target

    return resolve_target(run.hardware).hardware


def attention_core(run: TrainingRun) -> str:
    """The attention core the run's stage compiles (attention_kernels.compiled_core)."""
    from flint.hardware_models.attention_kernels import compiled_core

    return compiled_core(run.attention, run.hardware)


def devices_per_host(run: TrainingRun) -> int:
    from flint.hardware_models.spec import load_spec

    return run.devices_per_host or load_spec(run.hardware).devices_per_node


def stage_program(run: TrainingRun, exact: bool = False) -> dict:
    """Everything one pipeline stage's extracted template depends on, and nothing else
    (pipeline depth, micro-batch count, schedule, ZeRO flavour, framework kernels, routing
    and hardware what-ifs only change the passes and the pricing)."""
    from flint.frontends.targets import tpu_program_keys
    from flint.models import compiled_attention, compiled_remat
    from flint.models.describe import to_mapping

    cfg = run.model_config()
    layers = MOE_TEMPLATE_LAYERS if cfg.n_experts else TEMPLATE_LAYERS
    if cfg.n_experts:
        # leading dense layers are priced as MoE layers (DeepSeek-V3's first 3: the same
        # active FFN work, plus their router and all-to-alls)
        cfg = cfg.with_(first_dense=0)
    mesh = compiled_mesh(run, exact)
    devices = math.prod(s for _, s in mesh)
    torch = run.framework.startswith("torch")
    program = {"framework": "torch" if torch else "jax", "model": to_mapping(cfg),
               "devices": devices,
               "mesh": [list(a) for a in mesh], "batch_per_replica": run.micro_batch,
               "remat": compiled_remat(run.remat, run.framework),
               "sequence_parallel": bool(run.sp), "scan": False,
               "seq_len": run.seq_len, "layers": min(layers, cfg.n_layers),
               "hardware": compile_target(run),
               "devices_per_host": min(devices_per_host(run), devices),
               "workload_version": WORKLOAD_VERSION}
    program.update(tpu_program_keys(program["hardware"]))
    if run.collective_matmul != "auto":         # only then: other programs keep their keys
        from flint.frontends.targets import collective_matmul_options

        program["compiler_options"] = collective_matmul_options(run.collective_matmul)
    if run.precision != "bf16":
        program["gemm_precision"] = "fp8-delayed" if (
            run.precision, run.fp8_recipe) == ("fp8", "delayed") else run.precision
    if run.lora_rank:       # only then: full-training programs keep their keys
        program["lora"] = [run.lora_rank, run.lora_targets] + (
            [run.lora_base] if run.lora_base != "bf16" else [])
    if compiled_attention(attention_core(run), run.framework):
        program["attention"] = compiled_attention(attention_core(run), run.framework)
    if torch and run.attention_dropout:     # only then: other programs keep their keys
        program["attention_dropout"] = run.attention_dropout
    if torch:       # torch.compile's Inductor fuses pointwise chains; eager runs each op
        program["fuse"] = run.framework == "torch-compile"
        program["torch_workload_version"] = TORCH_WORKLOAD_VERSION
        if not run.reshard_after_forward:
            program["reshard_after_forward"] = False
    return program


def compiled_mesh(run: TrainingRun, exact: bool = False) -> tuple:
    """The stage mesh the program compiles for: the run's, its `data` axis capped at
    COMPILED_DATA unless `exact`. Under ZeRO-3 the shards' sizes change the per-device
    program, so the FSDP axis compiles as it is; the `data` axis (HSDP's replicas, which
    only all-reduce the shards' gradients) is capped as any data axis is."""
    if exact:
        return run.mesh()
    return tuple((n, min(s, COMPILED_DATA) if n == "data" else s) for n, s in run.mesh())
