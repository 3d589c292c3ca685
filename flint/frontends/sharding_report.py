"""Per-argument sharding table of a step, and the warnings a user needs before trusting it.

An argument without a spec is replicated: correct, but a forgotten batch spec makes every
device compute the whole global batch (the step's flops grow by the data-parallel degree)
and a forgotten parameter spec stores the whole tensor on every device. Neither fails to
compile, so Flint says so: a replicated batch-like argument under a data-parallel mesh, a
large replicated argument, and a `rules` regex that matched no argument.
"""
from __future__ import annotations

import math
import re
import warnings

# A replicated argument this large costs as much memory on every device as a whole
# 8B-parameter model's embedding table in bf16 (128256 x 4096 x 2 B = 1.0 GB); smaller
# replicated tensors (norm scales, biases, small models) are usually meant.
LARGE_REPLICATED_BYTES = 1 << 30
# Mesh axes that split the batch in Flint's naming and in common user code.
DATA_AXES = ("data", "fsdp", "batch", "dp", "ddp", "replica", "dcn")
# Mesh dimensions that split the model, not the batch (flint.models.torch_parallel.TP_AXES,
# torchtitan's tp/cp/ep)
NOT_DATA_DIMS = ("tp", "model", "tensor", "sp", "cp", "context", "ep", "expert")
# Path components that name a batch: the argument itself or a key inside it.
_BATCH_KEY = re.compile(r"^(batch|batches|inputs?|input_ids|tokens|targets?|labels?|images?|"
                        r"x|y|examples?|data|segment_ids|positions)$", re.IGNORECASE)
# Path components that name model or optimizer state: a `positions` table inside the model
# is a parameter, not a batch.
_STATE_KEY = re.compile(r"^(params?|parameters|model|opt_state|optimizer|state|weights|"
                        r"variables)$", re.IGNORECASE)


def is_batch_path(key: str) -> bool:
    """Does an argument path name a batch (and not state that happens to share a name)?"""
    parts = key.split("/")
    return any(_BATCH_KEY.match(p) for p in parts) and not any(_STATE_KEY.match(p)
                                                               for p in parts)


# HLO's short dtype names, as the rest of Flint prints shapes.
_SHORT = {"bfloat16": "bf16", "float32": "f32", "float16": "f16", "float64": "f64",
          "int32": "s32", "int64": "s64", "int16": "s16", "int8": "s8", "uint8": "u8",
          "uint32": "u32", "bool": "pred", "complex64": "c64", "float8_e4m3fn": "f8e4m3fn",
          "float8_e5m2": "f8e5m2"}


class ShardingWarning(UserWarning):
    """A sharding that compiles but is probably not what the user meant."""


def _axes(spec) -> list[str]:
    out = []
    for entry in spec:
        if entry is None:
            continue
        out.extend([entry] if isinstance(entry, str) else list(entry))
    return out


def _fmt_bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def sharding_report(rows: list, mesh_sizes: dict) -> tuple[list[list], list[str]]:
    """(table, warnings) from abstract_args' report rows. Table rows: [argument, shape,
    spec, where the spec came from, bytes per device]."""
    table, notes, unmatched = [], [], []
    devices = math.prod(mesh_sizes.values()) or 1
    data_axes = [a for a in mesh_sizes if a.lower() in DATA_AXES and mesh_sizes[a] > 1]
    data_ways = math.prod(mesh_sizes[a] for a in data_axes)
    for key, struct, source in rows:
        if key == "rules-unmatched":
            unmatched = struct
            continue
        spec = struct.sharding.spec
        axes = _axes(spec)
        split = math.prod(mesh_sizes[a] for a in axes)
        nbytes = math.prod(struct.shape) * struct.dtype.itemsize
        dtype = _SHORT.get(str(struct.dtype), str(struct.dtype))
        shape = f"{dtype}[{','.join(map(str, struct.shape))}]"
        table.append([key, shape, str(spec), source, nbytes // split])
        if axes or devices == 1:
            continue
        parts = key.split("/")
        if (data_ways > 1 and struct.shape and struct.shape[0] % data_ways == 0
                and is_batch_path(key)):
            axis = "fsdp" if "fsdp" in data_axes else data_axes[0]
            notes.append(
                f"argument {key} ({shape}) is replicated: each of the {data_ways} "
                f"data-parallel replicas ({'+'.join(data_axes)}) gets the whole global "
                f"batch and, unless the step constrains its activations, computes all of "
                f"it; shard its batch dimension, e.g. rules=[(r\"^{parts[0]}\", "
                f"P(\"{axis}\"))] or jit in_shardings")
        elif nbytes >= LARGE_REPLICATED_BYTES:
            notes.append(f"argument {key} ({shape}, {_fmt_bytes(nbytes)}) is replicated on "
                         f"all {devices} devices: give it a spec if that is not meant")
    examples = ", ".join(r[0] for r in table[:3])
    for pattern in unmatched:
        notes.append(f"rule {pattern!r} matches no argument (argument paths look like: "
                     f"{examples})")
    return table, notes


def warn(notes: list[str]) -> None:
    for note in notes:
        warnings.warn(note, ShardingWarning, stacklevel=3)
