"""Rescaled graphs vs real re-extraction for the built-in models: extract each model at a
base size, `flint rescale` it to other sizes, extract at those sizes for real, and compare
the predicted step time, the collective bytes per step (total and per type), the peak
memory per device and the communicators (distinct group sets both graphs have).

    python scripts/compare_rescale.py [--models gpt2-small,llama3-8b] [--base 64]
        [--sizes 128,512,2048] [--hardware h100-sxm] [--json]

Default mesh fsdp=N/8,model=8 (weak scaling: each replica keeps its batch). Errors are
(rescaled - re-extracted) / re-extracted.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def extract(model: str, devices: int, out: Path) -> Path:
    r = subprocess.run([sys.executable, "-m", "flint.cli", "extract", "--model", model,
                        "--devices", str(devices), "--out", str(out), "--json"],
                       capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"extract {model} on {devices} devices failed:\n{r.stderr}")
    return out


def measure(graph, hardware: str) -> dict:
    from flint.hardware_models.estimate import estimate

    by_type = {k: v["bytes"] for k, v in graph.summary()["collectives_by_type"].items()}
    e = estimate(graph, hardware)
    return {"step_time_s": e.step_time_s, "memory_bytes": e.memory_bytes,
            "collective_bytes": sum(by_type.values()), "collective_bytes_by_type": by_type}


def group_sets(graph) -> set:
    return {frozenset(tuple(r) for r in c.groups().tolist()) for c in graph.communicators}


def compare(model: str, base, real, hardware: str) -> dict:
    from flint.passes.rescale import Rescale

    rescaled = Rescale(devices=real.cluster.devices).run(base)
    a, b = measure(rescaled, hardware), measure(real, hardware)
    types = sorted(set(a["collective_bytes_by_type"]) | set(b["collective_bytes_by_type"]))
    mine, theirs = group_sets(rescaled), group_sets(real)
    return {
        "model": model, "base_devices": base.cluster.devices,
        "devices": real.cluster.devices, "mesh": dict(real.cluster.mesh),
        "rescaled": a, "re_extracted": b,
        "error": {k: _err(a[k], b[k]) for k in ("step_time_s", "collective_bytes",
                                                  "memory_bytes")},
        "error_by_type": {t: _err(a["collective_bytes_by_type"].get(t, 0),
                                  b["collective_bytes_by_type"].get(t, 0)) for t in types},
        "communicators_matching": len(mine & theirs), "communicators_re_extracted": len(theirs),
    }


def _err(x: float, ref: float) -> float | None:
    return (x - ref) / ref if ref else (0.0 if x == ref else None)


def render(rows: list[dict], console) -> None:
    from rich.table import Table

    from flint.render import fmt_bytes, fmt_seconds

    def pct(x):
        return "n/a" if x is None else f"{100 * x:+.2f} %"

    for model in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == model]
        t = Table(title=f"{model}: rescaled from {mine[0]['base_devices']} devices vs "
                        f"re-extracted (per device)")
        for name in ("devices", "step time rescaled", "re-extracted", "error",
                     "collective bytes rescaled", "re-extracted", "error",
                     "peak memory rescaled", "re-extracted", "error", "communicators"):
            t.add_column(name, justify="right")
        for r in mine:
            a, b, e = r["rescaled"], r["re_extracted"], r["error"]
            t.add_row(str(r["devices"]), fmt_seconds(a["step_time_s"]),
                      fmt_seconds(b["step_time_s"]), pct(e["step_time_s"]),
                      fmt_bytes(a["collective_bytes"]), fmt_bytes(b["collective_bytes"]),
                      pct(e["collective_bytes"]), fmt_bytes(a["memory_bytes"]),
                      fmt_bytes(b["memory_bytes"]), pct(e["memory_bytes"]),
                      f"{r['communicators_matching']} of {r['communicators_re_extracted']}")
        console.print(t)
        types = sorted({k for r in mine for k in r["error_by_type"]})
        bt = Table(title=f"{model}: collective bytes per step by type, error of the rescaled "
                         f"graph")
        bt.add_column("devices", justify="right")
        for k in types:
            bt.add_column(k, justify="right")
        for r in mine:
            bt.add_row(str(r["devices"]), *(pct(r["error_by_type"].get(k)) for k in types))
        console.print(bt)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="gpt2-small,llama3-8b")
    p.add_argument("--base", type=int, default=64)
    p.add_argument("--sizes", default="128,512,2048")
    p.add_argument("--hardware", default="h100-sxm")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    a = p.parse_args()
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
    from rich.progress import TimeElapsedColumn

    from flint.graph import WorkloadGraph

    models = [m.strip() for m in a.models.split(",") if m.strip()]
    sizes = [int(s) for s in a.sizes.split(",")]
    err = Console(stderr=True)
    with tempfile.TemporaryDirectory() as tmp, Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), console=err, transient=True) as progress:
        jobs = [(m, n) for m in models for n in [a.base] + sizes]
        task = progress.add_task("extracting (compile-only XLA)", total=len(jobs))

        def run(job):
            path = extract(*job, Path(tmp) / f"{job[0]}-{job[1]}.json")
            progress.advance(task)
            return job, WorkloadGraph.load(path)

        # Two at a time: each extraction is one XLA compile, mostly single-threaded.
        with ThreadPoolExecutor(max_workers=2) as pool:
            graphs = dict(pool.map(run, jobs))
        progress.update(task, description="rescaling and estimating")
        rows = [compare(m, graphs[(m, a.base)], graphs[(m, n)], a.hardware)
                for m in models for n in sizes]
    if a.json:
        print(json.dumps(rows, sort_keys=True, indent=1))
    else:
        render(rows, Console(width=200))


if __name__ == "__main__":
    main()
