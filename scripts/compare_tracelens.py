"""Predicted vs measured GEMM and flash-attention kernels of the TraceLens Qwen trace (1x H100).

Every GPU kernel launched in the chosen ProfilerStep is joined to the aten operator that
launched it (flint.validate.kineto_kernels); each GEMM and attention execution becomes the
Flint node the torch front end builds for that op (flint.validate.kernel_nodes), and the
default cost model's compute half predicts its time. Measured is the kernel's duration on
the GPU timeline (the 4-byte memset cuBLAS launches before each GEMM here is listed apart).
Errors are per kernel, predicted / measured - 1; medians are over kernels.

    python scripts/compare_tracelens.py [--step 6] [--hardware h100-sxm] [--json] [--plot out.png]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

TRACE = (Path(__file__).resolve().parents[2] / "shared/traces"
         / "tracelens_qwen1.5-0.5b_fwd_1xH100.json.gz")


def build_report(path, step: int | None, hardware: str) -> dict:
    from flint.hardware_models.compute import RooflineCompute
    from flint.hardware_models.spec import load_spec
    from flint.validate.kernel_nodes import execution_node, executions
    from flint.validate.kineto_kernels import step_kernels
    from flint.validate.trace_events import read_trace_events

    spec = load_spec(hardware)
    model = RooflineCompute(spec)
    found = step_kernels(read_trace_events(path, "Kineto trace"), step, str(path))
    execs, others = executions(found.kernels)
    rows, unmodelled = [], []
    for i, ex in enumerate(execs):
        node = execution_node(ex, i)
        if node is None:
            unmodelled.append(ex.op.name)
            continue
        rows.append({"class": ex.op_class, "op": ex.op.name, "shape": _shape_label(node),
                     "operands": node.operands, "flops": node.flops,
                     "measured_us": ex.measured_s * 1e6, "predicted_us": model.time(node) * 1e6,
                     "memset_us": sum(k.duration_s for k in ex.other) * 1e6})
    groups = _groups(rows)
    summary = {cls: _errors([r for r in rows if r["class"] == cls])
               for cls in ("gemm", "attention")}
    summary["overall"] = _errors(rows)
    gpu = [k for k in found.kernels if k.category == "kernel"]
    return {
        "trace": Path(path).name, "step": found.step, "hardware": spec.name,
        "gpu_span_ms": round(found.span_s * 1e3, 4),
        "kernels_in_step": len(gpu),
        "kernels_total_ms": round(sum(k.duration_s for k in gpu) * 1e3, 4),
        "unlinked_kernels": found.unlinked,
        "unmodelled_ops": sorted(unmodelled),
        "other_kernels": len(others),
        "other_kernels_ms": round(sum(k.duration_s for k in others) * 1e3, 4),
        "gemm_memsets": sum(len(ex.other) for ex in execs),
        "gemm_memsets_ms": round(sum(r["memset_us"] for r in rows) * 1e-3, 4),
        "groups": groups, "summary": summary,
        "kernels": [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()
                     if k in ("class", "op", "shape", "measured_us", "predicted_us")}
                    for r in rows],
    }


def _shape_label(node) -> str:
    if node.op_class == "attention":
        a = node.meta["attention"]
        kv = f"/{a['kv_heads']}kv" if a["kv_heads"] != a["heads"] else ""
        seq = str(a["seq_q"]) if a["seq_q"] == a["seq_kv"] else f"{a['seq_q']}:{a['seq_kv']}"
        return (f"B={a['batch']} H={a['heads']}{kv} S={seq} D={a['head_dim']} "
                f"{a['dtype']}{' causal' if a['causal'] else ''}")
    g = node.meta["gemm"]
    batch = f"{g['batch']}x " if g["batch"] > 1 else ""
    return f"{batch}M={g['m']} N={g['n']} K={g['k']} {g['dtype']}"


def _groups(rows: list[dict]) -> list[dict]:
    by: dict[tuple, list[dict]] = {}
    for r in rows:
        by.setdefault((r["class"], r["op"], r["shape"]), []).append(r)
    out = []
    for (cls, op, shape), rs in sorted(by.items(), key=lambda kv: (kv[0][0] != "gemm", kv[0])):
        measured = statistics.median(r["measured_us"] for r in rs)
        predicted = statistics.median(r["predicted_us"] for r in rs)
        out.append({"class": cls, "op": op, "shape": shape, "count": len(rs),
                    "measured_median_us": round(measured, 4),
                    "predicted_us": round(predicted, 4),
                    "error_pct": round(100 * (predicted / measured - 1), 2),
                    "achieved_tflops": round(rs[0]["flops"] / (measured * 1e-6) / 1e12, 2),
                    "measured_total_ms": round(sum(r["measured_us"] for r in rs) * 1e-3, 4)})
    return out


def _errors(rows: list[dict]) -> dict:
    if not rows:
        return {"kernels": 0}
    errs = [abs(r["predicted_us"] / r["measured_us"] - 1) for r in rows]
    measured = sum(r["measured_us"] for r in rows)
    predicted = sum(r["predicted_us"] for r in rows)
    return {"kernels": len(rows), "median_abs_error_pct": round(100 * statistics.median(errs), 2),
            "measured_total_ms": round(measured * 1e-3, 4),
            "predicted_total_ms": round(predicted * 1e-3, 4),
            "total_error_pct": round(100 * (predicted / measured - 1), 2)}


def render(report: dict, console) -> None:
    from rich.table import Table

    t = Table(title=f"{report['trace']} ProfilerStep#{report['step']}: measured vs predicted "
                    f"per kernel on {report['hardware']}")
    for col in ("class", "op", "shape", "count", "measured median", "predicted", "error",
                "achieved"):
        t.add_column(col, justify="left" if col in ("class", "op", "shape") else "right",
                     no_wrap=True)
    for g in report["groups"]:
        t.add_row(g["class"], g["op"].removeprefix("aten::"), g["shape"], str(g["count"]),
                  f"{g['measured_median_us']:.2f} us", f"{g['predicted_us']:.2f} us",
                  f"{g['error_pct']:+.1f} %", f"{g['achieved_tflops']:.1f} TFLOP/s")
    console.print(t)
    console.print(f"step GPU span {report['gpu_span_ms']:.2f} ms; {report['kernels_in_step']} "
                  f"kernels, {report['kernels_total_ms']:.2f} ms summed; unlinked kernels: "
                  f"{report['unlinked_kernels']}; GEMM/attention ops not modelled (shapes "
                  f"not recorded): {len(report['unmodelled_ops'])}")
    console.print(f"other kernels (elementwise, norms, copies; not compared here): "
                  f"{report['other_kernels']}, {report['other_kernels_ms']:.2f} ms; memsets "
                  f"inside GEMM ops: {report['gemm_memsets']}, "
                  f"{report['gemm_memsets_ms']:.3f} ms")
    for cls, s in report["summary"].items():
        if not s["kernels"]:
            continue
        console.print(f"{cls:>9}: {s['kernels']} kernels, median |error| "
                      f"{s['median_abs_error_pct']:.1f} %; summed {s['measured_total_ms']:.3f} ms "
                      f"measured vs {s['predicted_total_ms']:.3f} ms predicted "
                      f"({s['total_error_pct']:+.1f} %)")


def scatter_png(report: dict) -> bytes:
    from flint.exporters.plot import png_bytes, pyplot

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 5))
    for cls, marker, color in (("gemm", "o", "#4C72B0"), ("attention", "^", "#DD8452")):
        ks = [k for k in report["kernels"] if k["class"] == cls]
        if ks:
            s = report["summary"][cls]
            ax.scatter([k["measured_us"] for k in ks], [k["predicted_us"] for k in ks], s=14,
                       marker=marker, color=color, alpha=0.7,
                       label=f"{cls} ({len(ks)}, median |err| {s['median_abs_error_pct']:.1f} %)")
    values = [v for k in report["kernels"] for v in (k["measured_us"], k["predicted_us"])]
    lo, hi = min(values) / 1.5, max(values) * 1.5
    ax.plot([lo, hi], [lo, hi], color="k", lw=0.8, label="predicted = measured")
    for f in (0.8, 1.2):
        ax.plot([lo, hi], [lo * f, hi * f], color="grey", lw=0.6, ls="--")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured kernel time (us)")
    ax.set_ylabel("predicted kernel time (us)")
    ax.set_title(f"{report['trace']}\nstep {report['step']} on {report['hardware']} "
                 f"(dashed: +/-20 %)", fontsize=8)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return png_bytes(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", default=str(TRACE))
    p.add_argument("--step", type=int, default=6, help="ProfilerStep number (the MANIFEST's is 6)")
    p.add_argument("--hardware", default="h100-sxm")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--plot", help="write a predicted-vs-measured scatter PNG here")
    a = p.parse_args()
    from rich.console import Console

    from flint.errors import FlintError
    from flint.io import write_atomic

    try:
        report = build_report(a.trace, a.step, a.hardware)
        if a.plot:
            write_atomic(a.plot, scatter_png(report))
    except FlintError as e:
        print(f"compare_tracelens: error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    if a.json:
        print(json.dumps(report, sort_keys=True, indent=1))
    else:
        render(report, Console(width=170))
        if a.plot:
            print(f"wrote {a.plot}", file=sys.stderr)


if __name__ == "__main__":
    main()
