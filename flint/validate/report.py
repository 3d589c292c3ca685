"""Tables and the predicted-vs-measured plot for `flint validate` / `flint calibrate`."""
from __future__ import annotations

import statistics

from rich.console import Console
from rich.table import Table

from flint.io import write_atomic
from flint.render import fmt_seconds
from flint.validate.compare import Validation, percentile


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:+.1f} %"


def _abs_pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def render_validation(v: Validation, console: Console) -> None:
    t = Table(title=f"Predicted ({v.hardware}) vs measured: {v.trace}", show_header=False)
    t.add_column("what")
    t.add_column("value", justify="right")
    t.add_row("steps compared", ", ".join(map(str, v.steps)))
    t.add_row("measured step (median)", fmt_seconds(v.measured_step_s))
    t.add_row("predicted step", fmt_seconds(v.predicted_step_s))
    t.add_row("step error", _pct(v.step_error))
    for op, d in v.excluded.items():
        t.add_row(f"excluded: {op}", f"{fmt_seconds(d['measured_slowest_s'])} on the slowest "
                  f"device, predicted {fmt_seconds(d['predicted_s'])}")
    if v.launches:
        t.add_row("kernels launched", f"{v.launches}; predicted launch wait "
                  f"{fmt_seconds(v.launch_wait_s)} per step")
    t.add_row("join rate", f"{v.joined_ops}/{v.measured_ops} ops, {100 * v.join_share:.1f} % "
              f"of measured op time")
    errs = v.op_errors()
    if errs:
        t.add_row("per-op |error| median / p90",
                  f"{100 * statistics.median(errs):.1f} % / {100 * percentile(errs, 0.9):.1f} %")
    ran = v.as_run_errors()
    if ran:
        t.add_row("per-op |error| as run (in the predicted step) median / p90",
                  f"{100 * statistics.median(ran):.1f} % / {100 * percentile(ran, 0.9):.1f} %")
    console.print(t)
    c = Table(title="By op class (per step)")
    for col in ("class", "ops", "measured", "predicted", "ratio", "median |op error|"):
        c.add_column(col, justify="left" if col == "class" else "right")
    for cls, d in v.by_class().items():
        c.add_row(cls, str(d["ops"]), fmt_seconds(d["measured_s"]), fmt_seconds(d["predicted_s"]),
                  f"{d['ratio']:.2f}x", f"{100 * d['median_abs_error']:.0f} %")
    console.print(c)
    console.print(_duration_table(v))
    m = Table(title="Biggest misses")
    for col in ("op", "class", "measured", "predicted", "error"):
        m.add_column(col, justify="left" if col in ("op", "class") else "right")
    for o in v.biggest_misses():
        m.add_row(o.name, o.op_class, fmt_seconds(o.measured_s), fmt_seconds(o.predicted_s),
                  _pct(o.error))
    console.print(m)
    if v.unmatched:
        u = Table(title=f"Unmatched trace ops ({len(v.unmatched)}; largest first)")
        u.add_column("op")
        u.add_column("measured", justify="right")
        for op, s in sorted(v.unmatched.items(), key=lambda kv: -kv[1])[:10]:
            u.add_row(op, fmt_seconds(s))
        console.print(u)


def _duration_table(v: Validation) -> Table:
    t = Table(title="By kernel duration (measured, per execution)")
    for col in ("duration", "ops", "measured", "predicted", "ratio", "median |op error|"):
        t.add_column(col, justify="left" if col == "duration" else "right")
    for d in v.by_duration():
        t.add_row(d["bucket"], str(d["ops"]), fmt_seconds(d["measured_s"]),
                  fmt_seconds(d["predicted_s"]),
                  "-" if d["ratio"] is None else f"{d['ratio']:.2f}x",
                  "-" if d["median_abs_error"] is None else f"{100 * d['median_abs_error']:.0f} %")
    return t


def render_calibration(report, console: Console) -> None:
    cal = report.calibration
    e = Table(title="Calibrated parameters")
    e.add_column("parameter")
    e.add_column("value", justify="right")
    e.add_column("spec's own", justify="right")
    for k, v in sorted(cal.efficiency.items()):
        ref = cal.reference.get(k)
        if k == "kernel_floor":
            e.add_row(k, fmt_seconds(v), fmt_seconds(ref) if ref else "")
        else:
            e.add_row(k, f"{v:.4g} (share)", f"{ref:.4g}" if ref else "")
    for k in sorted(cal.hardware):
        e.add_row(k, f"{cal.hardware_text(k)} (effective, this machine)", "")
    console.print(e)
    for note in cal.notes:
        console.print(f"note: {note}", highlight=False)
    t = Table(title="Error before -> after calibration")
    for col in ("trace", "set", "steps", "step error", "per-op median |error|"):
        t.add_column(col, justify="left" if col in ("trace", "set") else "right")
    for r in report.rows:
        b, a = r["before"], r["after"]
        steps = r["steps"] if isinstance(r["steps"], str) else ",".join(map(str, r["steps"]))
        if "step_error" in b:
            t.add_row(r["trace"].rsplit("/", 1)[-1], r["set"], steps,
                      f"{_pct(b['step_error'])} -> {_pct(a['step_error'])}",
                      f"{_abs_pct(b['op_median_abs_error'])} -> "
                      f"{_abs_pct(a['op_median_abs_error'])}")
        else:
            t.add_row(r["trace"].rsplit("/", 1)[-1], r["set"], steps, "-",
                      f"collectives {_abs_pct(b['collective_median_abs_error'])} -> "
                      f"{_abs_pct(a['collective_median_abs_error'])}")
    console.print(t)


def scatter_png(v: Validation) -> bytes:
    from flint.exporters.plot import png_bytes, pyplot

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 5.6))
    classes = sorted({o.op_class for o in v.ops})
    for i, cls in enumerate(classes):
        pts = [(o.measured_s * 1e3, o.predicted_s * 1e3) for o in v.ops if o.op_class == cls
               and o.predicted_s > 0]
        if pts:
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=10, label=cls,
                       color=plt.cm.tab10(i % 10), alpha=0.7)
    lo = min([o.measured_s for o in v.ops] + [o.predicted_s for o in v.ops if o.predicted_s]) * 1e3
    hi = max([o.measured_s for o in v.ops] + [o.predicted_s for o in v.ops]) * 1e3
    ax.plot([lo, hi], [lo, hi], color="black", linewidth=0.8, label="predicted = measured")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured per step (ms)")
    ax.set_ylabel("predicted per step (ms)")
    ax.set_title(f"{v.hardware}: step error {100 * v.step_error:+.1f} %, "
                 f"{len(v.ops)} ops joined")
    ax.legend(fontsize=7)
    return png_bytes(fig)


def scatter_plot(v: Validation, path) -> None:
    write_atomic(path, scatter_png(v))
