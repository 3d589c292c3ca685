"""What a plan says: the ranked table, the winner's "why" and what the runner-up loses on,
and the Pareto fronts (step time vs devices, vs memory per device).

Every figure is one of predict's (flint.plan_price rows): a row's step splits into the
pipeline bubble (bubble_fraction x step), exposed communication, and compute-stream time,
which the op classes' shares divide into GEMMs, attention, memory-bound kernels and the
collectives Megatron-Core runs on the compute stream (tensor/context/expert parallel).
"""
from __future__ import annotations

GIB = 2**30
COMPONENTS = ("gemm", "attention", "memory-bound kernels", "collectives on the compute stream",
              "host kernel launches", "pipeline sends", "pipeline bubble",
              "exposed communication")
MEMORY_BOUND = ("elementwise", "reduction", "data_movement", "memory", "other")
FIELD_NAMES = {"tp": "tp", "cp": "cp", "pp": "pp", "vp": "vp", "ep": "ep", "zero": "zero",
               "hsdp": "hsdp", "micro_batch": "micro-batch", "remat": "remat",
               "precision": "precision", "devices": "devices"}


def layout(row: dict) -> str:
    """A row's layout in a few words (the same words as plan_space.Candidate.short)."""
    from flint.plan_space import Candidate

    return Candidate(**{k: row[k] for k in Candidate.__dataclass_fields__}).short()


def components(row: dict) -> dict:
    """Seconds of the row's step per component (they add up to the step)."""
    step = row["step_time_s"]
    # the engine may report a slightly negative bubble (a pipeline extrapolated from its
    # steady state): no component is below zero
    bubble = max(row["bubble_fraction"], 0.0) * step
    exposed = max(row["exposed_communication_s"], 0.0)
    compute = max(step - bubble - exposed, 0.0)
    by = row.get("by_class_s") or {}
    total = sum(by.values()) or 1.0
    share = lambda *names: sum(by.get(n, 0.0) for n in names) / total * compute  # noqa: E731
    return {"gemm": share("gemm", "conv"), "attention": share("attention"),
            "memory-bound kernels": share(*MEMORY_BOUND),
            "collectives on the compute stream": share("collective"),
            "host kernel launches": share("host_launch"),
            "pipeline sends": share("p2p"), "pipeline bubble": bubble,
            "exposed communication": exposed}


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def seconds(s: float) -> str:
    """A duration with its unit, three significant figures below 10 s."""
    a = abs(s)
    if a >= 10:
        return f"{s:,.1f} s"
    if a >= 1:
        return f"{s:.3f} s"
    if a >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    return f"{s * 1e6:.3g} us"


def size(b: float) -> str:
    return f"{b / GIB:.1f} GiB" if b >= GIB / 10 else f"{b / 2**20:.1f} MiB"


def why(rows: list) -> list[str]:
    """Sentences: what dominates the winner's step, its memory headroom, and what the
    runner-up loses (and gains) on. `rows`: ranked, fitting first."""
    fitting = [r for r in rows if r["status"] == "ok" and not r["oom"]]
    if not fitting:
        return ["no priced layout fits in memory"]
    w = fitting[0]
    parts = components(w)
    step = w["step_time_s"]
    top = sorted(parts.items(), key=lambda kv: -kv[1])
    lines = [f"winner {layout(w)}: {seconds(step)} per step, {w['tokens_per_s_per_device']:,.0f} "
             f"tokens/s/GPU, MFU {_pct(w['mfu'])}",
             "its step: " + ", ".join(f"{name} {_pct(t / step)}" for name, t in top if t > 0),
             f"dominated by {top[0][0]} ({_pct(top[0][1] / step)} of the step)",
             f"memory {size(w['memory_bytes'])} of {size(w['memory_capacity_bytes'])} per device "
             f"({size(w['memory_capacity_bytes'] - w['memory_bytes'])} headroom)"]
    if len(fitting) > 1:
        lines.append(runner_up_line(w, fitting[1]))
    return lines


def runner_up_line(w: dict, r: dict) -> str:
    diff = [f"{FIELD_NAMES[k]} {w[k]} -> {r[k]}" for k in FIELD_NAMES if w[k] != r[k]]
    delta = r["step_time_s"] - w["step_time_s"]
    a, b = components(w), components(r)
    moves = sorted(((b[k] - a[k], k) for k in COMPONENTS), reverse=True)
    loses = [f"{k} +{seconds(d)}" for d, k in moves if d > 0.005 * w["step_time_s"]][:2]
    gains = [f"{k} {seconds(d)}" for d, k in reversed(moves) if d < -0.005 * w["step_time_s"]][:1]
    text = (f"runner-up {layout(r)} ({', '.join(diff)}) is {_pct(delta / w['step_time_s'])} "
            f"slower ({seconds(delta)})")
    if loses:
        text += ": it loses on " + ", ".join(loses)
    if gains:
        text += "; gains " + ", ".join(gains)
    return text


