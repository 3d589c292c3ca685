"""Predicted vs measured on the shared nsys-jax MaxText archive (4x H100, FSDP).

Loads the optimized HLO XLA ran into a WorkloadGraph, estimates it on a hardware spec, and
joins per-thunk GPU times (median over the steps after warm-up) to graph nodes by HLO
instruction name. Prints the step error, the join rate (share of GPU time matched), the
per-op error distribution by op class, and the known roofline outlier (the embedding
gradient scatter) separately.

    python scripts/compare_maxtext.py [--hardware h100-sxm] [--set hbm_bandwidth=...]
"""
from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from pathlib import Path

ARCHIVE = Path(__file__).resolve().parents[2] / "shared/traces/jaxtoolbox_maxtext_fsdp4_4xH100.data.zip"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--archive", default=str(ARCHIVE))
    p.add_argument("--hardware", default="h100-sxm")
    p.add_argument("--set", action="append", default=[], dest="overrides")
    a = p.parse_args()

    from rich.console import Console
    from rich.table import Table

    from flint.cluster import Cluster
    from flint.hardware_models.cost_model import default_cost_model
    from flint.hardware_models.estimate import estimate
    from flint.hlo.loaders import hlo_text_from_proto
    from flint.hlo.module import parse_module
    from flint.passes.lower_hlo import lower_hlo
    from flint.validate.nsys_jax import read_nsys_jax

    trace = read_nsys_jax(a.archive)
    graph = lower_hlo(parse_module(hlo_text_from_proto(trace.hlo)),
                      Cluster(4, (("fsdp", 4),), "h100-sxm", "gpu", 4))
    model = default_cost_model(graph, a.hardware, a.overrides)
    est = estimate(graph, cost_model=model)
    steps = trace.steps()[1:]  # the first execution includes autotuning and warm-up
    step_ms = [max(r.duration_ns for r in s) / 1e6 for s in steps]
    per_op: dict[str, list[float]] = defaultdict(list)
    for s in steps:
        for r in s:
            for op, ns in r.ops_ns.items():
                per_op[op].append(ns / 1e6)
    measured = {op: statistics.median(v) for op, v in per_op.items()}
    predicted: dict[str, float] = defaultdict(float)
    node_of = {}
    for n in graph.nodes:
        for key in {n.name, n.meta.get("wrapped_name", n.name)}:
            predicted[key] += model.node_time(n, graph) * n.repeat * 1e3
            node_of[key] = n
    total = sum(measured.values())
    joined = {op: t for op, t in measured.items() if op in predicted}
    outliers = {op for op in joined if "scatter" in op and node_of[op].op_class != "collective"
                and joined[op] > 10 * predicted[op]}
    # The scatter's time depends on the token ids, so it differs per device (22-68 ms);
    # the others wait for the slowest one in the next all-reduce. The step without the
    # outlier is therefore the step less the slowest device's scatter, step by step.
    slowest = [max(sum(r.ops_ns.get(op, 0) for op in outliers) for r in s) / 1e6 for s in steps]
    spread = [sum(r.ops_ns.get(op, 0) for op in outliers) / 1e6 for s in steps for r in s]
    step = statistics.median(step_ms)
    step_clean = statistics.median(x - o for x, o in zip(step_ms, slowest))
    pred = est.step_time_s * 1e3
    pred_outlier = sum(predicted[op] for op in outliers)

    console = Console()
    t = Table(title=f"MaxText 8-layer FSDP=4 step on {model.spec.name}: predicted vs measured",
              show_header=False)
    t.add_column("what")
    t.add_column("value", justify="right")
    t.add_row("measured step (median of steps 2-5)", f"{step:.1f} ms "
              f"({', '.join(f'{x:.1f}' for x in step_ms)} ms)")
    t.add_row("predicted step", f"{pred:.1f} ms")
    t.add_row("step error", f"{100 * (pred / step - 1):+.1f} %")
    t.add_row("roofline outlier (measured)",
              f"{', '.join(sorted(outliers))}: {min(spread):.1f}-{max(spread):.1f} ms per device "
              f"(predicted {pred_outlier:.2f} ms)")
    t.add_row("measured step less the slowest device's outlier",
              f"{step_clean:.1f} ms ({', '.join(f'{x - o:.1f}' for x, o in zip(step_ms, slowest))} ms)")
    t.add_row("predicted step less the outlier", f"{pred - pred_outlier:.1f} ms")
    t.add_row("step error without the outlier",
              f"{100 * ((pred - pred_outlier) / step_clean - 1):+.1f} %")
    t.add_row("join rate", f"{len(joined)}/{len(measured)} ops, "
              f"{100 * sum(joined.values()) / total:.1f} % of GPU time")
    rel = [abs(predicted[op] - t_) / t_ for op, t_ in joined.items() if op not in outliers]
    t.add_row("per-op |error| median / p90",
              f"{100 * statistics.median(rel):.1f} % / {100 * _p90(rel):.1f} %")
    console.print(t)
    by_class: dict[str, list] = defaultdict(list)
    for op, t_ in joined.items():
        if op not in outliers:
            by_class[node_of[op].op_class].append((t_, predicted[op]))
    c = Table(title="By op class (summed per step)")
    for col in ("class", "measured", "predicted", "ratio", "median |op error|"):
        c.add_column(col, justify="left" if col == "class" else "right")
    for cls, rows in sorted(by_class.items(), key=lambda kv: -sum(m for m, _ in kv[1])):
        m, pr = sum(x for x, _ in rows), sum(y for _, y in rows)
        med = statistics.median(abs(y - x) / x for x, y in rows)
        c.add_row(cls, f"{m:.2f} ms", f"{pr:.2f} ms", f"{pr / m:.2f}x", f"{100 * med:.0f} %")
    console.print(c)


def _p90(values):
    values = sorted(values)
    return values[min(len(values) - 1, int(0.9 * len(values)))] if values else 0.0


if __name__ == "__main__":
    main()
