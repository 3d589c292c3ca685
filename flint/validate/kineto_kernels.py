"""Kineto GPU kernels joined to the CPU-side operators that launched them.

A kernel and its launch call (cudaLaunchKernel, cudaLaunchKernelExC, cuLaunchKernel,
cudaMemsetAsync, ...) share a `correlation` id. The launch runs inside the operators open on
its CPU thread at that moment and carries the `External id` of the innermost one; walking
the enclosing operators outward gives the kernel's operator stack (aten::linear ->
aten::addmm). With `record_shapes` the operators carry `Input Dims`, `Input type` and
(PyTorch >= 2.1) `Concrete Inputs`, the scalar arguments as text.

A step's kernels are those whose launch lies inside the CPU-side `ProfilerStep#N` span;
the kernel itself may run later, on the GPU's timeline.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from flint.errors import FlintError

STEP = "ProfilerStep#"
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")
OP_CATEGORIES = ("cpu_op", "user_annotation")


@dataclass(frozen=True)
class CpuOp:
    index: int                       # position in the trace's CPU-op order (identity)
    name: str                        # "aten::addmm"
    tid: int
    start_us: float
    dur_us: float
    dims: tuple                      # per argument: its shape (a tuple of ints), or ()
    types: tuple[str, ...]           # per argument: "c10::BFloat16", "Scalar", "" (None)
    concrete: tuple[str, ...]        # per argument: scalar values as text, "" if a tensor


@dataclass(frozen=True)
class GpuKernel:
    name: str
    category: str                    # kernel | gpu_memcpy | gpu_memset
    start_us: float
    duration_s: float
    stack: tuple[CpuOp, ...]         # enclosing CPU operators, outermost first; () unlinked


@dataclass(frozen=True)
class StepKernels:
    step: int
    span_s: float                    # first kernel start to last kernel end, GPU timeline
    kernels: tuple[GpuKernel, ...]   # in GPU start order
    unlinked: int                    # kernels whose launch or launching operator is missing


def profiler_steps(events: list) -> dict[int, tuple[float, float]]:
    """ProfilerStep number -> its CPU span (start, end) in microseconds."""
    out = {}
    for e in filter(None, map(_complete, events)):
        number = e["name"][len(STEP):]
        if e["name"].startswith(STEP) and e["cat"] != "gpu_user_annotation" and number.isdigit():
            out[int(number)] = (e["ts"], e["ts"] + e["dur"])
    return out


def step_kernels(events: list, step: int | None = None, path: str = "") -> StepKernels:
    """The GPU work launched in ProfilerStep#`step` (the last step when None), each piece
    with the operator stack that launched it."""
    steps = profiler_steps(events)
    if not steps:
        raise FlintError(f"{path}: no {STEP}N spans in this Kineto trace")
    if step is None:
        step = max(steps)
    if step not in steps:
        raise FlintError(f"{path}: no {STEP}{step} (the trace has steps "
                         f"{', '.join(map(str, sorted(steps)))})")
    lo, hi = steps[step]
    xs = [c for c in map(_complete, events) if c is not None]
    launches = {e["correlation"]: e for e in xs
                if e["cat"] in LAUNCH_CATEGORIES and e["correlation"] is not None}
    stacks = _OpStacks([e for e in xs if e["cat"] in OP_CATEGORIES
                        and not e["name"].startswith(STEP)])
    kernels, unlinked = [], 0
    for e in xs:
        if e["cat"] not in GPU_CATEGORIES:
            continue
        launch = launches.get(e["correlation"]) if e["correlation"] is not None else None
        if launch is None or not lo <= launch["ts"] <= hi:
            continue        # launched before tracing started, or outside this step
        stack = stacks.stack(launch)
        unlinked += not stack
        kernels.append(GpuKernel(e["name"], e["cat"], e["ts"], e["dur"] * 1e-6, stack))
    if not kernels:
        raise FlintError(f"{path}: {STEP}{step} launched no GPU kernels")
    kernels.sort(key=lambda k: (k.start_us, k.name))
    span = max(k.start_us + k.duration_s * 1e6 for k in kernels) - kernels[0].start_us
    return StepKernels(step, span * 1e-6, tuple(kernels), unlinked)


class _OpStacks:
    """Which CPU operators enclose a launch: by its `External id` when the trace gives it,
    else by time on the launch's thread."""

    def __init__(self, events: list):
        ordered = sorted(events, key=lambda e: (str(e["tid"]), e["ts"], -e["dur"]))
        self.ops = [_cpu_op(i, e) for i, e in enumerate(ordered)]
        self.parent: list[int | None] = []
        self.by_external: dict = {}
        self.starts: dict = {}                   # tid -> (op starts, op indices), sorted
        open_ops: list[int] = []
        for i, (e, op) in enumerate(zip(ordered, self.ops)):
            while open_ops and (self.ops[open_ops[-1]].tid != op.tid or
                                _end(self.ops[open_ops[-1]]) <= op.start_us):
                open_ops.pop()
            self.parent.append(open_ops[-1] if open_ops else None)
            open_ops.append(i)
            if e["external"] is not None and e["cat"] == "cpu_op":
                self.by_external.setdefault(e["external"], i)
            starts, idx = self.starts.setdefault(op.tid, ([], []))
            starts.append(op.start_us)
            idx.append(i)

    def stack(self, launch: dict) -> tuple[CpuOp, ...]:
        ts, tid = launch["ts"], launch["tid"]
        ext = launch["external"]
        inner = self.by_external.get(ext) if ext is not None else None
        if inner is None or not _encloses(self.ops[inner], ts, tid):
            inner = self._innermost(ts, tid)
        out = []
        while inner is not None:
            out.append(self.ops[inner])
            inner = self.parent[inner]
        return tuple(reversed(out))

    def _innermost(self, ts: float, tid) -> int | None:
        starts, idx = self.starts.get(tid, ([], []))
        j = bisect.bisect_right(starts, ts) - 1
        i = idx[j] if j >= 0 else None
        while i is not None and not _encloses(self.ops[i], ts, tid):
            i = self.parent[i]
        return i


