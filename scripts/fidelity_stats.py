"""Statistics and tables of scripts/fidelity.py: error summaries per family, the
leave-one-family-out table and the rank correlation (no scipy: ranks written out)."""
from __future__ import annotations

WITHIN = (0.10, 0.15)


def median(values) -> float | None:
    xs = sorted(values)
    if not xs:
        return None
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


def ranks(values) -> list[float]:
    """1-based ranks; tied values share the average of the ranks they span."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(xs, ys) -> float | None:
    """Spearman's rank correlation: Pearson's correlation of the average ranks."""
    if len(xs) != len(ys) or len(xs) < 3:
        return None
    rx, ry = ranks(list(xs)), ranks(list(ys))
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    vx = sum((a - mx) ** 2 for a in rx)
    vy = sum((b - my) ** 2 for b in ry)
    return cov / (vx * vy) ** 0.5 if vx and vy else None


def errors(cases, variant: str) -> list[tuple[str, float]]:
    """(label, signed error of the step) for every case priced under `variant`."""
    out = []
    for c in cases:
        res = c.predicted.get(variant)
        if res and res.get("step_s") and c.published_step_s:
            out.append((c.label, res["step_s"] / c.published_step_s - 1))
    return out


def summary(cases, variant: str) -> dict:
    errs = errors(cases, variant)
    e = [x for _, x in errs]
    return {"rows": len(e), "median_signed": median(e),
            "median_abs": median(abs(x) for x in e),
            **{f"within_{int(w * 100)}": sum(abs(x) <= w for x in e) for w in WITHIN},
            "misses": [(label, x) for label, x in errs if abs(x) > WITHIN[0]]}


def _pct(x, width=7) -> str:
    return f"{'-':>{width}s}" if x is None else f"{x * 100:+{width - 1}.1f}%"


def _abs(x, width=6) -> str:
    return f"{'-':>{width}s}" if x is None else f"{x * 100:{width - 1}.1f}%"


def family_table(cases, title: str, show_misses: bool = True) -> tuple[str, dict]:
    """Per family: rows rebuilt, median signed / absolute step error, share within 10% and
    15%, before and after; the misses (after) listed with their error."""
    families = sorted({c.family for c in cases})
    w = max([62] + [len(f) for f in families])       # a family's name is never cut
    lines = [title, f"{'family':{w}s} {'rows':>4s} | {'before: med':>11s} {'|med|':>6s} "
             f"{'<=10%':>5s} {'<=15%':>5s} | {'after: med':>10s} {'|med|':>6s} {'<=10%':>5s} "
             f"{'<=15%':>5s}"]
    doc = {}
    for fam in families + ["ALL"]:
        mine = cases if fam == "ALL" else [c for c in cases if c.family == fam]
        b, a = summary(mine, "before"), summary(mine, "after")
        built = [c for c in mine if not c.reason]
        if not b["rows"] and not a["rows"]:
            if fam != "ALL":
                lines.append(f"{fam:{w}s} {0:4d} | not rebuildable ({len(mine)} rows; "
                             f"{len(built)} rebuildable not priced)")
            continue
        doc[fam] = {"before": b, "after": a}
        n = max(b["rows"], a["rows"])
        pct = lambda s, k: f"{s[k]:2d}/{s['rows']:<2d}"  # noqa: E731
        lines.append(f"{fam:{w}s} {n:4d} | {_pct(b['median_signed'], 11)} "
                     f"{_abs(b['median_abs'])} {pct(b, 'within_10'):>5s} "
                     f"{pct(b, 'within_15'):>5s} | {_pct(a['median_signed'], 10)} "
                     f"{_abs(a['median_abs'])} {pct(a, 'within_10'):>5s} "
                     f"{pct(a, 'within_15'):>5s}")
    if show_misses:
        for fam in families:
            misses = doc.get(fam, {}).get("after", {}).get("misses", [])
            if misses:
                shown = ", ".join(f"{label.split(' ')[0]} {x * 100:+.0f}%"
                                  for label, x in sorted(misses, key=lambda m: -abs(m[1])))
                lines.append(f"  misses (after, |error| > 10%) in {fam}: {len(misses)}: "
                             f"{shown}")
    return "\n".join(lines), doc
