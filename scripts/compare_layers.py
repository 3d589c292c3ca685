"""One transformer layer, forward and backward, against a published per-layer measurement.

Korthikanti et al. 2022 (arXiv 2205.05198), Table 4: the forward and backward time of one
transformer layer of their 22B model (Table 3: 48 layers, hidden 6144, 64 heads, TP8 on 8
A100 80GB of Selene, micro-batch 4, sequence 2048; Megatron-LM 2022, no flash attention)
under five recompute / sequence-parallel settings. The run is the one scripts/fidelity.py
rebuilds for published.md row 4#1 (its era's framework semantics), each setting a
TrainingRun.replace of it; Flint's figures are the layer's forward and backward blocks as
the step's prediction prices them (flint.layer_times).

    python scripts/compare_layers.py [--cache build/fidelity] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

# Table 4: (experiment, remat, sp) -> forward ms, backward ms
TABLE4 = (("baseline no recompute", "none", False, 7.7, 11.9),
          ("sequence parallelism", "none", True, 7.2, 11.8),
          ("baseline with recompute", "full", False, 7.7, 19.5),
          ("selective recompute", "selective", False, 7.7, 13.2),
          ("selective + sequence", "selective", True, 7.2, 13.1))
ROW = "4#1 22B 8"          # published.md's 22B row (present work); its fields, re-set below


def base_run():
    from fidelity import load_cases
    from fidelity_families import applicable, variant_fields

    from flint.run import TrainingRun

    for case in load_cases("published"):
        if case.label == ROW and case.fields:
            return TrainingRun(**variant_fields(case, applicable(case)))
    raise SystemExit(f"compare_layers: published.md has no row {ROW!r}")


def compare(cache=None, experiments=TABLE4) -> list[dict]:
    from flint.layer_times import layer_times

    run = base_run()
    rows = []
    for name, remat, sp, fwd, bwd in experiments:
        t = layer_times(run.replace(remat=remat, sp=sp), cache=cache)
        rows.append({"experiment": name, "remat": remat, "sp": sp,
                     "measured_ms": [fwd, bwd, fwd + bwd],
                     "flint_ms": [t.forward_s * 1e3, t.backward_s * 1e3, t.combined_s * 1e3],
                     "error": t.combined_s * 1e3 / (fwd + bwd) - 1})
    return rows


def recompute_overhead(rows) -> tuple[float, float] | None:
    """(measured, Flint) ms the backward gains by recomputing the whole layer."""
    by = {r["experiment"]: r for r in rows}
    a, b = by.get("baseline no recompute"), by.get("baseline with recompute")
    if not a or not b:
        return None
    return (b["measured_ms"][1] - a["measured_ms"][1], b["flint_ms"][1] - a["flint_ms"][1])


def render(rows) -> str:
    lines = ["Korthikanti et al. 2022, Table 4: one 22B layer (TP8, A100, micro-batch 4, seq "
             "2048), forward / backward / combined",
             f"{'experiment':26s} {'measured':>22s} {'Flint':>22s} {'combined':>9s}"]
    for r in rows:
        m, f = r["measured_ms"], r["flint_ms"]
        lines.append(f"{r['experiment']:26s} {m[0]:5.1f} /{m[1]:5.1f} /{m[2]:5.1f} ms "
                     f"{f[0]:5.2f} /{f[1]:5.2f} /{f[2]:5.2f} ms {r['error'] * 100:+8.1f} %")
    over = recompute_overhead(rows)
    if over:
        lines.append(f"recompute in the backward: measured {over[0]:.1f} ms, Flint "
                     f"{over[1]:.2f} ms (the layer's forward: measured 7.7 ms)")
    errors = sorted(abs(r["error"]) for r in rows)
    lines.append(f"median |error| of the combined time: {errors[len(errors) // 2] * 100:.1f} % "
                 f"over {len(rows)} settings")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", default=None, help="template cache directory")
    ap.add_argument("--json", default=None, help="also write the rows as JSON here")
    a = ap.parse_args(argv)
    rows = compare(a.cache)
    print(render(rows))
    if a.json:
        Path(a.json).write_text(json.dumps({"rows": rows,
                                            "recompute_ms": recompute_overhead(rows)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
