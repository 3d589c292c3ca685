"""Warnings for programs that compile but are probably not what their user meant.

Each is one line (a `ProgramWarning`; the CLI prints it as `flint: warning: ...`) and is
kept in `graph.meta["program_warnings"]`:

- float32 GEMMs in a training step whose user asked for mixed precision somewhere
  (autocast, FSDP2's MixedPrecisionPolicy, low-precision parameters, or other GEMMs in
  bfloat16/FP8): a forgotten cast runs at the float32 (TF32) rate;
- a data-parallel mesh axis over which the training step reduces no gradients: each
  replica then trains on its own (a model not wrapped in DDP/FSDP, a replicated batch);
- a sequence length taken from a model config's maximum (max_position_embeddings), which
  is the longest sequence the model accepts, not the one it trains at.

A replicated batch-like argument is warned about where the shardings are known
(flint.frontends.sharding_report).
"""
from __future__ import annotations

import warnings

from flint.frontends.sharding_report import DATA_AXES

LOW_PRECISION = ("bf16", "f16", "f8e4m3fn", "f8e5m2", "f8e4m3fnuz", "f8e5m2fnuz")
# A float32 share of GEMM flops below this is the usual exception (a float32 router or
# LM head some recipes keep), not a forgotten cast.
F32_GEMM_SHARE = 0.05
REDUCTIONS = ("all-reduce", "reduce-scatter")


class ProgramWarning(UserWarning):
    """A program that compiles but is probably not what its user meant."""


def check_program(graph) -> list[str]:
    """The warnings of a lowered training step (see the module docstring)."""
    notes = []
    if graph.cluster.platform != "cpu":   # XLA:CPU upcasts bf16 dots; its GEMMs say nothing
        notes += _f32_gemms(graph)
    notes += _unreduced_data_axes(graph)
    return notes


def record_and_warn(graph) -> list[str]:
    notes = check_program(graph)
    graph.meta["program_warnings"] = notes
    for note in notes:
        warnings.warn(note, ProgramWarning, stacklevel=3)
    return notes


def _dtype(shape: str) -> str:
    return shape.split("[", 1)[0]


def _f32_gemms(graph) -> list[str]:
    gemms = [n for n in graph.nodes if n.op_class in ("gemm", "conv") and n.operands]
    total = sum(n.flops * n.repeat for n in gemms)
    f32 = [n for n in gemms if all(_dtype(o) == "f32" for o in n.operands[:2])]
    f32_flops = sum(n.flops * n.repeat for n in f32)
    if not total or f32_flops <= F32_GEMM_SHARE * total:
        return []
    asked = _mixed_precision_asked(graph, gemms)
    if not asked:
        return []
    biggest = max(f32, key=lambda n: n.flops * n.repeat)
    where = biggest.meta.get("scope") or biggest.meta.get("layer") or biggest.name
    return [f"{100 * f32_flops / total:.0f}% of the GEMM flops run in float32 (largest: "
            f"{biggest.op} {' x '.join(biggest.operands[:2])} in {where}) although the "
            f"step asks for mixed precision ({asked}); if that is not meant, cast there "
            f"or widen the autocast region"]


def _mixed_precision_asked(graph, gemms) -> str:
    """Where the step asked for low precision, or '' if nowhere."""
    capture = graph.meta.get("capture") or {}
    if capture.get("autocast"):
        return "autocast " + ", ".join(capture["autocast"])
    if capture.get("fsdp_param_dtype"):
        return "FSDP2 param_dtype " + ", ".join(capture["fsdp_param_dtype"])
    if capture.get("low_precision_parameters"):
        return "low-precision parameters"
    low = [n for n in gemms if any(_dtype(o) in LOW_PRECISION for o in n.operands[:2])]
    if low:
        return f"{len(low)} other GEMMs in {_dtype(low[0].operands[0])}"
    return ""


def _unreduced_data_axes(graph) -> list[str]:
    if not any(n.meta.get("phase") == "backward" for n in graph.nodes):
        return []                              # not a training step
    sizes = dict(graph.cluster.mesh)
    reduced = set()
    for n in graph.nodes:
        if n.collective is not None and n.collective.type in REDUCTIONS:
            reduced.update(graph.communicators[n.collective.communicator].mesh_axes)
    notes = []
    for axis, size in sizes.items():
        if size > 1 and axis.lower() in DATA_AXES and axis not in reduced:
            notes.append(f"mesh axis {axis} ({size} ways) is data-parallel, but the step "
                         f"reduces no gradients over it: each replica trains on its own "
                         f"(wrap the model in DDP or FSDP, or shard the batch over {axis})")
    return notes


def config_max_sequence(model, seq_len, dims=None) -> int | None:
    """The max_position_embeddings a Hugging Face config.json `model` would train at when
    no sequence length is given; None when one is given or `model` is no such file."""
    from pathlib import Path

    if seq_len is not None or (dims or {}).get("seq") is not None:
        return None
    if not (isinstance(model, str) and model.endswith(".json") and Path(model).is_file()):
        return None
    from flint.models.describe import from_file

    return from_file(model).seq_len


def warn_config_sequence(model, seq_len, dims=None) -> None:
    longest = config_max_sequence(model, seq_len, dims)
    if longest is not None:
        warnings.warn(f"sequence length {longest} is {model}'s max_position_embeddings, the "
                      f"longest sequence the model accepts, not one it trains at; give "
                      f"seq_len", ProgramWarning, stacklevel=3)
