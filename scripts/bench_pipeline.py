"""Pipeline bubble of a GPT model against the textbook formula, per schedule.

    python scripts/bench_pipeline.py [--graph g.json] [--stages 8] [--microbatches 32]

Extracts GPT-3 6.7B's shape (Brown et al. 2020) with 31 transformer layers on one H100
(compile-only): with the LM head weighing about one layer, the 33 blocks (embedding,
31 layers, head) split into 8 stages of equal time, which is the setting the formula
assumes (Megatron-LM's --account-for-loss-in-pipeline-split does the same by count).
Then it runs GPipe, 1F1B and interleaved 1F1B and prints the predicted bubble (the share
of the pipelined part a device's compute stream idles, averaged over devices) against
(p-1)/(m+p-1), and (p-1)/(v*m+p-1) for v virtual stages. Exit 1 when 1F1B is more than 2
points of the step away from the formula, or interleaving does not shrink the bubble.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graph", help="a per-device graph JSON (default: extract GPT-3 6.7B x31)")
    ap.add_argument("--stages", type=int, default=8)
    ap.add_argument("--microbatches", type=int, default=32)
    ap.add_argument("--hardware", default="h100-sxm")
    args = ap.parse_args()
    from flint.graph import WorkloadGraph
    from flint.hardware_models.estimate import estimate
    from flint.passes.pipeline import PipelineParallel

    path = args.graph
    if path is None:
        path = os.path.join(tempfile.mkdtemp(), "gpt.json")
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "flint.cli", "extract", "--model", "gpt3-6.7b",
                        "--layers", "31", "--devices", "1", "--mesh", "data=1", "--unroll",
                        "--hardware", args.hardware, "--out", path, "--json"],
                       check=True, stdout=subprocess.DEVNULL)
        print(f"extracted GPT-3 6.7B (31 layers, 1 microbatch of 1 x 2048 tokens) in "
              f"{time.perf_counter() - t0:.1f} s")
    graph = WorkloadGraph.load(path)
    p, m = args.stages, args.microbatches
    print(f"{len(graph.nodes)} nodes per microbatch step; PP={p}, {m} microbatches, "
          f"{args.hardware}, stages split by predicted time at layer boundaries")
    print(f"{'schedule':<16}{'step':>12}{'bubble':>10}{'formula':>10}{'diff':>12}"
          f"{'stage busy min..max':>26}{'nodes':>9}{'time':>9}")
    results = {}
    for schedule, v in (("gpipe", 1), ("1f1b", 1), ("interleaved", 2)):
        t0 = time.perf_counter()
        piped = PipelineParallel(p, m, schedule, v, split="time",
                                 hardware=args.hardware).run(graph)
        e = estimate(piped, args.hardware)
        took = time.perf_counter() - t0
        got = e.pipeline["bubble_fraction"]
        formula = (p - 1) / (v * m + p - 1)
        busy = e.pipeline["compute_busy_s"]
        results[(schedule, v)] = (got, formula)
        name = schedule + (f" v={v}" if v > 1 else "")
        print(f"{name:<16}{e.step_time_s * 1e3:>9.1f} ms{100 * got:>9.2f}%{100 * formula:>9.2f}%"
              f"{100 * (got - formula):>+9.2f} pt{min(busy) * 1e3:>13.1f}..{max(busy) * 1e3:.1f} ms"
              f"{len(piped.nodes):>9}{took:>7.1f} s")
    got, formula = results[("1f1b", 1)]
    print(f"1F1B bubble {100 * got:.2f}% of the step vs (p-1)/(m+p-1) = {100 * formula:.2f}%: "
          f"{100 * (got - formula):+.2f} points ({100 * (got / formula - 1):+.1f}% relative)")
    ok = abs(got - formula) <= 0.02 and results[("interleaved", 2)][0] < got
    print("goal (1F1B within 2 points of the step; interleaving smaller):",
          "met" if ok else "MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
