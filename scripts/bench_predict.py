"""The engine's speed goals, measured in one run: a ladder of published-scale
configurations (8B to 1T, 8 to 16,384 GPUs, dense and MoE) cold (an empty stage-program
cache: compile + price) and warm (the disk cache kept, this process's memory dropped:
load + passes + price), then a 1,000-configuration sweep of one model cold.

    python scripts/bench_predict.py [--only NAME,...] [--sweep-points 1000] [--no-sweep]

Goals (issue "One engine for a training run"): cold <= 60 s per configuration, warm
<= 2 s, the sweep <= 10 minutes on 2 cores. Each line prints the wall times, their ratio
to the goal and the predicted step, so one run shows every figure.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

COLD_GOAL_S, WARM_GOAL_S, SWEEP_GOAL_S = 60.0, 2.0, 600.0
# name -> TrainingRun fields (the configurations the published tables and papers name)
LADDER = {
    "llama3-8b fsdp 8 h100": dict(model="llama3-8b", seq_len=8192, devices=8, zero=3,
                                  global_batch=128, precision="fp8"),
    "llama3-8b fsdp 64 h100": dict(model="llama3-8b", seq_len=8192, devices=64, zero=3,
                                   global_batch=64, remat="full"),
    "llama3-70b tp8 pp4 vp5 fp8 1024 h100": dict(
        model="llama3-70b", seq_len=8192, devices=1024, tp=8, pp=4, vp=5, global_batch=512,
        precision="fp8"),
    "gpt3-175b tp8 pp8 1536 a100": dict(
        model="gpt3-175b", seq_len=2048, devices=1536, hardware="a100-80gb-sxm", tp=8,
        pp=8, global_batch=1536),
    "llama3.1-405b tp8 cp16 pp16 16384 h100 seq 131072": dict(
        model="llama3.1-405b", seq_len=131072, devices=16384, tp=8, cp=16, pp=16,
        global_batch=128),
    "gpt-1t tp8 pp64 3072 a100": dict(
        model="gpt-1t", seq_len=2048, devices=3072, hardware="a100-80gb-sxm", tp=8, pp=64,
        global_batch=3072, remat="full", zero=0),
    "mixtral-8x7b ep8 64 h100": dict(model="mixtral-8x7b", seq_len=4096, devices=64, ep=8,
                                     global_batch=256),
    "deepseek-v3 ep64 pp4 vp4 256 gb200-nvl72": dict(
        model="deepseek-v3", seq_len=4096, devices=256, pp=4, vp=4, ep=64,
        global_batch=4096, hardware="gb200-nvl72", precision="mxfp8"),
}
# the sweep: one model over TP x PP x VP x micro-batch x remat on one cluster, at four
# global batches (which change no stage program)
SWEEP = {"model": "llama3-70b", "seq_len": 8192, "devices": 1024,
         "global_batch": [512, 1024, 2048, 4096], "tp": [1, 2, 4, 8], "pp": [1, 2, 4, 8, 16],
         "vp": [1, 2, 4, 5], "micro_batch": [1, 2, 4], "remat": ["selective", "full"]}


def ladder(names) -> bool:
    from flint import engine
    from flint.run import TrainingRun

    ok = True
    print(f"{'configuration':52s} {'cold':>8s} {'x goal':>7s} {'warm':>7s} {'x goal':>7s} "
          f"{'step':>9s} {'MFU':>6s}  memory")
    for name in names:
        run = TrainingRun(**LADDER[name])
        with tempfile.TemporaryDirectory() as cache:
            engine.forget()
            t0 = time.perf_counter()
            engine.predict(run, cache=cache)
            cold = time.perf_counter() - t0
            engine.forget()
            t0 = time.perf_counter()
            p = engine.predict(run, cache=cache)
            warm = time.perf_counter() - t0
        ok &= cold <= COLD_GOAL_S and warm <= WARM_GOAL_S
        print(f"{name:52s} {cold:7.1f}s {cold / COLD_GOAL_S:6.2f}x {warm:6.2f}s "
              f"{warm / WARM_GOAL_S:6.2f}x {p.step_time_s:8.3f}s {100 * p.mfu:5.1f}%  "
              f"{p.memory_bytes / 2**30:.1f} GiB{' OOM' if p.oom else ''}", flush=True)
    return ok


def sweep(points: int) -> bool:
    from flint import engine
    from flint.sweep import run_sweep
    from flint.sweep_space import SearchSpace, program_of

    space = SearchSpace.from_dict({**SWEEP, "budget": points, "seed": 0})
    chosen, skipped = space.expand()
    programs = len({program_of(p) for p in chosen})
    print(f"\nsweep: {SWEEP['model']} on {SWEEP['devices']} GPUs over tp x pp x vp x "
          f"micro-batch x remat x global batch: {len(chosen)} valid configurations priced "
          f"({len(skipped)} invalid skipped), {programs} stage programs to compile",
          flush=True)
    engine.forget()
    done = [0]
    t0 = time.perf_counter()

    def progress(row, count, total):
        done[0] = count
        if count % 100 == 0 or count == total:
            print(f"  {count}/{total} priced, {time.perf_counter() - t0:6.1f} s", flush=True)

    with tempfile.TemporaryDirectory() as out:
        rows = run_sweep(space, Path(out) / "sweep", on_result=progress)
    wall = time.perf_counter() - t0
    ok_rows = [r for r in rows if r["status"] == "ok"]
    best = min((r for r in ok_rows if not r["oom"]), key=lambda r: r["step_time_s"],
               default=None)
    print(f"sweep wall time {wall:.1f} s for {len(rows)} configurations "
          f"({wall / SWEEP_GOAL_S:.2f}x the 10-minute goal; {wall / max(len(rows), 1):.2f} s "
          f"each); {len(ok_rows)} priced, {sum(r['oom'] for r in ok_rows)} out of memory")
    if best:
        print(f"fastest that fits: tp{best['tp']} cp{best['cp']} pp{best['pp']} "
              f"vp{best['vp']} mb{best['micro_batch']} {best['remat']} {best['precision']}: "
              f"{best['step_time_s']:.3f} s")
    return wall <= SWEEP_GOAL_S


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated ladder names (default: all)")
    ap.add_argument("--sweep-points", type=int, default=1000)
    ap.add_argument("--no-sweep", action="store_true")
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(LADDER)
    unknown = [n for n in names if n not in LADDER]
    if unknown:
        print(f"bench_predict: unknown configuration {unknown[0]!r}", file=sys.stderr)
        return 2
    ok = ladder(names)
    if not args.no_sweep:
        ok &= sweep(args.sweep_points)
    print("all goals met" if ok else "some goal MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
