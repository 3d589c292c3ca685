"""Chakra export at scale: the Llama-3-8B-shaped step on 4096 H100s, against a write floor.

    python scripts/bench_export.py                    # extracts the graph first (~6 s)
    python scripts/bench_export.py --graph g.json     # or reuse a saved one

The floor is the time to write exactly the same bytes into the same number of files with
the same thread pool, with no encoding at all (each file's bytes prepared in memory before
the clock starts). Export and floor alternate, best of --repeat each, into fresh temporary
directories on the same filesystem. Goal: export within 2x of the floor.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from flint.exporters.chakra import export_chakra
from flint.graph import WorkloadGraph


def write_floor(sizes: list[int], blob: bytes, out: Path, workers: int) -> float:
    out.mkdir()
    payloads = [(blob * (s // len(blob) + 1))[:s] for s in sizes]

    def write(i: int) -> None:
        with open(out / f"workload.{i}.et", "wb") as f:
            f.write(payloads[i])

    t = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(write, range(len(sizes))))
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--graph", help="a saved graph JSON (default: extract llama3-8b)")
    ap.add_argument("--devices", type=int, default=4096)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--dir", default=None, help="scratch directory (default: system temp)")
    args = ap.parse_args()

    scratch = Path(tempfile.mkdtemp(prefix="flint-bench-export-", dir=args.dir))
    try:
        graph_path = args.graph
        if graph_path is None:
            graph_path = str(scratch / "graph.json")
            t = time.perf_counter()
            subprocess.run([sys.executable, "-m", "flint.cli", "extract", "--model",
                            "llama3-8b", "--devices", str(args.devices), "--out", graph_path,
                            "--json"], check=True, stdout=subprocess.DEVNULL)
            print(f"extract llama3-8b @ {args.devices} devices: {time.perf_counter() - t:.1f} s")
        graph = WorkloadGraph.load(graph_path)

        best_export, best_floor, stats = float("inf"), float("inf"), None
        for i in range(args.repeat):
            out = scratch / f"export{i}"
            t = time.perf_counter()
            run = export_chakra(graph, out, workers=args.workers)
            took = time.perf_counter() - t
            if took < best_export:                        # report the best run's own split
                best_export, stats = took, run
            sizes = [os.path.getsize(out / f"workload.{r}.et") for r in range(run.ranks)]
            blob = (out / "workload.1.et").read_bytes()
            shutil.rmtree(out)
            best_floor = min(best_floor, write_floor(sizes, blob, scratch / f"floor{i}",
                                                     args.workers))
            shutil.rmtree(scratch / f"floor{i}")
        mb = stats.bytes / 1e6
        print(f"ranks: {stats.ranks} files, {stats.nodes_per_rank} nodes per rank, "
              f"{mb:.1f} MB in total ({mb / stats.ranks:.3f} MB per rank)")
        print(f"export (encode once + specialize + write + ASTRA-sim inputs): "
              f"{best_export:.2f} s, {mb / best_export:.0f} MB/s "
              f"(encode {stats.encode_s:.2f} s, write {stats.write_s:.2f} s)")
        print(f"floor (same bytes, same files, same {args.workers} threads): "
              f"{best_floor:.2f} s, {mb / best_floor:.0f} MB/s")
        print(f"export / floor: {best_export / best_floor:.2f}x (goal <= 2x)")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
