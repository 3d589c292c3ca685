"""NVFP4 rows of published.md against Flint (precision nvfp4, flint/models/nvfp4.py):

1. NVFP4's step over its MXFP8 sibling's (the same release, model, system and GPU count),
   measured and predicted: what NVFP4 buys, apart from each layout's own error;
2. Megatron-Bridge's NVFP4 recipes run without TP communication overlap (the run's
   default, flint/run.py): each NVFP4 row with TP > 1 priced as built and with
   tp_comm_overlap on, against the published step.

Rows are built as scripts/fidelity.py builds them (the same fields, mechanisms and memory
fit). Usage: python scripts/fidelity_nvfp4.py [--cache DIR]
"""
from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _sibling_key(label: str):
    m = re.match(r"\S+ (.*) (NVFP4|MXFP8)$", label)
    return (m.group(1), m.group(2)) if m else None


def rebuildable(cases) -> dict:
    """{(the row's label past its number and before its precision, precision): case} of the
    rebuildable NVFP4 and MXFP8 rows."""
    out = {}
    for case in cases:
        key = _sibling_key(case.label)
        if key and not case.reason:
            out[key] = case
    return out


def nvfp4_pairs(cases) -> list[tuple]:
    """(NVFP4 row, its MXFP8 sibling) for each NVFP4 row with one: the same release,
    model, system and GPU count (their layouts may differ: `layout`)."""
    rows = rebuildable(cases)
    return [(fp4, rows[(name, "MXFP8")]) for (name, prec), fp4 in sorted(rows.items())
            if prec == "NVFP4" and (name, "MXFP8") in rows]


def layout(case) -> str:
    """tp/pp/vp/micro-batch as the row states them."""
    f = case.fields
    return "/".join(str(f.get(k, 1)) for k in ("tp", "pp", "vp", "micro_batch"))


def main(argv=None) -> int:
    from fidelity import Runner, load_cases
    from fidelity_families import applicable
    from flint.engine import predict

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", default="build/fidelity", help="stage-program cache directory")
    args = ap.parse_args(argv)
    runner = Runner(Path(args.cache), quiet=True)
    published = load_cases("published")
    cases = rebuildable(published)

    built: dict = {}

    def build(case):
        """The row's run as scripts/fidelity.py builds it (its memory fit once per row)."""
        if case.label not in built:
            run, why = runner.build(case, applicable(case))
            if run is None:
                raise SystemExit(f"{case.label}: {why}")
            built[case.label] = run
        return built[case.label]

    def step(case, **changes) -> float:
        run = build(case).replace(**changes) if changes else build(case)
        return predict(run, cache=runner.store, what_if=case.what_if).step_time_s

    print("NVFP4 over MXFP8, same release, model, system and GPUs (step ratio MXFP8 / NVFP4; "
          "layout: tp/pp/vp/micro-batch, MXFP8's where it differs)")
    print(f"{'row':58s} {'measured':>9s} {'Flint':>7s}  layout")
    for fp4, mx in nvfp4_pairs(published):
        measured = mx.published_step_s / fp4.published_step_s
        shape = layout(fp4) + ("" if layout(mx) == layout(fp4) else f" (MXFP8 {layout(mx)})")
        print(f"{fp4.label[:58]:58s} {measured:8.2f}x {step(mx) / step(fp4):6.2f}x  {shape}")

    print("\nNVFP4 rows with TP > 1: step error with TP communication overlap off (the "
          "recipes' choice, the default) and on")
    print(f"{'row':58s} {'off':>8s} {'on':>8s}")
    errors: dict = {}
    for (name, prec), case in sorted(cases.items()):
        if prec != "NVFP4" or build(case).tp == 1:
            continue
        off = step(case) / case.published_step_s - 1
        on = step(case, tp_comm_overlap=True) / case.published_step_s - 1
        errors.setdefault(case.family, []).append((off, on))
        print(f"{case.label[:58]:58s} {off:+8.1%} {on:+8.1%}")
    for family, pairs in errors.items():
        better = sum(abs(off) < abs(on) for off, on in pairs)
        print(f"{family}: median |error| off {statistics.median(abs(p[0]) for p in pairs):.1%}, "
              f"on {statistics.median(abs(p[1]) for p in pairs):.1%}; off better in "
              f"{better}/{len(pairs)} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
