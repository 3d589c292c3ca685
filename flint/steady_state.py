"""A pipeline's step for many micro-batches from two short ones.

Once a pipeline schedule is in its steady state, each further micro-batch adds the same
work to every stage: 1F1B and GPipe (Narayanan et al. 2019, Huang et al. 2019) take
(m + p - 1) slots of a stage's forward and backward, interleaved 1F1B (Narayanan et al.,
SC'21) adds one group of p micro-batches per v x p slots, and the once-per-step work
(gradient reduction, optimizer, parameter gathers) does not grow with m. So every time
the estimate reports is affine in m from the steady state on, and a step of m
micro-batches is priced from two simulated steps of m1 < m2 << m micro-batches:
x(m) = x(m1) + (m - m1) (x(m2) - x(m1)) / (m2 - m1).

The points: 1F1B reaches its steady state once every stage has a micro-batch in flight
(m >= p, its memory peaks from m = p + 1 on: p + 1 and p + 2); interleaved 1F1B needs
micro-batches in multiples of p, and its warm-up of 2(p - 1) + (v - 1) p chunk steps and
its cool-down of as many each span up to 2p micro-batches (v chunk steps each, at v = 2
the longest), so only from m = 4p on does a steady phase separate them and every
further group of p micro-batches add the same time (4p and 5p; from 2p and 3p the
step of Llama-3-8B at PP2 VP2 over 32 micro-batches came out 6% short of the full
simulation, and its bubble negative); GPipe keeps every micro-batch's activations, so
its memory grows with m and is extrapolated too. tests/test_engine.py checks the extrapolation against
the full simulation.
"""
from __future__ import annotations

import copy

# fields of hardware_models.estimate.Estimate that are affine in m in the steady state
_SCALARS = ("step_time_s", "compute_busy_s", "communication_busy_s",
            "exposed_communication_s", "idle_s", "flops_per_device")
_PER_KEY = ("by_class_s", "by_layer_s", "collectives_s")
_PIPELINE = ("compute_busy_s", "communication_busy_s", "pipelined_s", "bubble_s",
             "comm_wait_s", "ideal_window_s", "ideal_busy_s")


def steady_points(schedule: str, stages: int, microbatches: int):
    """(m1, m2) to price a step of `microbatches` from, or None when it is short enough to
    simulate whole."""
    if schedule == "interleaved":
        m1, m2 = 4 * stages, 5 * stages
    else:
        m1, m2 = stages + 1, stages + 2
    return (m1, m2) if microbatches > m2 else None


def _line(a: float, b: float, t: float) -> float:
    return a + (b - a) * t


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def extrapolate(e1, e2, m1: int, m2: int, m: int, schedule: str):
    """The Estimate of m micro-batches from those of m1 and m2 (e2's structure)."""
    out = affine(e1, e2, (m - m1) / (m2 - m1), memory=schedule == "gpipe")
    if out.pipeline:
        out.pipeline["microbatches"] = m
        out.pipeline["extrapolated_from_microbatches"] = [m1, m2]
    return out


def affine(e1, e2, t: float, memory: bool = False):
    """The Estimate at t on the line through e1 (t = 0) and e2 (t = 1), e2's structure:
    every figure that is a sum over the step's work (times, busy times, flops, splits;
    and with `memory`, the memory peak: held activations are a sum too)."""
    # every device's figures are affine in t, their maximum is not: the busiest device at
    # t is the one whose line is highest there, and both estimates report its figures
    # (each reports its own busiest device's)
    busy1, busy2 = (e.pipeline.get("compute_busy_s") or [] for e in (e1, e2))
    if e1.per_device and e2.per_device and len(busy1) == len(busy2):
        device = max(range(len(busy2)), key=lambda d: _line(busy1[d], busy2[d], t))
        e1, e2 = _for_device(e1, device), _for_device(e2, device)
    out = copy.copy(e2)
    for name in _SCALARS:
        setattr(out, name, _line(getattr(e1, name), getattr(e2, name), t))
    for name in _PER_KEY:
        a, b = getattr(e1, name), getattr(e2, name)
        setattr(out, name, {k: _line(a.get(k, 0.0), b.get(k, 0.0), t)
                            for k in sorted(set(a) | set(b))})
    peak = out.peak_flops
    out.hfu = out.flops_per_device / (out.step_time_s * peak) if out.step_time_s else 0.0
    if e1.mfu is not None and e2.mfu is not None:   # model flops are a sum like flops
        work = _line(e1.mfu * e1.step_time_s, e2.mfu * e2.step_time_s, t)
        out.mfu = work / out.step_time_s if out.step_time_s else 0.0
    out.pipeline = _pipeline(e1.pipeline, e2.pipeline, t)
    out.per_device = {}
    if memory:
        out.memory_bytes = _line(e1.memory_bytes, e2.memory_bytes, t)
        out.memory = {k: _line(e1.memory[k], v, t) if _number(v) and _number(
            e1.memory.get(k)) else v for k, v in e2.memory.items()}
        out.oom = out.memory_bytes > out.memory_capacity_bytes
    out.timeline = None
    return out


def _for_device(e, device: int):
    """`e` with the figures it reports for its busiest device taken from `device`."""
    per = e.per_device
    if per.get("busiest") == device:
        return e
    out = copy.copy(e)
    for name in _PER_KEY:
        setattr(out, name, per[name][device])
    out.exposed_communication_s = per["exposed_communication_s"][device]
    out.compute_busy_s = e.pipeline["compute_busy_s"][device]
    out.communication_busy_s = e.pipeline["communication_busy_s"][device]
    out.idle_s = max(e.step_time_s - out.compute_busy_s, 0.0)
    return out


def _pipeline(p1: dict, p2: dict, t: float) -> dict:
    if not p2:              # one stage: gradient accumulation, no schedule to report
        return {}
    out = dict(p2)
    for key in _PIPELINE:
        a, b = p1.get(key), p2.get(key)
        if isinstance(b, list):
            out[key] = [_line(x, y, t) for x, y in zip(a, b)]
        elif b is not None:
            out[key] = _line(a, b, t)
    devices = out.get("devices", 1) or 1
    bubble = sum(out["bubble_s"]) / devices
    wait = sum(out["comm_wait_s"]) / devices
    out["bubble_fraction"] = bubble / out["ideal_window_s"] if out["ideal_window_s"] else 0.0
    out["bubble_over_ideal"] = bubble / out["ideal_busy_s"] if out["ideal_busy_s"] else 0.0
    out["comm_wait_fraction"] = wait / out["pipelined_s"] if out["pipelined_s"] else 0.0
    return out
