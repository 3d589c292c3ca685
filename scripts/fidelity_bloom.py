"""BLOOM-176B's topology sweep (more-published.md section 1) seen three ways: the rank
correlation of predicted vs measured step (the relative effect of parallelism choices), the
errors by attention head width, and the errors by tensor- and data-parallel size with the
one-node rows apart (which of the misses the network can explain and which it cannot).
Functions of the priced cases of scripts/fidelity.py; each returns (text, JSON)."""
from __future__ import annotations

from fidelity_families import applicable
from fidelity_lofo import mech_id, variant_name, without
from fidelity_stats import median, spearman


def _bloom_rows(cases, name_of=lambda c: "after") -> list:
    return [c for c in cases if c.section == "1" and c.file == "more-published"
            and not c.reason and c.predicted.get(name_of(c), {}).get("step_s")]


def _error_pct(case) -> float:
    return 100 * (case.predicted["after"]["step_s"] / case.published_step_s - 1)


def _head_width(case) -> int:
    m = case.fields["model"]
    return m["hidden"] // m["heads"]


def bloom_spearman(cases, name_of) -> dict:
    """Rank correlation of predicted vs measured step over BLOOM's rows: all of them, the
    384-GPU cluster, and within each model shape (the topology choices alone);
    `name_of(case)` is the variant whose prediction counts."""
    rows = _bloom_rows(cases, name_of)

    def rho(group):
        return spearman([c.predicted[name_of(c)]["step_s"] for c in group],
                        [c.published_step_s for c in group])

    out = {"all": (len(rows), rho(rows))}
    full = [c for c in rows if c.fields.get("devices") == 384]
    out["384 GPUs"] = (len(full), rho(full))
    for g in sorted({c.group for c in full}):
        mine = [c for c in full if c.group == g]
        if len(mine) >= 4:
            out[f"384 GPUs, {g}"] = (len(mine), rho(mine))
    return out


def spearman_table(cases) -> tuple[str, dict]:
    """BLOOM's rank correlation before, after, and after without each of its mechanisms."""
    bloom = [c for c in cases if c.section == "1" and c.file == "more-published"]
    if not bloom:
        return "", {}
    columns = {"before": lambda c: "before", "after": lambda c: "after"}
    for m in applicable(bloom[0]):
        columns[f"-{mech_id(m)}"] = lambda c, m=m: variant_name(c, without(c, m))
    got = {name: bloom_spearman(cases, f) for name, f in columns.items()}
    if not got["after"]["all"][0]:
        return "", {}
    lines = ["", "BLOOM-176B sweep: Spearman rank correlation of predicted vs measured step "
             "(-Mk: after without mechanism k)",
             f"{'rows':34s} " + " ".join(f"{n:>7s}" for n in columns)]
    for k, (n, _) in got["after"].items():
        cells = [got[name].get(k, (0, None))[1] for name in columns]
        lines.append(f"{k + f' ({n})':34s} " + " ".join(
            f"{'-':>7s}" if x is None else f"{x:+7.3f}" for x in cells))
    doc = {name: {k: {"rows": n, "rho": r} for k, (n, r) in d.items()}
           for name, d in got.items()}
    return "\n".join(lines), doc


def alignment_table(cases) -> tuple[str, dict]:
    """BLOOM's after-errors by how its attention head width aligns: tensor-core GEMMs load
    16-byte vectors (cuBLAS documentation, 'Tensor Core Usage'), so a 16-bit batched GEMM
    of the unfused attention with a head width not a multiple of 8 runs a kernel of lower
    alignment, one that Flint does not price (no published A100 rate for it)."""
    groups: dict[str, list[float]] = {}
    for c in _bloom_rows(cases):
        width = _head_width(c)
        key = ("multiple of 8" if width % 8 == 0 else "even, not a multiple of 8"
               if width % 2 == 0 else "odd")
        groups.setdefault(key, []).append(_error_pct(c))
    if not groups:
        return "", {}
    lines = ["", "BLOOM-176B sweep by attention head width: after, signed error of the step",
             f"{'head width':28s} {'rows':>5s} {'median':>8s} {'<=10%':>6s} {'<=15%':>6s}"]
    doc = {}
    for key in ("multiple of 8", "even, not a multiple of 8", "odd"):
        errs = groups.get(key)
        if not errs:
            continue
        doc[key] = {"rows": len(errs), "median_pct": median(errs),
                    "within_10": sum(abs(e) <= 10 for e in errs),
                    "within_15": sum(abs(e) <= 15 for e in errs)}
        lines.append(f"{key:28s} {len(errs):5d} {median(errs):+7.1f}% "
                     f"{doc[key]['within_10']:6d} {doc[key]['within_15']:6d}")
    return "\n".join(lines), doc


DP_COLUMNS = (("one node", lambda c: c.fields["devices"] <= 8),
              ("DP 1-4", lambda c: c.fields["devices"] > 8 and _dp(c) <= 4),
              ("DP 8", lambda c: c.fields["devices"] > 8 and _dp(c) == 8),
              ("DP 12-48", lambda c: c.fields["devices"] > 8 and _dp(c) > 8))


def _dp(case) -> int:
    f = case.fields
    return f["devices"] // (f["tp"] * f["pp"])


def topology_table(cases) -> tuple[str, dict]:
    """BLOOM's after-errors of the rows whose head width is a multiple of 8 (so that the
    alignment above does not mix in), by tensor-parallel size (rows) and data-parallel
    size (columns), the rows run on one node apart: a one-node row crosses no network, so
    what it misses is compute or NVLink, not the fabric; a gap that widens with the
    data-parallel size at a fixed TP is the gradient reduction's."""
    rows = [c for c in _bloom_rows(cases) if _head_width(c) % 8 == 0]
    if not rows:
        return "", {}
    doc: dict = {}
    lines = ["", "BLOOM-176B sweep by TP and DP (head width a multiple of 8): after, median "
             "signed error of the step (rows)",
             f"{'TP':>4s} " + " ".join(f"{name:>14s}" for name, _ in DP_COLUMNS)]
    for tp in sorted({c.fields["tp"] for c in rows}):
        cells, doc[str(tp)] = [], {}
        for name, belongs in DP_COLUMNS:
            errs = [_error_pct(c) for c in rows if c.fields["tp"] == tp and belongs(c)]
            if errs:
                doc[str(tp)][name] = {"rows": len(errs), "median_pct": median(errs)}
                cells.append(f"{median(errs):+7.1f}% ({len(errs):2d})")
            else:
                cells.append("-")
        lines.append(f"{tp:4d} " + " ".join(f"{cell:>14s}" for cell in cells))
    return "\n".join(lines), doc
