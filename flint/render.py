"""Rich tables for summaries; every number carries its unit."""
from __future__ import annotations

from rich.console import Console
from rich.table import Table

from flint.hardware_models.units import fmt_bytes, fmt_seconds  # noqa: F401 (re-exported)


def fmt_flops(x: float) -> str:
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if abs(x) >= scale:
            return f"{x / scale:.2f} {unit}"
    return f"{x:.0f} FLOP"


def render_summary(s: dict, console: Console, timings: dict | None = None,
                   top_layers: int = 12) -> None:
    mesh = " x ".join(f"{k}={v}" for k, v in s["mesh"].items())
    over = Table(title=f"Workload graph: {s['module']} on {s['devices']} x {s['hardware']} "
                       f"({mesh})", show_header=False)
    over.add_column("what")
    over.add_column("value", justify="right")
    over.add_row("nodes (per-device graph)", f"{s['nodes']} nodes")
    for kind, n in s["nodes_by_kind"].items():
        over.add_row(f"  {kind}", f"{n} nodes")
    over.add_row("flops per device per step", fmt_flops(s["flops_per_device"]))
    for phase, f in s["flops_by_phase"].items():
        over.add_row(f"  {phase}", fmt_flops(f))
    over.add_row("memory traffic per device", fmt_bytes(s["bytes_read_per_device"]
                                                        + s["bytes_written_per_device"]))
    over.add_row("communicators", f"{s['communicators']} communicators")
    for lp in s["loops"]:
        known = "" if lp["known"] else " (unknown trip count: counted once)"
        over.add_row(f"loop {lp['name']}", f"{lp['trip_count']} iterations{known}")
    unknown = sum(s["unknown_ops"].values())
    over.add_row("unknown ops (conservative cost)", f"{unknown} ops")
    for k, v in (timings or {}).items():
        over.add_row(f"time: {k}", fmt_seconds(v))
    console.print(over)

    coll = Table(title="Collectives per device per step (nccl-tests size convention)")
    for col in ("type / mesh axes", "count", "bytes"):
        coll.add_column(col, justify="right" if col != "type / mesh axes" else "left")
    for name, c in s["collectives_by_type"].items():
        coll.add_row(name, f"{c['count']} ops", fmt_bytes(c["bytes"]))
    for axes, c in s["collectives_by_mesh_axis"].items():
        coll.add_row(f"axes: {axes}", f"{c['count']} ops", fmt_bytes(c["bytes"]))
    console.print(coll)

    classes = Table(title="By op class")
    for col in ("class", "nodes", "flops", "memory traffic"):
        classes.add_column(col, justify="left" if col == "class" else "right")
    for name, c in s["op_classes"].items():
        classes.add_row(name, f"{c['nodes']} nodes", fmt_flops(c["flops"]), fmt_bytes(c["bytes"]))
    console.print(classes)

    layers = sorted(s["layers"].items(), key=lambda kv: -kv[1]["flops"])[:top_layers]
    lt = Table(title=f"Per-layer roll-up (top {len(layers)} by flops)")
    for col in ("layer / scope", "nodes", "flops", "memory traffic", "collective bytes"):
        lt.add_column(col, justify="left" if col.startswith("layer") else "right")
    for name, c in layers:
        lt.add_row(name, f"{c['nodes']} nodes", fmt_flops(c["flops"]), fmt_bytes(c["bytes"]),
                   fmt_bytes(c["collective_bytes"]))
    console.print(lt)
    for note in s.get("compiler_notes", []):
        console.print(f"[yellow]compiler note:[/] {note}", highlight=False)
    _render_arguments(s, console)
    _render_memory_split(s, console)


def _render_memory_split(s: dict, console: Console) -> None:
    """What a torch rank holds for its model (the estimate adds the activations)."""
    split = s.get("memory_split")
    if not split:
        return
    t = Table(title="Model state per device (the estimate adds activations)")
    t.add_column("what")
    t.add_column("bytes", justify="right")
    for key in ("parameters_bytes", "gradients_bytes", "optimizer_state_bytes", "inputs_bytes"):
        t.add_row(key[:-len("_bytes")].replace("_", " "), fmt_bytes(split.get(key, 0)))
    console.print(t)


