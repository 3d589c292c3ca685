"""What a run file may say: each field's type, range and words (RunSchema), with the
vocabularies the engine's passes act on, and the nearest known word for a misspelt one.
flint.run.TrainingRun validates every run against it; flint.run_checks checks the fields
against each other."""
from __future__ import annotations

from typing import Literal, Optional, Union

from pydantic import Field
from typing_extensions import Annotated

from flint.cluster import MAX_DEVICES
from flint.errors import FlintError
from flint.models import REMAT_POLICIES
# where a step's micro-batch gradients are summed: inside the weight-gradient GEMM, by
# PyTorch's AccumulateGrad, or DeepSpeed BF16_Optimizer's fp32 copy
from flint.passes.grad_accumulation import MODES as GRAD_ACCUMULATION
# how a pipeline stage's sends and receives run beside its compute (passes.pipeline)
from flint.passes.pipeline import P2P_MODES as PIPELINE_P2P
# how an unfused core's scale, mask and softmax run under megatron (passes.score_path)
from flint.passes.score_path import SOFTMAX as SCORE_PATHS
from flint.schema import Bool, Number, PositiveInt, Str, Strict, did_you_mean

SCHEDULES = ("1f1b", "interleaved", "gpipe")
SPLITS = ("time", "layers")
PRECISIONS = ("bf16", "fp8", "mxfp8", "nvfp4")
FP8_RECIPES = ("current", "delayed")
ZERO_STAGES = (0, 1, 2, 3)
DISPATCHERS = ("alltoall", "deepep")
# How the run's kernels are made (passes.kernel_population; hardware_models prices each
# population): Megatron-Core with Transformer Engine's fused library kernels, XLA's
# compiler fusions, PyTorch eager (one kernel per aten op) or torch.compile (Inductor's
# fusions). The PyTorch frameworks run the torch front end's own graphs (FSDP2, DTensor TP,
# DDP-style data parallelism), the others the JAX zoo's.
FRAMEWORKS = ("megatron", "xla", "torch-eager", "torch-compile")
# Which of XLA's GPU fusion emitters made an xla run's kernels
# (hardware_models.populations.XLA_EMITTERS): the MLIR emitters XLA has run on CUDA since
# 2024, or the LLVM ("legacy") emitters before them.
XLA_EMITTERS = ("mlir", "legacy")
# XLA's collective matmul on a TPU (flint.frontends.targets.collective_matmul_options)
COLLECTIVE_MATMUL = ("auto", "off")
# The attention core: one fused kernel (`flash`: the kernel the run's framework runs on the
# spec's GPU generation, passes.kernel_population), a named fused kernel where the run
# pins one (flash1: FlashAttention v1, 2022-05 to 2023-07, about half FlashAttention-2's
# rate; flash2; flash3: FlashAttention-3, Hopper only; cudnn: cuDNN's fused attention, which
# PyTorch's SDPA selects first on Hopper/Blackwell in builds for CUDA 12.9 and later), or
# unfused (S x S scores written to and read from HBM, softmax as its own kernel:
# Megatron-LM before flash attention, 2021-2022).
ATTENTION = ("flash", "flash1", "flash2", "flash3", "cudnn", "unfused")
# When the data-parallel gradient reduction runs in a step of several micro-batches: in
# every micro-batch's backward (PyTorch's default for DDP and FSDP2, which sync in each
# backward unless told not to; DeepSpeed ZeRO-2, whose sharded buffer needs it), or only
# in the last one's (DDP under no_sync(), FSDP2 with set_requires_gradient_sync(False),
# Megatron's schedules, an XLA step that sums its micro-batches first).
GRAD_SYNC = ("every-microbatch", "last-microbatch")
# How ZeRO-1/2's sharded optimizer moves data (passes.distributed_optimizer): gradients
# reduce-scattered and parameters all-gathered (Megatron-Core's distributed optimizer,
# DeepSpeed's ZeRO stage 1/2 optimizer), gradients all-reduced over every data-parallel
# rank and each shard's owner broadcasting its parameters (InternEvo's
# HybridZeroOptimizer), or gradients all-reduced and parameters all-gathered (DeepSpeed's
# BF16_Optimizer, BLOOM's ZeRO-1).
ZERO_SYNC = ("reduce-scatter", "broadcast", "all-reduce")
# How a LoRA step's frozen base is held (flint.models.lora.BASES)
LORA_BASES = ("bf16", "fp8")
# The dtype zero 1/2 keep and reduce gradients in: fp32 main gradients (Megatron-LM forces
# them for bf16 runs; Megatron-Core's default) or bf16 (Megatron-Core's
# grad_reduce_in_fp32=False, set by NVIDIA's NeMo 2.0 / Megatron-Bridge performance
# recipes; DeepSpeed's bf16 communication_data_type; InternEvo's gradients, reduced in
# the model's dtype): half the bytes reduced, 2 bytes per parameter less
# (passes.distributed_optimizer)
GRAD_REDUCE_DTYPES = ("fp32", "bf16")

