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
    for e in events:
        name = str(e.get("name", ""))
        if e.get("ph") == "X" and name.startswith(STEP) and e.get("cat") != "gpu_user_annotation":
            try:
                out[int(name[len(STEP):])] = (float(e["ts"]), float(e["ts"]) + float(e["dur"]))
            except (KeyError, TypeError, ValueError):
                continue
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
    xs = [e for e in events if e.get("ph") == "X" and isinstance(e.get("args") or {}, dict)]
    launches = {}
    for e in xs:
        corr = (e.get("args") or {}).get("correlation")
        if e.get("cat") in LAUNCH_CATEGORIES and corr is not None:
            launches[corr] = e
    stacks = _OpStacks([e for e in xs if e.get("cat") in OP_CATEGORIES
                        and not str(e.get("name", "")).startswith(STEP)])
    kernels, unlinked = [], 0
    for e in xs:
        if e.get("cat") not in GPU_CATEGORIES:
            continue
        launch = launches.get((e.get("args") or {}).get("correlation"))
        if launch is None or not lo <= float(launch["ts"]) <= hi:
            continue        # launched before tracing started, or outside this step
        stack = stacks.stack(launch)
        unlinked += not stack
        kernels.append(GpuKernel(str(e.get("name", "")), e["cat"], float(e["ts"]),
                                 float(e.get("dur", 0.0)) * 1e-6, stack))
    if not kernels:
        raise FlintError(f"{path}: {STEP}{step} launched no GPU kernels")
    kernels.sort(key=lambda k: (k.start_us, k.name))
    span = max(k.start_us + k.duration_s * 1e6 for k in kernels) - kernels[0].start_us
    return StepKernels(step, span * 1e-6, tuple(kernels), unlinked)


class _OpStacks:
    """Which CPU operators enclose a launch: by its `External id` when the trace gives it,
    else by time on the launch's thread."""

    def __init__(self, events: list):
        ordered = sorted(events, key=lambda e: (str(e.get("tid")), float(e["ts"]), -float(e["dur"])))
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
            ext = (e.get("args") or {}).get("External id")
            if ext is not None and e.get("cat") == "cpu_op":
                self.by_external.setdefault(ext, i)
            starts, idx = self.starts.setdefault(op.tid, ([], []))
            starts.append(op.start_us)
            idx.append(i)

    def stack(self, launch: dict) -> tuple[CpuOp, ...]:
        ts, tid = float(launch["ts"]), launch.get("tid")
        inner = self.by_external.get((launch.get("args") or {}).get("External id"))
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
    args = e.get("args") or {}
    dims = tuple(_shape(d) for d in args.get("Input Dims") or [])
    types = tuple(str(t) for t in args.get("Input type") or [])
    concrete = tuple(str(c) for c in args.get("Concrete Inputs") or [])
    return CpuOp(index, str(e.get("name", "")), e.get("tid"), float(e["ts"]),
                 float(e.get("dur", 0.0)), dims, types, concrete)


def _shape(d) -> tuple:
    """A tensor's dims as a tuple of ints; a tensor list's as a tuple of those."""
    if isinstance(d, list):
        return tuple(_shape(x) if isinstance(x, list) else int(x) for x in d)
    return ()


def _end(op: CpuOp) -> float:
    return op.start_us + op.dur_us


def _encloses(op: CpuOp, ts: float, tid) -> bool:
    return op.tid == tid and op.start_us <= ts <= _end(op)
