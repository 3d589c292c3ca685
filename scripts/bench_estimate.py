"""Time to estimate the 4096-device Llama-3-8B-shaped graph, next to the time to extract it.

    python scripts/bench_estimate.py [--devices 4096] [--model llama3-8b] [--hardware h100-sxm]
"""
from __future__ import annotations

import argparse
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", type=int, default=4096)
    p.add_argument("--model", default="llama3-8b")
    p.add_argument("--hardware", default="h100-sxm")
    a = p.parse_args()
    from flint.frontends import ExtractRequest, extract
    from flint.hardware_models.estimate import estimate

    t0 = time.perf_counter()
    graph, _ = extract(ExtractRequest(devices=a.devices, hardware=a.hardware, model=a.model))
    extract_s = time.perf_counter() - t0
    runs = []
    for _ in range(3):
        t1 = time.perf_counter()
        e = estimate(graph, a.hardware)
        runs.append(time.perf_counter() - t1)
    best = min(runs)
    print(f"{a.model} on {a.devices} x {a.hardware}: graph {len(graph.nodes)} nodes "
          f"({sum(n.repeat for n in graph.nodes)} after loop expansion)")
    print(f"extract: {extract_s:.2f} s; estimate: {best * 1e3:.0f} ms (best of 3: "
          f"{', '.join(f'{r * 1e3:.0f}' for r in runs)} ms); ratio estimate/extract "
          f"{best / extract_s:.3f}; goal: estimate <= 1 s")
    print(f"predicted step {e.step_time_s * 1e3:.1f} ms, HFU {100 * e.hfu:.1f} %")


if __name__ == "__main__":
    main()
