"""Blocking launches against BigScience's own measurement of them.

`../shared/tables/more-published.md` section 1 carries the hang-debug table of
chronicles-prequel.md ("dealing with JZ hanging on the large model"): the same 200B run
(TP8 PP10) with CUDA_LAUNCH_BLOCKING=1 and without, TFLOP/s only. A pair with the same
GPUs and batch differs only in the launch mode, so the measured slowdown is the ratio of
its TFLOP/s; Flint's is the ratio of its two predicted steps, each built as the fidelity
harness builds BigScience rows (scripts/fidelity_families.py, every mechanism of the era)
with `launch_blocking` on and off. A pair whose asynchronous run hung has no figure.

    PYTHONPATH=. python scripts/compare_launch_blocking.py [--cache build/fidelity]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from more_published import MORE_TABLE, more_cases  # noqa: E402
from table_columns import first_number, tables  # noqa: E402


def hang_debug_pairs(path: Path = MORE_TABLE) -> list[tuple]:
    """[(the case run blocking, TFLOP/s blocking, TFLOP/s asynchronous)] of the pairs
    whose asynchronous run finished."""
    rows = {str(r.get("line")).strip(): r for heading, records in tables(path)
            for r in records if str(r.get("cuda_launch_blocking") or "").strip()}
    cases = {c.label.split()[0][3:]: c for c in more_cases(path) if c.label.startswith("1-L")}
    runs: dict = {}
    for line, r in rows.items():
        key = (r.get("gpus"), r.get("gbs"))
        blocking = str(r["cuda_launch_blocking"]).strip() == "1"
        runs.setdefault(key, {})[blocking] = (cases[line], first_number(r.get("tflops")))
    return [(pair[True][0], pair[True][1], pair[False][1]) for pair in runs.values()
            if True in pair and False in pair and pair[False][1] and pair[True][1]]


def main(argv=None) -> int:
    from fidelity_families import applicable, variant_fields
    from flint.engine import predict
    from flint.run import TrainingRun
    from flint.template_cache import TemplateCache

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", default="build/fidelity", help="stage-program cache")
    args = ap.parse_args(argv)
    cache = TemplateCache(Path(args.cache))
    pairs = hang_debug_pairs()
    print("CUDA_LAUNCH_BLOCKING=1 vs asynchronous launches, BLOOM 200B TP8 PP10 "
          "(chronicles-prequel.md hang-debug table)")
    print(f"{'GPUs':>5} {'GBS':>5} {'measured slowdown':>18} {'Flint slowdown':>15} "
          f"{'Flint step, blocking / async':>30}")
    for k, (case, tflops_blocking, tflops_async) in enumerate(pairs, 1):
        print(f"  pair {k} of {len(pairs)}: predicting ...", file=sys.stderr)
        fields = variant_fields(case, applicable(case))
        steps = {}
        for blocking in (True, False):
            run = TrainingRun(**dict(fields, launch_blocking=blocking))
            steps[blocking] = predict(run, cache=cache, what_if=case.what_if).step_time_s
        measured = tflops_async / tflops_blocking - 1
        flint = steps[True] / steps[False] - 1
        print(f"{case.fields['devices']:>5} {case.fields['global_batch']:>5} "
              f"{measured * 100:>+17.1f}% {flint * 100:>+14.1f}% "
              f"{steps[True]:>14.1f} s / {steps[False]:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
