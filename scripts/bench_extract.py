"""Flint's extract time and peak memory next to a bare XLA compile of the same step.

For each device count, two fresh processes build the same zoo step (Llama-3-8B-shaped by
default, H100 target): one runs only `jit(...).lower(...).compile()`, the other runs
Flint's whole extraction (compile + optimized HLO -> WorkloadGraph). Both time from after
imports to the end of their work and report their own peak RSS. Ratios are printed.

    python scripts/bench_extract.py [--model llama3-8b] [--devices 8,512,4096] [--unroll]
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


def worker(mode: str, model: str, devices: int, hardware: str, scan: bool) -> dict:
    from flint.frontends.steps import default_zoo_mesh
    from flint.cluster import parse_mesh
    from flint.frontends.jax import capture
    from flint.models.train import build

    mesh = parse_mesh(default_zoo_mesh(devices), devices)
    t0 = time.perf_counter()
    w = build(model, mesh, scan=scan)
    step = capture(w.step, devices=devices, mesh=dict(mesh), hardware=hardware,
                   in_specs=w.in_specs, out_specs=w.out_specs, donate_argnums=w.donate_argnums)
    compiled = step.lower(*w.args).compile()
    nodes = 0
    if mode == "flint":
        graph = compiled.workload()
        nodes = len(graph.nodes)
    seconds = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB -> MiB on Linux
    return {"seconds": seconds, "peak_rss_mib": rss, "nodes": nodes}


def run(mode, model, devices, hardware, scan) -> dict:
    cmd = [sys.executable, __file__, "--worker", mode, "--model", model, "--devices",
           str(devices), "--hardware", hardware] + ([] if scan else ["--unroll"])
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if out.returncode:
        sys.exit(f"{mode} at {devices} devices failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="llama3-8b")
    p.add_argument("--devices", default="8,512,4096")
    p.add_argument("--hardware", default="h100-sxm")
    p.add_argument("--unroll", action="store_true", help="layers unrolled instead of scanned")
    p.add_argument("--worker", choices=["bare", "flint"], help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        print(json.dumps(worker(a.worker, a.model, int(a.devices), a.hardware, not a.unroll)))
        return
    from rich.console import Console
    from rich.table import Table

    sizes = [int(x) for x in a.devices.split(",")]
    table = Table(title=f"{a.model} ({'unrolled' if a.unroll else 'scan'}) on {a.hardware}: "
                        f"Flint extract vs bare XLA compile (fresh process each)")
    for col in ("devices", "bare compile", "flint extract", "time ratio", "bare peak RSS",
                "flint peak RSS", "RSS ratio", "graph nodes"):
        table.add_column(col, justify="right")
    results = {}
    for n in sizes:
        bare = run("bare", a.model, n, a.hardware, not a.unroll)
        flint = run("flint", a.model, n, a.hardware, not a.unroll)
        results[n] = flint
        table.add_row(f"{n} devices", f"{bare['seconds']:.2f} s", f"{flint['seconds']:.2f} s",
                      f"{flint['seconds'] / bare['seconds']:.2f}x",
                      f"{bare['peak_rss_mib']:.0f} MiB", f"{flint['peak_rss_mib']:.0f} MiB",
                      f"{flint['peak_rss_mib'] / bare['peak_rss_mib']:.2f}x",
                      f"{flint['nodes']} nodes")
    console = Console()
    console.print(table)
    lo, hi = min(sizes), max(sizes)
    console.print(f"extract at {hi} devices / extract at {lo} devices: "
                  f"{results[hi]['seconds'] / results[lo]['seconds']:.2f}x time "
                  f"(goal <= 1.5x); graph {results[hi]['nodes']} vs {results[lo]['nodes']} nodes")


if __name__ == "__main__":
    main()
