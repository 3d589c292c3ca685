"""PyTorch profiler (Kineto) JSON: NCCL collective kernels with their message sizes.

NCCL kernels carry `Collective name`, `In msg nelems`, `Out msg nelems`, `dtype` and
`Group size` in their args (PyTorch >= 2.2 with NCCL profiling metadata).
"""
from __future__ import annotations

from dataclasses import dataclass

from flint.errors import FlintError
from flint.validate.measured import MeasuredStep, MeasuredTrace
from flint.validate.trace_events import KernelEvent, checked, checked_nccl_args, read_trace_events

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
    return {"traceEvents": read_trace_events(path, "Kineto trace")}


def nccl_kernels(trace: dict, path: str = "Kineto trace") -> list[NcclKernel]:
    out = []
    nccl = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "kernel"
            and isinstance(e.get("args"), dict) and "Collective name" in e["args"]]
    checked(KernelEvent, nccl, path, "NCCL kernel")
    checked_nccl_args(nccl, path)
    for e in nccl:
        args = e["args"]
        size = DTYPE_BYTES.get(str(args.get("dtype")), 4)
        name = e.get("name", "")
        algo = name.split("_", 2)[2].rsplit("_", 2)[0] if name.count("_") >= 3 else ""
        out.append(NcclKernel(str(args["Collective name"]), int(args["In msg nelems"]) * size,
                              int(args["Out msg nelems"]) * size, int(args.get("Group size", 1)),
                              float(e["dur"]) * 1e-6, algo))
    return out


def kineto_steps(trace: dict, path: str = "") -> MeasuredTrace:
    """GPU kernels grouped by the `ProfilerStep#N` whose CPU span launched them (runtime
    launch and kernel share a `correlation` id); a step's time is its kernels' GPU span."""
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    steps_ = checked(KernelEvent, [e for e in events
                                   if str(e.get("name", "")).startswith("ProfilerStep#")
                                   and e.get("cat") != "gpu_user_annotation"],
                     path, "step span")                  # the CPU-side step span
    marks = sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"]), str(e["name"]))
                   for e in steps_)
    launches = checked(KernelEvent, [e for e in events
                                     if e.get("cat") in ("cuda_runtime", "cuda_driver") and
                                     isinstance(e.get("args"), dict)
                                     and "correlation" in e["args"]], path, "CUDA launch")
    launch_ts = {str(e["args"]["correlation"]): float(e["ts"]) for e in launches}
    kernels = checked(KernelEvent, [e for e in events
                                    if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")],
                      path, "GPU kernel")
    if not kernels:
        raise FlintError(f"{path}: no GPU kernels in this Kineto trace")
    whole = not marks
    if whole:
        marks = [(float("-inf"), float("inf"), "whole trace")]
    per_step: dict[int, list[dict]] = {}
    for k in kernels:   # a kernel launched outside every step (or before tracing) is no step's
        args = k.get("args") if isinstance(k.get("args"), dict) else {}
        c = args.get("correlation")
        t = launch_ts.get(str(c)) if c is not None else None
        if t is None:
            if not whole:
                continue
            t = float(k["ts"])
        for i, (lo, hi, _) in enumerate(marks):
            if lo <= t <= hi:
                per_step.setdefault(i, []).append(k)
                break
    steps = []
    for i in sorted(per_step):
        ks = per_step[i]
        span = (max(float(k["ts"]) + float(k["dur"]) for k in ks) - min(float(k["ts"]) for k in ks))
        ops: dict[str, dict[str, float]] = {}
        for k in ks:
            args = k.get("args") if isinstance(k.get("args"), dict) else {}
            dev = str(args.get("device", k.get("pid")))
            d = ops.setdefault(dev, {})
            name = str(k.get("name", ""))
            d[name] = d.get(name, 0.0) + float(k["dur"]) * 1e-6
        steps.append(MeasuredStep(len(steps) + 1, span * 1e-6, ops))
    return MeasuredTrace(path, "kineto", "pytorch", steps)
