"""How long `flint plan` takes: Llama-3-70B on 1024 H100s cold (an empty stage-program
cache) and warm (the same command again, its programs cached), and a 10-point hardware
what-if plan of it cold. Each runs as its own `flint plan` process, as a user would.

    python scripts/bench_plan.py                 # all three, prints wall times and ratios
    python scripts/bench_plan.py --skip-what-if  # the cold and warm plans only

Targets (issue "flint plan"): <= 5 min cold, <= 30 s warm, <= 10 min for the 10-point
what-if, on 2 cores. Prints one line per measurement and the ratio of each to its target.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PLAN = ["plan", "--model", "llama3-70b", "--devices", "1024", "--seq-len", "8192",
        "--global-batch", "1024", "--hardware", "h100-sxm", "--json"]
# ten what-if points: five knobs at half and double the H100's figure
WHAT_IF = ["peak_bf16", "hbm_bandwidth", "scale_up_bandwidth", "nic_bandwidth", "hbm_capacity"]
TARGETS = {"cold": 300.0, "warm": 30.0, "what-if": 600.0}


def timed(args: list, cache: str) -> tuple[float, dict]:
    env = dict(os.environ, FLINT_CACHE=cache)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "flint.cli", *args], capture_output=True,
                          text=True, env=env, cwd=REPO)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"flint {' '.join(args)} failed: {proc.stderr.strip()[-400:]}")
    return wall, json.loads(proc.stdout)


def line(name: str, wall: float, doc: dict) -> None:
    c = doc["counts"]
    w = doc["winner"]
    print(f"{name:8s} {wall:7.1f} s  target {TARGETS[name]:5.0f} s  ratio "
          f"{wall / TARGETS[name]:.2f}  | {c['raw']:,} candidates, {c['valid']:,} valid, "
          f"{c['ranked']:,} ranked, {c['priced']} priced, {c['compiled']} compiled; winner "
          f"{w and round(w['step_time_s'], 3)} s", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-what-if", action="store_true")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="flint-bench-plan-") as tmp:
        cache = str(Path(tmp) / "cache")
        wall, doc = timed(PLAN, cache)
        line("cold", wall, doc)
        wall, again = timed(PLAN, cache)
        line("warm", wall, again)
        same = [r["key"] for r in doc["priced"]] == [r["key"] for r in again["priced"]]
        print(f"warm plan gives the cold plan's ranking: {same}")
        if not args.skip_what_if:
            fresh = str(Path(tmp) / "cache-what-if")
            knobs = [x for k in WHAT_IF for x in ("--what-if", k)]
            wall, study = timed(PLAN + knobs, fresh)
            line("what-if", wall, study)
            print(f"what-if points: {len(study['points'])}; most sensitive knob: "
                  f"{study['sensitivity'][0]['knob']} (elasticity "
                  f"{study['sensitivity'][0]['elasticity']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