def _render_arguments(s: dict, console: Console, top: int = 24) -> None:
    """The per-argument sharding table, largest per-device share first (its warnings go to
    stderr as the step is lowered)."""
    rows = sorted(s.get("arguments_sharding") or [], key=lambda r: (-r[4], r[0]))
    if rows:
        t = Table(title=f"Arguments: sharding ({min(top, len(rows))} of {len(rows)} by "
                        f"bytes per device)")
        for col in ("argument", "global shape", "spec", "from", "per device"):
            t.add_column(col, justify="right" if col == "per device" else "left")
        for name, shape, spec, source, nbytes in rows[:top]:
            t.add_row(name, shape, spec, source, fmt_bytes(nbytes))
        console.print(t)


def render_estimate(e: dict, console: Console) -> None:
    t = Table(title=f"Predicted step on {e['devices']} x {e['hardware']}", show_header=False)
    t.add_column("what")
    t.add_column("value", justify="right")
    step = e["step_time_s"]
    t.add_row("step time", fmt_seconds(step))
    for key, label in (("compute_busy_s", "compute stream busy"),
                       ("communication_busy_s", "communication streams busy"),
                       ("exposed_communication_s", "exposed communication"),
                       ("idle_s", "compute idle")):
        share = f" ({100 * e[key] / step:.0f}% of step)" if step else ""
        t.add_row(label, fmt_seconds(e[key]) + share)
    pipe = e.get("pipeline") or {}
    if pipe:
        label = (f"{pipe['stages']}-stage {pipe['schedule']}, {pipe['microbatches']} "
                 f"microbatches" if "stages" in pipe else f"{pipe['devices']} devices")
        t.add_row("pipeline / placement", label)
        if "stages" in pipe:
            t.add_row("pipeline bubble (schedule)", f"{100 * pipe['bubble_fraction']:.1f} % "
                      f"of the pipelined part with free communication")
            if "comm_wait_fraction" in pipe:
                t.add_row("pipeline communication wait",
                          f"{100 * pipe['comm_wait_fraction']:.1f} % of the pipelined "
                          f"{fmt_seconds(pipe['pipelined_s'])}")
        busy = pipe["compute_busy_s"]
        t.add_row("busiest / idlest device", f"{fmt_seconds(max(busy))} / "
                  f"{fmt_seconds(min(busy))} busy")
    t.add_row("flops per device", fmt_flops(e["flops_per_device"]))
    t.add_row("HFU (hardware flops / peak)", f"{100 * e['hfu']:.1f} %")
    if e.get("mfu") is not None:
        t.add_row("MFU (model flops / peak)", f"{100 * e['mfu']:.1f} %")
    t.add_row("peak used for utilization", fmt_flops(e["peak_flops"]) + "/s")
    verdict = "OUT OF MEMORY" if e["oom"] else "fits"
    t.add_row("device memory peak / capacity",
              f"{fmt_bytes(e['memory_bytes'])} / {fmt_bytes(e['memory_capacity_bytes'])}: "
              f"{verdict}")
    mem = e.get("memory") or {}
    for cat, nbytes in (mem.get("arguments_bytes") or {}).items():
        t.add_row(f"  {cat.replace('_', ' ')}", fmt_bytes(nbytes))
    if mem:
        t.add_row("  temporaries at the peak", f"{fmt_bytes(mem['temporaries_peak_bytes'])} "
                  f"(at {mem['peak_node']})")
        if mem.get("xla_bytes") is not None:
            t.add_row("  XLA buffer assignment (cross-check)", fmt_bytes(mem["xla_bytes"]))
    if e.get("topology"):
        t.add_row("topology", e["topology"])
    console.print(t)
    c = Table(title="Time by op class and collective (summed over the step)")
    c.add_column("class")
    c.add_column("time", justify="right")
    for k, v in sorted(e["by_class_s"].items(), key=lambda kv: -kv[1]):
        c.add_row(k, fmt_seconds(v))
    for k, v in e["collectives_s"].items():
        c.add_row(f"  {k}", fmt_seconds(v))
    console.print(c)
