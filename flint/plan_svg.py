"""Inline SVG charts for the plan report (no scripts, no network: a page that opens
anywhere). Every text that reaches the markup is escaped.

    scatter(points, fronts, "devices", "step time (ms)", log_x=True)
    stacked_bar(parts, capacity)       # memory split against the capacity
    tornado(rows)                       # sensitivity: change of the best step per knob
    timeline(lanes, t_end)              # per-stage compute and communication streams
"""
from __future__ import annotations

import math
from html import escape

PALETTE = {"fits": "#1f77b4", "oom": "#9a9a9a", "winner": "#d62728", "front": "#ff7f0e",
           "forward": "#4c78a8", "backward": "#54a24b", "recompute": "#9ecae9",
           "collective": "#f58518", "p2p": "#b279a2", "other": "#72b7b2", "idle": "#f2f2f2",
           "low": "#54a24b", "high": "#e45756", "capacity": "#333333"}
FONT = 'font-family="sans-serif" font-size="11"'


def _num(v: float) -> str:
    return f"{v:.1f}"


def _ticks(lo: float, hi: float, log: bool) -> list[float]:
    if log:
        a, b = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
        out = []
        for e in range(a, b + 1):
            for m in (1, 2, 5):
                v = m * 10 ** e
                if lo <= v <= hi:
                    out.append(v)
        return out or [lo, hi]
    step = 10 ** math.floor(math.log10(max(hi - lo, 1e-12)))
    for m in (1, 2, 5, 10):
        if (hi - lo) / (step * m) <= 6:
            step *= m
            break
    start = math.ceil(lo / step) * step
    return [start + i * step for i in range(int((hi - start) / step) + 1)]


