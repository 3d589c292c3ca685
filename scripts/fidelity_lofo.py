"""Leave-one-family-out: does each run-level mechanism (scripts/fidelity_families.py)
also improve the families it was not developed on?

Two tables:
- mechanism x family: the median |step error| of every family a mechanism changes, with
  the mechanism (all of the family's mechanisms: "after") and without it (the others
  only). Verdict: it *stays* if it worsens no family other than the one it was developed
  on and improves at least one of them; *untested* if it changes no other family;
  *dropped* if it worsens one; *not shown to transfer* if it changes none by more than
  TOLERANCE.
- hold-out: for each family F, the mechanisms chosen on the evidence of the other
  families alone (kept unless their pooled median |error| is worse with it; a mechanism
  no other family tests stays, on its public source), and F's median |error| under that
  choice next to before and after: what F would get if it had never been seen.
"""
from __future__ import annotations

from fidelity_families import MECHANISMS, applicable, available
from fidelity_stats import median

TOLERANCE = 0.005        # medians closer than half a point are "the same"


def mech_id(m) -> str:
    return f"M{MECHANISMS.index(m) + 1}"


def variant_name(case, mechs) -> str:
    mine = applicable(case)
    if not mechs:
        return "before"
    if set(mechs) == set(mine):
        return "after"
    return "with " + "+".join(sorted(mech_id(m) for m in mechs))


def without(case, m) -> list:
    return [x for x in applicable(case) if x is not m]


def _abs_errors(cases, name_of) -> list[float]:
    out = []
    for c in cases:
        res = c.predicted.get(name_of(c))
        if res and res.get("step_s") and c.published_step_s:
            out.append(abs(res["step_s"] / c.published_step_s - 1))
    return out


def changes(case, m) -> bool:
    """Whether removing `m` changes the case's run (the runner records the run keys) and
    both runs were priced."""
    other = variant_name(case, without(case, m))
    priced = all(case.predicted.get(v, {}).get("step_s") for v in ("after", other))
    return priced and case.runs.get("after") != case.runs.get(other)


def mechanism_table(cases) -> tuple[str, list]:
    built = [c for c in cases if not c.reason]
    lines = ["", "Leave-one-family-out, by mechanism: median |step error| with -> without "
             "(families it changes; * = developed on)"]
    doc = []
    for m in MECHANISMS:
        head = f"{mech_id(m)} {m.name}"
        if not available(m):
            why = (m.source if not m.assign else f"blocked: {m.blocked}" if m.blocked
                   else f"needs TrainingRun.{m.needs}")
            lines.append(f"{head}: not evaluated ({why})")
            doc.append({"id": mech_id(m), "name": m.name, "verdict": "not evaluated"})
            continue
        fams: dict[str, list] = {}
        for c in built:
            if m in applicable(c) and changes(c, m):
                fams.setdefault(c.family, []).append(c)
        cells, better, worse = [], 0, 0
        for fam, mine in sorted(fams.items()):
            w = median(_abs_errors(mine, lambda c: "after"))
            wo = median(_abs_errors(mine, lambda c: variant_name(c, without(c, m))))
            if w is None or wo is None:
                continue
            held = fam != m.developed_on
            if held:
                better += w < wo - TOLERANCE
                worse += w > wo + TOLERANCE
            cells.append({"family": fam, "rows": len(mine), "with": w, "without": wo,
                          "developed_on": not held})
        verdict = ("untested (changes no other family)" if not any(
            not x["developed_on"] for x in cells) else "stays" if better and not worse
            else "dropped: worsens a held-out family" if worse
            else "not shown to transfer (no held-out family improves)")
        lines.append(f"{head}: {verdict}; held-out families improved {better}, worse "
                     f"{worse} of {sum(not x['developed_on'] for x in cells)}")
        for x in cells:
            lines.append(f"    {'*' if x['developed_on'] else ' '} {x['family'][:64]:64s} "
                         f"{x['rows']:4d} rows  {x['with'] * 100:5.1f}% -> "
                         f"{x['without'] * 100:5.1f}%")
        doc.append({"id": mech_id(m), "name": m.name, "source": m.source,
                    "developed_on": m.developed_on, "verdict": verdict, "families": cells})
    return "\n".join(lines), doc


def chosen_without(cases, family: str) -> list:
    """The mechanisms kept on the evidence of every family but `family`."""
    built = [c for c in cases if not c.reason and c.family != family]
    keep = []
    for m in MECHANISMS:
        if not available(m):
            continue
        mine = [c for c in built if m in applicable(c) and changes(c, m)]
        w = median(_abs_errors(mine, lambda c: "after"))
        wo = median(_abs_errors(mine, lambda c: variant_name(c, without(c, m))))
        if w is None or wo is None or w <= wo + TOLERANCE:
            keep.append(m)
    return keep


def holdout_sets(cases) -> dict:
    """family -> the mechanisms chosen without it (only families with mechanisms)."""
    out = {}
    for fam in sorted({c.family for c in cases if not c.reason}):
        mine = [c for c in cases if c.family == fam and not c.reason]
        if any(applicable(c) for c in mine):
            out[fam] = chosen_without(cases, fam)
    return out


def holdout_table(cases, sets: dict) -> tuple[str, list]:
    lines = ["", "Leave-one-family-out, by held-out family: median |step error| before / "
             "after / with the mechanisms the other families keep",
             f"{'held-out family':64s} {'rows':>4s} {'before':>7s} {'after':>7s} "
             f"{'LOFO':>7s}  kept"]
    doc = []
    for fam, keep in sets.items():
        mine = [c for c in cases if c.family == fam and not c.reason
                and c.predicted.get("after", {}).get("step_s")]
        b = median(_abs_errors(mine, lambda c: "before"))
        a = median(_abs_errors(mine, lambda c: "after"))
        lo = median(_abs_errors(mine, lambda c: variant_name(
            c, [m for m in applicable(c) if m in keep])))
        kept = [mech_id(m) for m in keep if any(m in applicable(c) for c in mine)]
        fmt = lambda x: f"{'-':>7s}" if x is None else f"{x * 100:6.1f}%"  # noqa: E731
        lines.append(f"{fam[:64]:64s} {len(mine):4d} {fmt(b)} {fmt(a)} {fmt(lo)}  "
                     f"{' '.join(kept) or '-'}")
        doc.append({"family": fam, "rows": len(mine), "before": b, "after": a, "lofo": lo,
                    "kept": kept})
    return "\n".join(lines), doc
