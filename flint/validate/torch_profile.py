"""Join a PyTorch profiler (Kineto) trace of an eager CPU run to a torch-front-end graph.

Profiler events name aten operators (`aten::mm`), not graph nodes. The graph Flint traces
(unfused: eager runs one kernel per op) lists the same operators in the same program
order, so the k-th `aten::mm` event of a step is the k-th `mm` node. Only the outermost
event of an operator the graph knows counts (an `aten::_to_copy` contains an
`aten::copy_`, which is not a separate node); composite wrappers the graph decomposes
(`aten::linear` around `aten::t` + `aten::mm`) are looked through; `add` and `add_` are
one operator (see _key).

The join rate is honest: the share of the step's top-level operator time (events not
nested in another operator event) that lands on graph nodes; what is left is dispatcher,
autograd-engine and Python overhead around the kernels.
"""
from __future__ import annotations

from collections import defaultdict

from flint.errors import FlintError
from flint.validate.measured import MeasuredStep, MeasuredTrace

STEP = "ProfilerStep#"


def is_torch_cpu_trace(events: list) -> bool:
    return any(e.get("cat") == "cpu_op" for e in events) and not any(
        e.get("cat") == "kernel" for e in events)


def torch_cpu_steps(events: list, graph, path: str = "") -> MeasuredTrace:
    """MeasuredTrace whose op names are the graph's node names (device "cpu:0")."""
    wanted: dict[str, list[str]] = defaultdict(list)     # aten name -> node names in order
    for n in graph.nodes:
        if n.collective is None and n.meta.get("aten"):
            wanted[_key(n.meta["aten"])].append(n.name)
    if not wanted:
        raise FlintError(f"{path}: the graph has no aten operators to join (is it from "
                         f"the torch front end, extracted with --no-fuse?)")
    if any(n.meta.get("fused_from") for n in graph.nodes):
        raise FlintError("join an eager profile with an unfused graph (extract with --no-fuse)")
    ops = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"),
                 key=lambda e: (float(e["ts"]), -float(e["dur"])))
    marks = sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events
                   if e.get("ph") == "X" and str(e.get("name", "")).startswith(STEP))
    if not marks:
        raise FlintError(f"{path}: no {STEP}N ranges: profile each step inside one "
                         f"(torch.profiler's step(), or record_function)")
    steps = []
    for number, (lo, hi) in enumerate(marks, 1):
        inside = [e for e in ops if lo <= float(e["ts"]) and float(e["ts"]) + float(e["dur"]) <= hi]
        times, top, joined = _join_step(inside, wanted)
        step = MeasuredStep(number, (hi - lo) * 1e-6, {"cpu:0": times})
        step.ops["cpu:0"]["(unjoined operator time)"] = max(top - joined, 0.0)
        steps.append(step)
    return MeasuredTrace(path, "kineto-cpu", graph.meta.get("module", "train_step"), steps,
                         hardware="cpu")


def _key(aten: str) -> str:
    """In-place and out-of-place forms are one key: eager autograd accumulates gradients
    with `add_` where the traced graph records `add`, in the same program position."""
    return aten.rstrip("_")


def _join_step(events: list, wanted: dict) -> tuple[dict, float, float]:
    """(node -> seconds, top-level operator seconds, joined seconds) of one step."""
    seen: dict[str, int] = defaultdict(int)
    times: dict[str, float] = {}
    open_until: list[float] = []            # ends of enclosing events
    claimed_until = -1.0                    # end of the last joined event
    top = joined = 0.0
    for e in events:
        ts, dur = float(e["ts"]), float(e["dur"])
        while open_until and open_until[-1] <= ts:
            open_until.pop()
        if not open_until:
            top += dur * 1e-6
        open_until.append(ts + dur)
        name = _key(e["name"])
        if ts < claimed_until or name not in wanted:
            continue
        k = seen[name]
        seen[name] += 1
        if k < len(wanted[name]):
            node = wanted[name][k]
            times[node] = times.get(node, 0.0) + dur * 1e-6
            joined += dur * 1e-6
            claimed_until = ts + dur
    return times, top, joined
