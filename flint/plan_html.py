"""The plan as one self-contained HTML file (`flint plan --report plan.html`): the ranked
table, the Pareto plots, the winner's timeline (each pipeline stage's compute and
communication streams; the bubble is the idle compute lane), its memory split and, with
`--what-if`, the sensitivity chart. Charts are inline SVG (flint.plan_svg); the only script
is a self-check that logs an error to the console if a chart came out empty, which the
headless-browser check (scripts/check_plan_html.py) turns into a failure. Nothing is
fetched: the file opens offline. The page holds no wall times, so one plan gives one file.
"""
from __future__ import annotations

from html import escape

from flint.plan_explain import GIB, counts_line, layout, pareto, seconds, size
from flint.plan_svg import scatter, stacked_bar, svg, timeline, tornado

MAX_STAGES_SHOWN = 8
STYLE = """
body{font-family:sans-serif;margin:24px;color:#222;max-width:1100px}
h1{font-size:20px}h2{font-size:16px;margin-top:28px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:12px}td,th{padding:3px 8px;border-bottom:1px solid #eee;
text-align:right;white-space:nowrap}td.l,th.l{text-align:left}tr.win{background:#fdecec}
.row{display:flex;gap:16px;flex-wrap:wrap}.note{color:#666;font-size:12px}
"""
SELF_CHECK = """<script>
document.addEventListener("DOMContentLoaded", function () {
  var plots = document.querySelectorAll("svg.plot");
  if (plots.length === 0) { console.error("plan report: no plots"); }
  plots.forEach(function (p) {
    if (p.childElementCount === 0) { console.error("plan report: empty plot " + p.dataset.plot); }
  });
});
</script>"""


def _table(rows: list, winner_key) -> str:
    head = ("#", "layout", "devices", "step time", "tokens/s/GPU", "MFU", "memory",
            "exposed comm", "bubble", "closed form")
    out = ["<table><tr>" + "".join(f'<th class="{"l" if h == "layout" else ""}">{h}</th>'
                                   for h in head) + "</tr>"]
    for i, r in enumerate(rows, 1):
        cls = ' class="win"' if r["key"] == winner_key else ""
        if r["status"] != "ok":
            out.append(f"<tr{cls}><td>{i}</td><td class=\"l\">{escape(layout(r))}</td>"
                       f"<td>{r['devices']}</td><td colspan=\"7\" class=\"l\">"
                       f"{escape(r['status'])}: {escape(str(r.get('error', ''))[:120])}</td></tr>")
            continue
        cells = [str(i), escape(layout(r)), str(r["devices"]),
                 seconds(r["step_time_s"]), f"{r['tokens_per_s_per_device']:,.0f}",
                 f"{100 * r['mfu']:.1f}%", size(r["memory_bytes"]) + (" OOM" if r["oom"] else ""),
                 seconds(r["exposed_communication_s"]), f"{100 * r['bubble_fraction']:.1f}%",
                 seconds(r["analytic"]["step_s"])]
        out.append(f"<tr{cls}>" + "".join(
            f'<td class="{"l" if j == 1 else ""}">{c}</td>' for j, c in enumerate(cells)) + "</tr>")
    return "".join(out) + "</table>"


def _pareto_plots(rows: list, winner) -> str:
    ok = [r for r in rows if r["status"] == "ok"]
    fronts = pareto(rows)
    wkey = winner["key"] if winner else None

    def pts(axis, scale):
        return [(r[axis] / scale, r["step_time_s"] * 1e3,
                 "winner" if r["key"] == wkey else "oom" if r["oom"] else "fits",
                 f"{layout(r)}: {seconds(r['step_time_s'])}, {size(r['memory_bytes'])}"
                 + (" (out of memory)" if r["oom"] else ""))
                for r in ok]

    devices = sorted({r["devices"] for r in ok})
    log_x = bool(devices) and devices[-1] >= 4 * devices[0]
    a = scatter(pts("devices", 1), [(r["devices"], r["step_time_s"] * 1e3)
                                    for r in fronts["devices"]],
                "devices", "step time (ms)", "pareto-devices", log_x=log_x)
    b = scatter(pts("memory_bytes", GIB), [(r["memory_bytes"] / GIB, r["step_time_s"] * 1e3)
                                           for r in fronts["memory"]],
                "memory per device (GiB)", "step time (ms)", "pareto-memory")
    return f'<div class="row">{a}{b}</div>'