def _label(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 10 else f"{v:.3g}"


class _Axes:
    def __init__(self, xs, ys, log_x, log_y, w, h, pad=(56, 16, 20, 40)):
        self.w, self.h, (self.l, self.r, self.t, self.b) = w, h, pad
        self.log_x, self.log_y = log_x, log_y
        self.x0, self.x1 = self._span(xs, log_x)
        self.y0, self.y1 = self._span(ys, log_y)

    @staticmethod
    def _span(vs, log):
        lo, hi = min(vs), max(vs)
        if log:
            lo, hi = lo / 1.15, hi * 1.15
        else:
            pad = (hi - lo) * 0.08 or abs(hi) * 0.1 or 1.0
            lo, hi = lo - pad, hi + pad
        return lo, hi

    def _f(self, v, lo, hi, log):
        if log:
            return (math.log(v) - math.log(lo)) / (math.log(hi) - math.log(lo))
        return (v - lo) / (hi - lo)

    def x(self, v):
        return self.l + self._f(v, self.x0, self.x1, self.log_x) * (self.w - self.l - self.r)

    def y(self, v):
        return self.h - self.b - self._f(v, self.y0, self.y1, self.log_y) * (
            self.h - self.t - self.b)

    def frame(self, x_label, y_label) -> list[str]:
        out = [f'<rect x="{self.l}" y="{self.t}" width="{self.w - self.l - self.r}" '
               f'height="{self.h - self.t - self.b}" fill="none" stroke="#999"/>']
        for v in _ticks(self.x0, self.x1, self.log_x):
            x = _num(self.x(v))
            out.append(f'<line x1="{x}" x2="{x}" y1="{self.t}" y2="{self.h - self.b}" '
                       f'stroke="#eee"/><text x="{x}" y="{self.h - self.b + 14}" '
                       f'text-anchor="middle" {FONT}>{_label(v)}</text>')
        for v in _ticks(self.y0, self.y1, self.log_y):
            y = _num(self.y(v))
            out.append(f'<line x1="{self.l}" x2="{self.w - self.r}" y1="{y}" y2="{y}" '
                       f'stroke="#eee"/><text x="{self.l - 4}" y="{y}" text-anchor="end" '
                       f'dominant-baseline="middle" {FONT}>{_label(v)}</text>')
        out.append(f'<text x="{(self.l + self.w - self.r) / 2}" y="{self.h - 6}" '
                   f'text-anchor="middle" {FONT}>{escape(x_label)}</text>')
        out.append(f'<text transform="translate(12,{(self.t + self.h - self.b) / 2}) '
                   f'rotate(-90)" text-anchor="middle" {FONT}>{escape(y_label)}</text>')
        return out


def svg(body: list[str], w: int, h: int, name: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="plot" data-plot="{escape(name)}" '
            f'width="{w}" height="{h}" viewBox="0 0 {w} {h}">' + "".join(body) + "</svg>")


def scatter(points: list, front: list, x_label: str, y_label: str, name: str,
            log_x: bool = False, log_y: bool = False, w: int = 520, h: int = 330) -> str:
    """`points`: (x, y, kind, title) with kind fits | oom | winner; `front`: (x, y)."""
    if not points:
        return svg([f'<text x="20" y="30" {FONT}>nothing priced</text>'], w, 60, name)
    xs = [p[0] for p in points] + [p[0] for p in front]
    ys = [p[1] for p in points] + [p[1] for p in front]
    ax = _Axes(xs, ys, log_x, log_y, w, h)
    body = ax.frame(x_label, y_label)
    if len(front) > 1:
        path = " ".join(f"{_num(ax.x(x))},{_num(ax.y(y))}" for x, y in front)
        body.append(f'<polyline points="{path}" fill="none" stroke="{PALETTE["front"]}" '
                    f'stroke-width="2"/>')
    for x, y, kind, title in sorted(points, key=lambda p: p[2] == "winner"):
        cx, cy = _num(ax.x(x)), _num(ax.y(y))
        tip = f"<title>{escape(title)}</title>"
        if kind == "oom":
            body.append(f'<g stroke="{PALETTE["oom"]}" stroke-width="1.5">{tip}'
                        f'<line x1="{float(cx) - 4}" y1="{float(cy) - 4}" x2="{float(cx) + 4}" '
                        f'y2="{float(cy) + 4}"/><line x1="{float(cx) - 4}" y1="{float(cy) + 4}" '
                        f'x2="{float(cx) + 4}" y2="{float(cy) - 4}"/></g>')
        else:
            r = 7 if kind == "winner" else 5
            body.append(f'<circle cx="{cx}" cy="{cy}" r="{r}" fill="{PALETTE[kind]}" '
                        f'stroke="#fff" stroke-width="1">{tip}</circle>')
    return svg(body, w, h, name)


def _bytes(b: float) -> str:
    return f"{b / 2**30:.1f} GiB" if b >= 2**30 / 10 else f"{b / 2**20:.1f} MiB"


def _duration(s: float) -> str:
    return f"{s:.3g} s" if s >= 1 else f"{s * 1e3:.3g} ms" if s >= 1e-3 else f"{s * 1e6:.3g} us"


def stacked_bar(parts: list, capacity: float, name: str, w: int = 620, h: int = 96) -> str:
    """`parts`: (label, bytes, color) stacked left to right, a line at the capacity."""
    total = sum(v for _, v, _ in parts)
    top = max(total, capacity) * 1.05 or 1.0
    scale = (w - 40) / top
    body, x = [], 20.0
    for label, v, color in parts:
        width = v * scale
        body.append(f'<rect x="{_num(x)}" y="16" width="{_num(width)}" height="30" '
                    f'fill="{color}"><title>{escape(label)}: {_bytes(v)}</title></rect>')
        x += width
    cx = _num(20 + capacity * scale)
    body.append(f'<line x1="{cx}" x2="{cx}" y1="8" y2="54" stroke="{PALETTE["capacity"]}" '
                f'stroke-width="2" stroke-dasharray="4 2"/><text x="{cx}" y="66" '
                f'text-anchor="middle" {FONT}>capacity {_bytes(capacity)}</text>')
    lx = 20
    for label, v, color in parts:
        text = f"{label} {_bytes(v)}"
        body.append(f'<rect x="{lx}" y="76" width="10" height="10" fill="{color}"/>'
                    f'<text x="{lx + 14}" y="85" {FONT}>{escape(text)}</text>')
        lx += 14 + 6.2 * len(text) + 12
    return svg(body, max(w, int(lx)), h, name)


def tornado(rows: list, name: str, w: int = 620) -> str:
    """`rows`: (label, [(point label, change)]) with change a fraction of the baseline
    step; bars to the left speed the step up, to the right slow it down."""
    changes = [abs(c) for _, pts in rows for _, c in pts if c is not None]
    if not changes:
        return svg([f'<text x="20" y="30" {FONT}>no co-design point priced</text>'], w, 60, name)
    span = max(changes) * 1.1 or 0.01
    row_h, left = 26, 170
    h = 30 + row_h * len(rows)
    mid = left + (w - left - 20) / 2
    scale = (w - left - 20) / 2 / span
    body = [f'<line x1="{mid}" x2="{mid}" y1="10" y2="{h - 10}" stroke="#666"/>',
            f'<text x="{mid}" y="{h - 1}" text-anchor="middle" {FONT}>best step time change '
            f'(left faster, right slower; +/-{100 * span:.0f}% at the edges)</text>']
    for i, (label, pts) in enumerate(rows):
        y = 14 + i * row_h
        body.append(f'<text x="{left - 6}" y="{y + 10}" text-anchor="end" {FONT}>'
                    f'{escape(label)}</text>')
        for j, (plabel, c) in enumerate(pts):
            if c is None:
                continue
            x0, x1 = sorted((mid, mid + c * scale))
            color = PALETTE["low"] if c < 0 else PALETTE["high"]
            width = _num(max(x1 - x0, 1))
            body.append(f'<rect x="{_num(x0)}" y="{y + (j % 2) * 9}" width="{width}"'
                        f' height="8" fill="{color}"><title>{escape(plabel)}: '
                        f'{100 * c:+.1f}%</title></rect>')
    return svg(body, w, h, name)


def timeline(lanes: list, t_end: float, name: str, w: int = 1000) -> str:
    """`lanes`: (label, [(start s, end s, kind, title)]); kinds colour the boxes; idle
    time shows the lane's background (the pipeline bubble on compute lanes)."""
    left, lane_h = 120, 16
    h = 40 + lane_h * len(lanes)
    scale = (w - left - 10) / (t_end or 1.0)
    body = []
    for i, (label, boxes) in enumerate(lanes):
        y = 10 + i * lane_h
        body.append(f'<rect x="{left}" y="{y}" width="{w - left - 10}" height="{lane_h - 3}" '
                    f'fill="{PALETTE["idle"]}"/><text x="{left - 6}" y="{y + 10}" '
                    f'text-anchor="end" {FONT}>{escape(label)}</text>')
        for start, end, kind, title in boxes:
            body.append(f'<rect x="{_num(left + start * scale)}" y="{y}" '
                        f'width="{_num(max((end - start) * scale, 0.6))}" height="{lane_h - 3}" '
                        f'fill="{PALETTE.get(kind, PALETTE["other"])}"><title>'
                        f'{escape(title)}</title></rect>')
    for v in _ticks(0, t_end, False):
        x = _num(left + v * scale)
        body.append(f'<text x="{x}" y="{h - 12}" text-anchor="middle" {FONT}>'
                    f'{_duration(v) if v else "0"}</text>')
    lx = left
    for kind in ("forward", "backward", "collective", "p2p", "other"):
        body.append(f'<rect x="{lx}" y="{h - 9}" width="9" height="9" fill="{PALETTE[kind]}"/>'
                    f'<text x="{lx + 12}" y="{h - 1}" {FONT}>{kind}</text>')
        lx += 90
    return svg(body, w, h + 4, name)