def pareto(rows: list) -> dict:
    """Fitting rows no other beats on both axes: step time vs devices, vs memory."""
    fitting = [r for r in rows if r["status"] == "ok" and not r["oom"]]

    def front(axis):
        out, best = [], float("inf")
        for r in sorted(fitting, key=lambda r: (r[axis], r["step_time_s"], r["key"])):
            if r["step_time_s"] < best:
                out.append(r)
                best = r["step_time_s"]
        return out

    return {"devices": front("devices"), "memory": front("memory_bytes")}


def report(result, top: int) -> dict:
    """The plan as one JSON document (what --json prints and plan.json holds)."""
    rows = result.rows
    fronts = pareto(rows)
    fitting = result.fitting
    return {"request": result.request.to_json(), "counts": result.counts,
            "stop_reason": result.stop_reason,
            "winner": fitting[0] if fitting else None,
            "runner_up": fitting[1] if len(fitting) > 1 else None,
            "why": why(rows), "top": rows[:top], "priced": rows,
            "pareto": {k: [r["key"] for r in v] for k, v in fronts.items()},
            "analytic_best_unpriced": result.analytic_best,
            "corrections": result.corrections}


def counts_line(counts: dict) -> str:
    return (f"candidates: {counts['raw']:,} before pruning, {counts['valid']:,} pass the "
            f"divisibility rules, {counts['ranked']:,} clear the memory floor "
            f"({counts['programs']:,} stage programs); {counts['priced']} priced with "
            f"predict ({counts.get('programs_priced', 0)} stage programs, "
            f"{counts['compiled']} compiled now, "
            f"{counts.get('skipped_memory', 0):,} passed over as out of memory)")


def render(doc: dict, console, top: int) -> None:
    """The ranked table, the why and the Pareto fronts on a terminal."""
    from rich.markup import escape
    from rich.table import Table

    console = wide(console)
    req = doc["request"]
    model = req["model"] if isinstance(req["model"], str) else "custom model"
    devices = ",".join(map(str, req["devices"]))
    title = (f"flint plan: {model} on {devices} x {req['hardware']}, seq {req['seq_len']}, "
             f"global batch {req['global_batch']} sequences"
             + (f" [{'; '.join(req['what_if'])}]" if req["what_if"] else ""))
    table = Table(title=escape(title), title_justify="left")
    several = len(req["devices"]) > 1
    heads = ["#", "layout"] + (["GPUs"] if several else []) + [
        "step", "tok/s/GPU", "MFU", "memory", "exp. comm", "bubble", "closed form"]
    for col in heads:
        table.add_column(col, justify="left" if col == "layout" else "right", no_wrap=True)
    for i, r in enumerate(doc["top"], 1):
        lead = [str(i), escape(layout(r))] + ([str(r["devices"])] if several else [])
        if r["status"] != "ok":
            table.add_row(*lead, r["status"], *[""] * 6)
            continue
        table.add_row(*lead, seconds(r["step_time_s"]), f"{r['tokens_per_s_per_device']:,.0f}",
                      _pct(r["mfu"]), size(r["memory_bytes"]) + (" OOM" if r["oom"] else ""),
                      seconds(r["exposed_communication_s"]), _pct(r["bubble_fraction"]),
                      seconds(r["analytic"]["step_s"]))
    console.print(table)
    for line in doc["why"]:
        console.print(escape(line), highlight=False)
    console.print(escape(counts_line(doc["counts"])), highlight=False)
    console.print(escape(f"stopped: {doc['stop_reason']}"), highlight=False)
    by_key = {r["key"]: r for r in doc["priced"]}
    for axis, unit in (("devices", "devices"), ("memory", "memory per device")):
        keys = doc["pareto"][axis]
        if len(keys) > 1:
            pts = ", ".join(f"{_x(by_key[k], axis)} -> {seconds(by_key[k]['step_time_s'])}"
                            for k in keys)
            console.print(escape(f"Pareto front, step time vs {unit}: {pts}"), highlight=False)


TABLE_WIDTH = 150


def wide(console):
    """Off a terminal (a log, a pipe) the plan's tables get TABLE_WIDTH columns, so the
    layouts and numbers are not cut."""
    from rich.console import Console

    if not console.is_terminal and console.width < TABLE_WIDTH:
        return Console(width=TABLE_WIDTH, file=console.file)
    return console


def _x(row: dict, axis: str) -> str:
    return f"{row['devices']} GPUs" if axis == "devices" else size(row["memory_bytes"])
