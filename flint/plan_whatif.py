"""Hardware co-design: re-plan the parallelism at each hardware point and report which
knob moves the best step time most.

    points = knob_points(spec, ["nic_bandwidth", "hbm_bandwidth=4.8TB/s,6.7TB/s"])
    study = codesign(request, points, budget)        # the plan at every point
    study.sensitivity                                  # one row per knob, largest first

A knob is a spec figure a what-if may set (peak FLOP/s per dtype, HBM bandwidth and
capacity, NVLink domain size and bandwidth, NIC bandwidth, spine oversubscription) or the
device count. Each point is a whole plan under that what-if (a faster network changes
the best layout), its search seeded with what predict said at the baseline. Sensitivity
is the log-log slope of the best step time against the knob (elasticity: -1 means
doubling the knob halves the step), from the points on each side of the baseline.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field, replace

from flint.errors import FlintError

# knob -> (what the spec calls it, how a value is written for a what-if, its unit)
KNOBS = {
    "peak_bf16": ("bf16 peak", lambda v: f"{v / 1e12:.6g}TFLOP/s", 1e12, "TFLOP/s"),
    "peak_fp8": ("fp8 peak", lambda v: f"{v / 1e12:.6g}TFLOP/s", 1e12, "TFLOP/s"),
    "hbm_bandwidth": ("HBM bandwidth", lambda v: f"{v / 1e12:.6g}TB/s", 1e12, "TB/s"),
    "hbm_capacity": ("HBM capacity", lambda v: f"{v / 1e9:.6g}GB", 1e9, "GB"),
    "scale_up_bandwidth": ("NVLink bandwidth", lambda v: f"{v / 1e9:.6g}GB/s", 1e9, "GB/s"),
    "scale_up_domain": ("NVLink domain", lambda v: f"{int(v)}", 1, "GPUs"),
    "nic_bandwidth": ("NIC bandwidth", lambda v: f"{v * 8 / 1e9:.6g}Gb/s", 1e9 / 8, "Gb/s"),
    "oversubscription": ("spine oversubscription", lambda v: f"{v:.6g}", 1, ":1"),
    "devices": ("device count", lambda v: f"{int(v)}", 1, "GPUs"),
}
DEFAULT_FACTORS = (0.5, 2.0)
# a factor that makes no sense for a knob (no fabric below 1:1; domains are whole GPUs)
ONE_SIDED = {"oversubscription": (2.0, 4.0)}
ALL = ("peak_bf16", "hbm_bandwidth", "hbm_capacity", "scale_up_bandwidth",
       "scale_up_domain", "nic_bandwidth", "oversubscription", "devices")


@dataclass(frozen=True)
class Point:
    knob: str
    value: float               # in SI units (devices: a count)
    text: str                  # as a what-if writes it


@dataclass
class Study:
    baseline: object           # PlanResult
    points: list               # (Point, PlanResult)
    sensitivity: list = field(default_factory=list)


def baseline_value(knob: str, spec, devices: int) -> float:
    if knob == "devices":
        return float(devices)
    if knob.startswith("peak_"):
        dtype = knob[5:]
        if dtype not in spec.peak_flops:
            raise FlintError(f"--what-if {knob}: {spec.name} lists no {dtype} peak")
        return spec.peak_flops[dtype]
    return float(getattr(spec, knob))


def knob_points(spec, items, devices: int, factors=DEFAULT_FACTORS) -> list[Point]:
    """`items`: "KNOB" (the factors around the spec's value), "KNOB=V1,V2" (values as a
    what-if writes them) or "all"."""
    from flint.hardware_models.spec import apply_overrides

    out: list[Point] = []
    names = []
    for item in items:
        names += list(ALL) if item.strip() == "all" else [item]
    for item in names:
        knob, eq, values = (s.strip() for s in item.partition("="))
        if knob not in KNOBS:
            from flint.schema import did_you_mean

            hint = did_you_mean(knob, list(KNOBS)) or f" (knobs: {', '.join(KNOBS)})"
            raise FlintError(f"--what-if {knob!r}: not a co-design knob{hint}")
        base = baseline_value(knob, spec, devices)
        if eq:
            for text in filter(None, (v.strip() for v in values.split(","))):
                if knob == "devices":
                    try:
                        value = float(int(text))
                    except ValueError:
                        raise FlintError(f"--what-if devices: {text!r} is not a count") from None
                else:
                    changed = apply_overrides(spec, [f"{knob}={text}"])
                    value = baseline_value(knob, changed, devices)
                out.append(Point(knob, value, text))
            continue
        for f in ONE_SIDED.get(knob, factors):
            value = base * f
            if knob in ("scale_up_domain", "devices"):
                value = float(max(1, round(value)))
            if value == base:
                continue
            out.append(Point(knob, value, KNOBS[knob][1](value)))
    seen, unique = set(), []
    for p in out:
        if (p.knob, p.value) not in seen:
            seen.add((p.knob, p.value))
            unique.append(p)
    return unique


def point_request(request, p: Point):
    if p.knob == "devices":
        return replace(request, devices=(int(p.value),))
    return replace(request, what_if=tuple(request.what_if) + (f"{p.knob}={p.text}",))


def codesign(request, points: list, budget, point_budget=None, on_event=None, **search_kw):
    """The baseline plan and one plan per point (`point_budget`: each point's, default a
    smaller one: at most 8 priced, the baseline's stage programs and 2 more)."""
    from flint.plan_search import search

    on_event = on_event or (lambda kind, info: None)
    base = search(request, budget, on_event=on_event, **search_kw)
    seed = base.learned
    point_budget = point_budget or replace(budget, candidates=min(budget.candidates, 8),
                                           programs=min(budget.programs, 2), min_priced=3)
    results = []
    for i, p in enumerate(points):
        on_event("point", {"index": i, "total": len(points), "point": p})
        try:
            res = search(point_request(request, p), point_budget, on_event=on_event,
                         corrections=copy.deepcopy(seed) if seed else None,
                         free_programs=base.programs, **search_kw)
        except FlintError as e:       # e.g. nothing fits at half the HBM: a result too
            res = e
        results.append((p, res))
    study = Study(base, results)
    study.sensitivity = sensitivity(request, base, results)
    return study


def sensitivity(request, base, results) -> list[dict]:
    """One row per knob: the points below and above, the best step at each, the winner's
    layout there, and the elasticity; largest effect first."""
    from flint.hardware_models.spec import load_spec
    from flint.plan_explain import layout

    spec = load_spec(request.hardware, list(request.what_if))
    t0 = base.winner["step_time_s"] if base.winner else None
    rows = []
    for knob in dict.fromkeys(p.knob for p, _ in results):
        v0 = baseline_value(knob, spec, request.devices[0])
        mine = sorted(((p, r) for p, r in results if p.knob == knob), key=lambda x: x[0].value)
        cells, slopes = [], []
        for p, r in mine:
            ok = not isinstance(r, FlintError) and r.winner is not None
            t = r.winner["step_time_s"] if ok else None
            cell = {"value": p.value, "text": p.text, "step_time_s": t,
                    "change": (t / t0 - 1) if (t and t0) else None,
                    "winner": layout(r.winner) if ok else None,
                    "note": "" if ok else (str(r) if isinstance(r, FlintError)
                                           else "no layout fits")}
            cells.append(cell)
            if t and t0 and p.value > 0 and v0 > 0 and p.value != v0:
                slopes.append(math.log(t / t0) / math.log(p.value / v0))
        unit = KNOBS[knob][2]
        effect = max((abs(c["change"]) for c in cells if c["change"] is not None), default=0.0)
        rows.append({"knob": knob, "name": KNOBS[knob][0], "unit": KNOBS[knob][3],
                     "baseline": v0 / unit, "points": [{**c, "value": c["value"] / unit}
                                                       for c in cells],
                     "elasticity": sum(slopes) / len(slopes) if slopes else None,
                     "largest_change": effect,
                     "baseline_winner": layout(base.winner) if base.winner else None})
    rows.sort(key=lambda r: (-r["largest_change"], r["knob"]))
    return rows


def render_sensitivity(rows: list, console) -> None:
    from rich.markup import escape
    from rich.table import Table

    from flint.plan_explain import seconds, wide

    table = Table(title="co-design sensitivity (best step time, parallelism re-planned at "
                        "each point)", title_justify="left")
    for col in ("knob", "baseline", "point", "best step", "change", "plan there",
                "elasticity"):
        table.add_column(col, justify="left" if col in ("knob", "plan there") else "right",
                         no_wrap=True)
    for r in rows:
        for i, c in enumerate(r["points"]):
            same = c["winner"] == r["baseline_winner"]
            table.add_row(escape(r["name"]) if i == 0 else "",
                          f"{r['baseline']:.4g} {r['unit']}" if i == 0 else "",
                          f"{c['value']:.4g} {r['unit']}",
                          seconds(c["step_time_s"]) if c["step_time_s"] else "-",
                          f"{100 * c['change']:+.1f}%" if c["change"] is not None else
                          escape(c["note"][:40]),
                          "(same)" if same else escape(c["winner"] or "-"),
                          f"{r['elasticity']:+.3f}" if (i == 0 and r["elasticity"] is not None)
                          else "")
    wide(console).print(table)