def _cpu_op(index: int, e: dict) -> CpuOp:
    args = e["args"]
    dims = tuple(_shape(d) for d in _listed(args.get("Input Dims")))
    types = tuple(str(t) for t in _listed(args.get("Input type")))
    concrete = tuple(str(c) for c in _listed(args.get("Concrete Inputs")))
    return CpuOp(index, e["name"], e["tid"], e["ts"], e["dur"], dims, types, concrete)


def _listed(value) -> list:
    return value if isinstance(value, list) else []


def _shape(d) -> tuple:
    """A tensor's dims as a tuple of ints; a tensor list's as a tuple of those; () for
    anything else (such an argument then counts as not recorded)."""
    if isinstance(d, list):
        out = tuple(_shape(x) if isinstance(x, list) else x for x in d)
        if all(isinstance(x, tuple) or (isinstance(x, int) and x >= 0) for x in out):
            return out
    return ()


def _complete(e) -> dict | None:
    """A complete ("X") event with the fields the join reads, checked and typed; None for
    any other event or one whose fields are malformed (it is skipped)."""
    if not isinstance(e, dict) or e.get("ph") != "X":
        return None
    args = e.get("args") if isinstance(e.get("args"), dict) else {}
    try:
        ts, dur = float(e["ts"]), float(e.get("dur", 0.0))
    except (KeyError, TypeError, ValueError):
        return None
    if not (math.isfinite(ts) and math.isfinite(dur)) or dur < 0:
        return None
    return {"name": str(e.get("name", "")), "cat": str(e.get("cat", "")), "ts": ts, "dur": dur,
            "tid": _ident(e.get("tid")), "args": args,
            "correlation": _ident(args.get("correlation")),
            "external": _ident(args.get("External id"))}


def _ident(value):
    """An id as recorded (int or str); None for anything else."""
    return value if isinstance(value, (int, str)) and not isinstance(value, bool) else None


def _end(op: CpuOp) -> float:
    return op.start_us + op.dur_us


def _encloses(op: CpuOp, ts: float, tid) -> bool:
    return op.tid == tid and op.start_us <= ts <= _end(op)
