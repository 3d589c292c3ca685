"""What a sweep leaves behind: results.csv / results.json (deterministic: no wall times),
pareto.json (per hardware scenario, the configurations no other beats on both device count
and step time, out-of-memory ones excluded), and PNG plots."""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from flint.io import write_atomic

COLUMNS = ("model", "seq_len", "global_batch", "devices", "hardware", "tp", "sp", "cp", "pp",
           "vp", "schedule", "ep", "dp", "zero", "hsdp", "micro_batch", "microbatches",
           "remat", "precision", "framework", "what_if", "status", "step_time_s",
           "tokens_per_s", "tokens_per_s_per_device", "mfu", "hfu", "memory_gib",
           "memory_capacity_gib", "oom", "bubble_fraction", "exposed_communication_s",
           "compute_busy_s", "error", "key")
TIMING = ("time_s", "estimate_s", "extracted")   # wall-clock facts: the log only


def model_name(model) -> str:
    """A row's model as one cell: a name, or a mapping of dims as compact JSON."""
    return model if isinstance(model, str) else json.dumps(model, sort_keys=True,
                                                          separators=(",", ":"))


def scenario(row: dict) -> str:
    wi = ",".join(f"{k}={v}" for k, v in sorted(row["what_if"].items()))
    return row["hardware"] + (f" [{wi}]" if wi else "")


def pareto_front(rows: list[dict]) -> dict[str, list[dict]]:
    """Per scenario: fits-in-memory configurations with no other using no more devices
    and a shorter step, by device count."""
    fronts: dict[str, list[dict]] = {}
    for name in sorted({scenario(r) for r in rows}):
        ok = [r for r in rows if scenario(r) == name and r["status"] == "ok" and not r["oom"]]
        ok.sort(key=lambda r: (r["devices"], r["step_time_s"], r["key"]))
        front, best = [], float("inf")
        for r in ok:
            if r["step_time_s"] < best:
                front.append(r)
                best = r["step_time_s"]
        fronts[name] = front
    return fronts


def stable_rows(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def write_outputs(directory, rows: list[dict], skipped: list[dict] = ()) -> dict[str, str]:
    """Write the tables and plots (and `skipped.csv`: the invalid points and why);
    returns {kind: path}."""
    directory = Path(directory)
    rows = stable_rows(rows)
    out = {"csv": directory / "results.csv", "json": directory / "results.json",
           "pareto": directory / "pareto.json", "plot": directory / "sweep_pareto.png"}
    if skipped:
        out["skipped"] = directory / "skipped.csv"
        columns = sorted({k for s in skipped for k in s} - {"reason"}) + ["reason"]
        buf = io.StringIO()
        writer = csv.DictWriter(buf, columns, lineterminator="\n")
        writer.writeheader()
        for s in skipped:
            writer.writerow({k: model_name(v) if k == "model" else v for k, v in s.items()})
        write_atomic(out["skipped"], buf.getvalue())
    buf = io.StringIO()
    writer = csv.DictWriter(buf, COLUMNS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({**r, "what_if": json.dumps(r["what_if"], sort_keys=True),
                         "model": model_name(r["model"])})
    write_atomic(out["csv"], buf.getvalue())
    write_atomic(out["json"], json.dumps(rows, sort_keys=True, indent=1) + "\n")
    fronts = pareto_front(rows)
    write_atomic(out["pareto"], json.dumps(
        {k: [{c: r.get(c) for c in COLUMNS} for r in v] for k, v in fronts.items()},
        sort_keys=True, indent=1) + "\n")
    _plot(rows, fronts, out["plot"])
    return {k: str(v) for k, v in out.items()}


def _plot(rows, fronts, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.5), dpi=110)
    priced = [r for r in rows if r["status"] == "ok"]
    if not priced:      # every point invalid: say so on the plot rather than plot nothing
        ax.text(0.5, 0.5, f"no valid configuration among {len(rows)} (see results.csv)",
                ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
    names = sorted(fronts)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, name in enumerate(names):
        color = colors[i % len(colors)]
        mine = [r for r in rows if scenario(r) == name and r["status"] == "ok"]
        fits = [r for r in mine if not r["oom"]]
        ax.scatter([r["devices"] for r in fits], [r["step_time_s"] * 1e3 for r in fits],
                   s=14, color=color, alpha=0.45)
        front = fronts[name]
        ax.plot([r["devices"] for r in front], [r["step_time_s"] * 1e3 for r in front],
                "-o", color=color, markersize=5, label=f"{name} (Pareto front)")
    oom = [r for r in rows if r["status"] == "ok" and r["oom"]]
    if oom:
        ax.scatter([r["devices"] for r in oom], [r["step_time_s"] * 1e3 for r in oom],
                   marker="x", color="0.5", s=18, label="out of memory")
    if priced:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("devices")
        ax.set_ylabel("predicted step time (ms)")
        models = sorted({model_name(r["model"]) for r in rows})
        ax.set_title(f"{', '.join(models)[:60]}: step time vs devices ({len(rows)} "
                     f"configurations)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    plt.close(fig)
    write_atomic(path, buf.getvalue())


def render_front(fronts: dict[str, list[dict]], console) -> None:
    from rich.markup import escape
    from rich.table import Table

    from flint.prediction_report import wide
    from flint.render import LOG_WIDTH

    console = wide(console, LOG_WIDTH)     # twelve columns: never squeezed to ellipses
    for name, front in fronts.items():
        if not front:       # no point of this scenario was priced (or all are out of memory)
            console.print(f"Pareto front: {name}: none (no configuration priced and fitting "
                          f"in memory; results.csv says why)", highlight=False, markup=False)
            continue
        table = Table(title=escape(f"Pareto front: {name}"), title_justify="left")
        for col in ("devices", "dp", "tp", "cp", "pp", "micro-batches", "remat", "precision",
                    "step time", "tokens/s/device", "MFU", "memory"):
            table.add_column(col, justify="right", no_wrap=True)
        for r in front:
            table.add_row(str(r["devices"]), f"{r['dp']} zero{r['zero']}", str(r["tp"]),
                          str(r["cp"]), f"{r['pp']}" + (f"x{r['vp']} {r['schedule']}"
                                                        if r["pp"] > 1 else ""),
                          f"{r['micro_batch']}x{r['microbatches']}", r["remat"],
                          r["precision"], f"{r['step_time_s'] * 1e3:.1f} ms",
                          f"{r['tokens_per_s_per_device']:,.0f} tok/s",
                          f"{100 * r['mfu']:.1f} %" if r.get("mfu") else "-",
                          f"{r['memory_gib']:.1f} GiB")
        console.print(table)
