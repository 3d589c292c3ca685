"""PyTorch profiler (Kineto) JSON: NCCL collective kernels with their message sizes.

NCCL kernels carry `Collective name`, `In msg nelems`, `Out msg nelems`, `dtype` and
`Group size` in their args (PyTorch >= 2.2 with NCCL profiling metadata).
"""
from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path

from flint.errors import FlintError

DTYPE_BYTES = {"Float": 4, "Half": 2, "BFloat16": 2, "Double": 8, "Int": 4, "Long": 8,
               "Byte": 1, "Char": 1, "Float8_e4m3fn": 1, "Float8_e5m2": 1}


@dataclass(frozen=True)
class NcclKernel:
    collective: str          # allreduce, allgather, reduce_scatter, ...
    in_bytes: int
    out_bytes: int
    group_size: int
    duration_s: float
    algorithm: str           # the kernel name's algorithm/protocol, e.g. RING_LL


def read_kineto(path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise FlintError(f"file not found: {path}")
    try:
        raw = path.read_bytes()
        data = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    except (OSError, EOFError, ValueError) as e:
        raise FlintError(f"{path} is not a readable Kineto trace: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise FlintError(f"{path} has no traceEvents: not a Kineto trace")
    return data


def nccl_kernels(trace: dict) -> list[NcclKernel]:
    out = []
    for e in trace["traceEvents"]:
        args = e.get("args") or {}
        if e.get("ph") != "X" or e.get("cat") != "kernel" or "Collective name" not in args:
            continue
        size = DTYPE_BYTES.get(str(args.get("dtype")), 4)
        name = e.get("name", "")
        algo = name.split("_", 2)[2].rsplit("_", 2)[0] if name.count("_") >= 3 else ""
        out.append(NcclKernel(str(args["Collective name"]), int(args["In msg nelems"]) * size,
                              int(args["Out msg nelems"]) * size, int(args.get("Group size", 1)),
                              float(e["dur"]) * 1e-6, algo))
    return out
