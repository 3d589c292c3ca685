"""Predicted vs measured: join trace ops to graph nodes, and measure the error.

XLA traces name each op by its HLO instruction, which is the node's name (or, for an async
pair, the wrapped instruction's). An op's measured time is the median over the chosen steps
and devices of its per-step time; its prediction is the node's time x executions per step.
Ops named in `exclude` (known outliers, e.g. a data-dependent scatter) are taken out of
both sides: the measured step loses the slowest device's time in them, since SPMD steps
end when the slowest device does.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from flint.errors import FlintError
from flint.graph import WorkloadGraph
from flint.hardware_models.cost_model import CostModel
from flint.hardware_models.estimate import estimate
from flint.validate.measured import MeasuredTrace

# Kernel-duration buckets of the per-op error report: (label, from s, to s).
DURATION_BUCKETS = (("<5 us", 0.0, 5e-6), ("5-20 us", 5e-6, 20e-6), ("20-100 us", 20e-6, 100e-6),
                    ("100 us-1 ms", 100e-6, 1e-3), (">1 ms", 1e-3, float("inf")))

# Below this share of measured time joined, the trace is of another program.
MIN_JOIN_SHARE = 0.5


@dataclass
class OpResult:
    name: str
    op_class: str
    measured_s: float
    predicted_s: float
    executions: int = 1                 # per step (loop bodies run several times)
    # its time as it ran in the predicted step: beside collectives, compute slows and the
    # collectives are lengthened by the compute beside them (interference, contention);
    # the trace's kernels ran that way too
    as_run_s: float | None = None

    @property
    def error(self) -> float:
        return (self.predicted_s - self.measured_s) / self.measured_s if self.measured_s else 0.0

    @property
    def as_run_error(self) -> float | None:
        if self.as_run_s is None or not self.measured_s:
            return None
        return (self.as_run_s - self.measured_s) / self.measured_s


@dataclass
class Validation:
    trace: str
    hardware: str
    steps: list[int]
    measured_step_s: float
    predicted_step_s: float
    join_share: float                   # of measured op time
    joined_ops: int
    measured_ops: int
    ops: list[OpResult] = field(default_factory=list)
    unmatched: dict = field(default_factory=dict)       # op -> measured s
    excluded: dict = field(default_factory=dict)        # op -> (measured slowest, predicted)
    # how the traced run launched its kernels, where that changes the prediction, and the
    # predicted step's compute-stream wait for launches (launch gaps, host launches)
    launches: str = ""
    launch_wait_s: float = 0.0

    @property
    def step_error(self) -> float:
        return self.predicted_step_s / self.measured_step_s - 1 if self.measured_step_s else 0.0

    def op_errors(self) -> list[float]:
        return [abs(o.error) for o in self.ops if o.measured_s > 0]

    def as_run_errors(self) -> list[float]:
        return [abs(o.as_run_error) for o in self.ops if o.as_run_error is not None]

    def by_class(self) -> dict[str, dict]:
        return by_class(self.ops)

    def by_duration(self) -> list[dict]:
        return by_duration(self.ops)

    def biggest_misses(self, n: int = 10) -> list[OpResult]:
        return sorted(self.ops, key=lambda o: -abs(o.predicted_s - o.measured_s))[:n]

    def to_json(self) -> dict:
        errs, ran = self.op_errors(), self.as_run_errors()
        return {"trace": self.trace, "hardware": self.hardware, "steps": self.steps,
                "measured_step_s": self.measured_step_s,
                "predicted_step_s": self.predicted_step_s, "step_error": self.step_error,
                "join_share": self.join_share, "joined_ops": self.joined_ops,
                "measured_ops": self.measured_ops,
                "op_abs_error_median": statistics.median(errs) if errs else None,
                "op_abs_error_p90": percentile(errs, 0.9) if errs else None,
                "op_abs_error_as_run_median": statistics.median(ran) if ran else None,
                "op_abs_error_as_run_p90": percentile(ran, 0.9) if ran else None,
                "by_class": self.by_class(),
                "by_duration": self.by_duration(),
                "biggest_misses": [o.__dict__ for o in self.biggest_misses()],
                "unmatched": dict(sorted(self.unmatched.items(), key=lambda kv: -kv[1])[:20]),
                "excluded": self.excluded, "launches": self.launches,
                "launch_wait_s": self.launch_wait_s}


def by_class(ops: list[OpResult]) -> dict[str, dict]:
    """Measured and predicted time per op class (largest measured first), their ratio and
    the median per-op |error|."""
    groups: dict[str, list[OpResult]] = {}
    for o in ops:
        groups.setdefault(o.op_class, []).append(o)
    out = {}
    for cls, rows in sorted(groups.items(), key=lambda kv: -sum(o.measured_s for o in kv[1])):
        m, p = sum(o.measured_s for o in rows), sum(o.predicted_s for o in rows)
        out[cls] = {"ops": len(rows), "measured_s": m, "predicted_s": p,
                    "ratio": p / m if m else 0.0,
                    "median_abs_error": statistics.median(abs(o.error) for o in rows)}
    return out


def by_duration(ops: list[OpResult]) -> list[dict]:
    """Ops grouped by measured time per execution (a kernel's duration), shortest first:
    where a model is wrong often depends on the kernel size more than on its class."""
    out = []
    for label, lo, hi in DURATION_BUCKETS:
        rows = [o for o in ops if lo <= o.measured_s / o.executions < hi]
        m, p = sum(o.measured_s for o in rows), sum(o.predicted_s for o in rows)
        out.append({"bucket": label, "from_s": lo, "to_s": hi if hi != float("inf") else None,
                    "ops": len(rows), "measured_s": m, "predicted_s": p,
                    "ratio": p / m if m else None,
                    "median_abs_error": (statistics.median(abs(o.error) for o in rows)
                                         if rows else None)})
    return out


def percentile(values, q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else 0.0


def class_of(node) -> str:
    return f"collective:{node.collective.type}" if node.collective is not None else node.op_class


def predicted_by_op(graph: WorkloadGraph, model: CostModel) -> tuple[dict, dict]:
    """(op name -> predicted seconds per step, op name -> node) for every node and the
    instruction an async pair wraps."""
    predicted: dict[str, float] = {}
    nodes: dict[str, object] = {}
    for n in graph.nodes:
        t = model.node_time(n, graph) * n.repeat
        for key in {n.name, n.meta.get("wrapped_name", n.name)}:
            predicted[key] = predicted.get(key, 0.0) + t
            nodes[key] = n
    return predicted, nodes


def as_run_by_op(est) -> dict[str, float]:
    """Op name -> seconds per step its nodes ran in the predicted step's timeline."""
    out: dict[str, float] = {}
    tl = est.timeline
    if tl is None:
        return out
    for n, a, b in zip(tl.graph.nodes, tl.start, tl.finish):
        for key in {n.name, n.meta.get("wrapped_name", n.name)}:
            out[key] = out.get(key, 0.0) + (b - a) * n.repeat
    return out


def validate(graph: WorkloadGraph, trace: MeasuredTrace, model: CostModel,
             exclude=()) -> Validation:
    predicted, nodes = predicted_by_op(graph, model)
    measured = trace.op_times()
    total = sum(measured.values())
    if not total:
        raise FlintError(f"{trace.path}: the chosen steps hold no measured ops")
    joined = {op: t for op, t in measured.items() if op in predicted}
    share = sum(joined.values()) / total
    if share < MIN_JOIN_SHARE:
        raise FlintError(f"{trace.path} does not match this graph: only {100 * share:.0f}% "
                         f"of its op time joins to graph nodes (is it a trace of another "
                         f"model or module?)")
    excluded_names = {op for op in joined for pat in exclude if pat and pat in op}
    est = estimate(graph, cost_model=model)
    step_time = est.step_time_s
    launches = ("one by one (the trace shows no XLA command buffers)"
                if graph.meta.get("cuda_graphs") is False else "")
    pred_excluded = sum(predicted[op] for op in excluded_names)
    measured_steps = [s.duration_s - max((s.op_time(d, excluded_names) for d in s.ops),
                                         default=0.0) for s in trace.steps]
    as_run = as_run_by_op(est)
    ops = [OpResult(op, class_of(nodes[op]), t, predicted[op], max(1, int(nodes[op].repeat)),
                    as_run.get(op))
           for op, t in joined.items() if op not in excluded_names and t > 0]
    excluded = {op: {"measured_slowest_s": max(s.op_time(d, [op]) for s in trace.steps
                                               for d in s.ops),
                     "predicted_s": predicted[op]} for op in sorted(excluded_names)}
    return Validation(trace.path, model.spec.name, [s.number for s in trace.steps],
                      statistics.median(measured_steps), step_time - pred_excluded, share,
                      len(joined), len(measured), ops,
                      {op: t for op, t in measured.items() if op not in predicted}, excluded,
                      launches, sum(est.timeline.launch_wait) if est.timeline else 0.0)
