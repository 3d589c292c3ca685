"""Interrupt `flint export` while it writes rank files, many times, under CPU load.

    python scripts/stress_interrupt.py                     # 40 runs, 4 busy loops
    python scripts/stress_interrupt.py --runs 200 --load 6 --ranks 65536

Each run saves a one-node graph (an all-reduce over every rank), starts the real CLI
export with one writer thread, waits for its first rank file and sends SIGINT or SIGTERM
(alternating). A run passes when the export exits 130 with the one line
`flint: interrupted` and leaves nothing beside its input. A run still alive --timeout
seconds after the signal is a hang (what CI saw before flint.guard.HeldSignals: a
KeyboardInterrupt raised inside the writer pool's own lock). Prints the counts and the
signal-to-exit latency (median, worst), in seconds.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from flint.cluster import Cluster
from flint.graph import Collective, Communicator, Node, NodeKind, WorkloadGraph


def graph(ranks: int) -> WorkloadGraph:
    comm = Communicator(0, "groups", "{{" + ",".join(map(str, range(ranks))) + "}}", ranks,
                        ranks, 1, ("data",))
    size = 2 * 2**20        # one 2 MiB all-reduce over every rank: the smallest step
    nodes = [Node(0, "all-reduce.1", NodeKind.COLLECTIVE, "all-reduce", "collective",
                  bytes_read=size, bytes_written=size, outputs=["bf16[1048576]"],
                  collective=Collective("all-reduce", 0, size, size, "bf16", "sum"))]
    return WorkloadGraph(Cluster(ranks, (("data", ranks),), "h100-sxm"), nodes, [comm], [],
                         {"model": "stress-interrupt"})


def one_run(work: Path, signum: int, timeout: float) -> tuple[str, float]:
    """('ok' | 'hang' | a failure in words, seconds from the signal to the exit)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    p = subprocess.Popen([sys.executable, "-m", "flint.cli", "export", str(work / "g.json"),
                          "--out", str(work / "et"), "--workers", "1"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + 120
    while not list(work.glob(".et.*.partial/*.et")):
        if p.poll() is not None or time.time() > deadline:
            p.kill()
            return "never started writing", 0.0
        time.sleep(0.02)
    p.send_signal(signum)
    t0 = time.perf_counter()
    try:
        _, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        return "hang", timeout
    waited = time.perf_counter() - t0
    left = sorted(x.name for x in work.iterdir())
    if p.returncode != 130:
        return f"exit {p.returncode}", waited
    if err.strip().splitlines() != ["flint: interrupted"]:
        return f"stderr {err.strip()[:80]!r}", waited
    if left != ["g.json"]:
        return f"left {left[:3]}", waited
    return "ok", waited


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--load", type=int, default=4, help="busy-loop processes beside it")
    ap.add_argument("--ranks", type=int, default=65536)
    ap.add_argument("--timeout", type=float, default=20.0, help="seconds before a hang")
    args = ap.parse_args()
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(args.load)]
    outcomes, waits = {}, []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp) / "w"
            for i in range(args.runs):
                shutil.rmtree(work, ignore_errors=True)
                work.mkdir()
                graph(args.ranks).save(work / "g.json")
                signum = (signal.SIGINT, signal.SIGTERM)[i % 2]
                what, waited = one_run(work, signum, args.timeout)
                outcomes[what] = outcomes.get(what, 0) + 1
                if what == "ok":
                    waits.append(waited)
                print(f"[{i + 1}/{args.runs}] {signal.Signals(signum).name}: {what} "
                      f"({waited:.2f} s)", file=sys.stderr, flush=True)
    finally:
        for h in hogs:
            h.kill()
    print(f"{args.runs} interrupted exports of {args.ranks} ranks with {args.load} busy "
          f"loops: " + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())))
    if waits:
        print(f"signal to exit: median {statistics.median(waits):.2f} s, worst "
              f"{max(waits):.2f} s")
    sys.exit(0 if outcomes.get("ok", 0) == args.runs else 1)


if __name__ == "__main__":
    main()
