"""Time and peak memory of PyTorch extraction: the Llama-3-8B-shaped torch twin, traced
under fake tensors for rank 0 of 8 and of 4096 ranks (FSDP x TP=8), each in a fresh
process so that peak RSS is that run's own.

    python scripts/bench_extract_torch.py [--layers 32]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

CHILD = """
import json, resource, sys, time
t = time.perf_counter()
import flint.torch as ft
world, mesh, layers = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
g = ft.zoo("llama3-8b", world, mesh, layers=layers)
timings = g.meta.get("timings", {})
print(json.dumps({"wall_s": time.perf_counter() - t, "nodes": len(g.nodes),
                  "flops_per_device": g.total_flops(),
                  "model_flops_per_device": g.meta["model_flops_per_device"],
                  "timings": timings,
                  "peak_rss_MiB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=32)
    args = ap.parse_args()
    for world, mesh in ((8, "fsdp=1,model=8"), (4096, "fsdp=512,model=8")):
        t = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", CHILD, str(world), mesh, str(args.layers)],
                             capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"llama3-8b ({args.layers} layers) torch, {world} ranks ({mesh}): "
              f"{r['wall_s']:.1f} s in-process ({time.perf_counter() - t:.1f} s with interpreter "
              f"start), peak RSS {r['peak_rss_MiB']:.0f} MiB, {r['nodes']} nodes, "
              f"{r['flops_per_device'] / 1e12:.2f} TFLOP/device "
              f"(model flops {r['model_flops_per_device'] / 1e12:.2f}); "
              + ", ".join(f"{k} {v:.1f} s" for k, v in r["timings"].items()))


if __name__ == "__main__":
    main()