_Degree = Annotated[PositiveInt, Field(le=MAX_DEVICES)]


class RunSchema(Strict):
    """A run as JSON/YAML: types, ranges and enums (TrainingRun checks the rest)."""

    model: Union[Str, dict[Str, Union[Str, Number, Bool]]]
    devices: _Degree
    seq_len: Annotated[PositiveInt, Field(le=2**22)]
    hardware: Str = "h100-sxm"
    devices_per_host: Annotated[int, Field(ge=0, le=MAX_DEVICES)] = 0
    tp: _Degree = 1
    sp: Optional[Bool] = None
    cp: _Degree = 1
    pp: _Degree = 1
    vp: Annotated[PositiveInt, Field(le=1024)] = 1
    schedule: Optional[Literal[SCHEDULES]] = None
    pipeline_split: Literal[SPLITS] = "time"
    pipeline_p2p: Optional[Literal[PIPELINE_P2P]] = None
    pipeline_scatter_gather: Bool = False
    ep: _Degree = 1
    dispatcher: Literal[DISPATCHERS] = "alltoall"
    zero: Literal[ZERO_STAGES] = 1
    hsdp: Annotated[int, Field(ge=0, le=MAX_DEVICES)] = 0
    micro_batch: Annotated[PositiveInt, Field(le=2**16)] = 1
    global_batch: Annotated[int, Field(ge=0, le=2**24)] = 0
    remat: Literal[REMAT_POLICIES] = "selective"
    recompute_layers: Annotated[int, Field(ge=0, le=2**16)] = 0
    precision: Literal[PRECISIONS] = "bf16"
    framework: Literal[FRAMEWORKS] = "megatron"
    attention: Literal[ATTENTION] = "flash"
    attention_dropout: Annotated[float, Field(ge=0, lt=1)] = 0.0
    score_path: Literal[SCORE_PATHS] = "fused"
    overlap_grad_reduce: Bool = True
    grad_accumulation: Optional[Literal[GRAD_ACCUMULATION]] = None
    grad_sync: Optional[Literal[GRAD_SYNC]] = None
    zero_sync: Literal[ZERO_SYNC] = "reduce-scatter"
    grad_reduce_dtype: Literal[GRAD_REDUCE_DTYPES] = "fp32"
    tp_comm_overlap: Optional[Bool] = None
    tp_grad_overlap: Optional[Bool] = None
    collective_matmul: Literal[COLLECTIVE_MATMUL] = "auto"
    launch_blocking: Bool = False
    cuda_graphs: Optional[Bool] = None
    xla_emitters: Literal[XLA_EMITTERS] = "mlir"
    reshard_after_forward: Optional[Bool] = None
    routing: Str = "balanced"
    fp8_recipe: Literal[FP8_RECIPES] = "current"
    lora_rank: Annotated[int, Field(ge=0, le=2**16)] = 0
    lora_targets: Str = "qkv,proj,fc1,fc2"
    lora_base: Literal[LORA_BASES] = "bf16"


def suggest_word(doc: dict, where: str) -> None:
    """A misspelt word field (an enum, a model preset, a hardware spec) named with the
    nearest known word."""
    import typing

    known: dict = {}
    for name, info in RunSchema.model_fields.items():
        hint = info.annotation
        for arg in ((hint,) if typing.get_origin(hint) is Literal
                    else typing.get_args(hint) or (hint,)):
            if typing.get_origin(arg) is Literal:
                words = []
                for v in typing.get_args(arg):      # Literal[TUPLE] holds the tuple
                    words.extend(v if isinstance(v, tuple) else (v,))
                known[name] = [str(v) for v in words]
    value = doc.get("model")
    if isinstance(value, str) and not value.endswith((".yaml", ".yml", ".json")):
        from flint.models.describe import known_models

        known["model"] = list(known_models())
    value = doc.get("hardware")
    if isinstance(value, str) and not value.endswith((".yaml", ".yml")):
        from flint.frontends.targets import ALIASES
        from flint.hardware_models.spec import spec_names

        known["hardware"] = spec_names() + list(ALIASES)
    for name, words in known.items():
        value = doc.get(name)
        if isinstance(value, str) and value not in words and value.lower() not in words:
            raise FlintError(f"{where}: {name}: unknown {value!r}{did_you_mean(value, words)}")