def timeline_lanes(tl, max_stages: int = MAX_STAGES_SHOWN) -> tuple[list, float]:
    """(lanes, end) of a predicted timeline: per shown stage a compute lane and a
    communication lane, boxes of one kind merged when they touch at pixel scale."""
    if tl is None:
        return [], 0.0
    end = tl.step_time or 1.0
    devices = sorted(set(tl.device)) if tl.device else [0]
    if len(devices) > max_stages:
        step = (len(devices) - 1) / (max_stages - 1)
        devices = sorted({devices[round(i * step)] for i in range(max_stages)})
    boxes: dict = {}
    dev_of = tl.device or [0] * len(tl.start)
    for node, s, f, stream, d in zip(tl.graph.nodes, tl.start, tl.finish, tl.stream, dev_of):
        if d not in devices or f <= s:
            continue
        if stream == "compute":
            name = node.name
            kind = ("backward" if "bwd" in name else "forward" if "fwd" in name
                    else "collective" if node.op_class == "collective" else "other")
            lane = (d, "compute")
        else:
            kind = "p2p" if stream.startswith("p2p") else "collective"
            lane = (d, "communication")
        boxes.setdefault(lane, []).append((s, f, kind))
    gap = end / 1500
    lanes = []
    for d in devices:
        for which in ("compute", "communication"):
            merged = []
            for s, f, kind in sorted(boxes.get((d, which), [])):
                if merged and merged[-1][2] == kind and s - merged[-1][1] <= gap:
                    merged[-1][1] = max(merged[-1][1], f)
                    merged[-1][3] += 1
                else:
                    merged.append([s, f, kind, 1])
            lanes.append((f"stage {d} {which}",
                          [(s, f, k, f"{k}: {n} ops, {seconds(f - s)}")
                           for s, f, k, n in merged]))
    return lanes, end


def _memory(row: dict) -> str:
    split = row.get("memory_split") or {}
    parts = [("parameters", split.get("parameters", 0.0), "#4c78a8"),
             ("optimizer state", split.get("optimizer_state", 0.0), "#f58518"),
             ("inputs", split.get("inputs", 0.0), "#72b7b2"),
             ("activations, gradients, workspace (peak)", split.get("temporaries", 0.0),
              "#54a24b")]
    parts = [p for p in parts if p[1] > 0]
    return stacked_bar(parts, row["memory_capacity_bytes"], "memory")


def _sensitivity(rows: list) -> str:
    data = [(f"{r['name']} ({r['baseline']:.4g} {r['unit']})",
             [(f"{c['value']:.4g} {r['unit']}", c["change"]) for c in r["points"]])
            for r in rows]
    chart = tornado(data, "sensitivity")
    head = "<tr><th class=\"l\">knob</th><th>baseline</th><th>point</th><th>best step</th>" \
           "<th>change</th><th class=\"l\">plan there</th><th>elasticity</th></tr>"
    body = []
    for r in rows:
        for i, c in enumerate(r["points"]):
            step = seconds(c["step_time_s"]) if c["step_time_s"] else "-"
            change = f"{100 * c['change']:+.1f}%" if c["change"] is not None else escape(c["note"])
            plan = "(same)" if c["winner"] == r["baseline_winner"] else escape(c["winner"] or "-")
            el = f"{r['elasticity']:+.3f}" if i == 0 and r["elasticity"] is not None else ""
            name = escape(r["name"]) if i == 0 else ""
            base = f"{r['baseline']:.4g} {r['unit']}" if i == 0 else ""
            body.append(f"<tr><td class=\"l\">{name}</td><td>{base}</td>"
                        f"<td>{c['value']:.4g} {r['unit']}</td><td>{step}</td><td>{change}</td>"
                        f"<td class=\"l\">{plan}</td><td>{el}</td></tr>")
    return chart + "<table>" + head + "".join(body) + "</table>"


def render_html(doc: dict, timeline_data=None, sensitivity_rows=None) -> str:
    """The page. `doc`: flint.plan_explain.report(...); `timeline_data`: the winner's
    predicted Timeline (predict(..., timeline=True)); `sensitivity_rows`: the co-design
    table (flint.plan_whatif.sensitivity)."""
    req = doc["request"]
    model = req["model"] if isinstance(req["model"], str) else "custom model"
    title = (f"flint plan: {model} on {', '.join(map(str, req['devices']))} x "
             f"{req['hardware']}")
    winner = doc["winner"]
    parts = [f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
             f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>",
             f"<h1>{escape(title)}</h1>",
             f"<p>sequence {req['seq_len']} tokens, global batch {req['global_batch']} "
             f"sequences, precisions {escape(', '.join(req['precision']))}"
             + (f", what-ifs {escape('; '.join(req['what_if']))}" if req["what_if"] else "")
             + "</p>",
             f"<p class=\"note\">{escape(counts_line(doc['counts']))}; stopped: "
             f"{escape(doc['stop_reason'])}</p>",
             "<h2>Why</h2><ul>" + "".join(f"<li>{escape(x)}</li>" for x in doc["why"]) + "</ul>",
             "<h2>Ranked layouts (predicted by flint.engine.predict)</h2>",
             _table(doc["top"], winner["key"] if winner else None),
             "<h2>Pareto fronts</h2><p class=\"note\">circles fit in memory, crosses do "
             "not; the red circle is the winner, the orange line the front.</p>",
             _pareto_plots(doc["priced"], winner)]
    if winner:
        lanes, end = timeline_lanes(timeline_data)
        parts.append(f"<h2>The winner's timeline ({escape(layout(winner))})</h2>")
        parts.append(timeline(lanes, end, "timeline") if lanes else
                     svg(['<text x="20" y="30">no timeline</text>'], 400, 50, "timeline"))
        parts.append("<h2>The winner's memory per device</h2>" + _memory(winner))
    if sensitivity_rows:
        parts.append("<h2>Hardware co-design: sensitivity of the best step time</h2>")
        parts.append(_sensitivity(sensitivity_rows))
    parts.append("<p class=\"note\">written by flint plan: one file, no network needed.</p>")
    parts.append(SELF_CHECK + "</body></html>")
    return "\n".join(parts) + "\n"
