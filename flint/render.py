"""Rich tables for summaries; every number carries its unit.

Tables are for terminals and logs alike: off a terminal the console is wide (a log has
no width) and every column folds a long name onto more lines instead of cutting it.
"""
from __future__ import annotations

import os
import sys

from rich.console import Console
from rich.table import Table as _RichTable

from flint.hardware_models.units import fmt_bytes, fmt_seconds  # noqa: F401 (re-exported)


# Off a terminal: wide enough for argument paths and scopes, so a log rarely wraps.
LOG_WIDTH = 200
# The widest a column grows before its text wraps (a verdict sentence, a long path).
COLUMN_WIDTH = 96


def report_console(stderr: bool = False) -> Console:
    """The console a report is printed on: the terminal's width on a terminal, else
    LOG_WIDTH (or $COLUMNS)."""
    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty():
        return Console(stderr=stderr)
    return Console(stderr=stderr, width=int(os.environ.get("COLUMNS") or LOG_WIDTH))


def Table(*args, **kwargs) -> _RichTable:
    """A rich Table whose columns fold long text rather than cut it."""
    table = _RichTable(*args, **kwargs)
    add = table.add_column

    def add_column(*a, **k):
        k.setdefault("overflow", "fold")
        # a sentence in a cell (a memory verdict's source, a note) wraps at a readable
        # width instead of stretching every row of the table across a log's 200 columns
        k.setdefault("max_width", COLUMN_WIDTH)
        return add(*a, **k)

    table.add_column = add_column
    return table


def fmt_flops(x: float) -> str:
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if abs(x) >= scale:
            return f"{x / scale:.2f} {unit}"
    return f"{x:.0f} FLOP"


def render_summary(s: dict, console: Console, timings: dict | None = None,
                   top_layers: int = 12, verbose: bool = False) -> None:
    mesh = " x ".join(f"{k}={v}" for k, v in s["mesh"].items())
    over = Table(title=f"Workload graph: {s['module']} on {s['devices']} x {s['hardware']} "
                       f"({mesh})", show_header=False)
    over.add_column("what")
    over.add_column("value", justify="right")
    training = s.get("training") or {}
    if training:
        over.add_row("training sequence / global batch", _training_text(training))
    else:
        over.add_row("training sequence / global batch", "not stated by the step's inputs")
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
    _render_arguments(s, console, top=None if verbose else 5)
    _render_memory_split(s, console)
    _render_buckets(s, console)


def _training_text(t: dict) -> str:
    text = f"{t['seq_len']} tokens x {t['global_batch']} sequences"
    if t.get("batch_per_replica"):
        text += f" ({t['batch_per_replica']} per data-parallel replica"
        text += f" in {t['micro_batches']} micro-batches)" if t.get("micro_batches") else ")"
    facts = [f"remat {t['remat']}" if t.get("remat") else "",
             f"{t['gemm_precision']} GEMMs" if t.get("gemm_precision") else ""]
    return "; ".join([text] + [f for f in facts if f])


def _render_buckets(s: dict, console: Console) -> None:
    """DDP's gradient buckets (one all-reduce each), when the step used DDP."""
    for ddp in (s.get("capture") or {}).get("ddp") or []:
        sizes = ddp["buckets_bytes"]
        console.print(f"DDP gradient buckets ({ddp['parameters']} parameters over "
                      f"{ddp['group_size']} ranks; caps {fmt_bytes(ddp['first_bucket_cap_bytes'])}"
                      f" first, then {fmt_bytes(ddp['bucket_cap_bytes'])}): {len(sizes)} "
                      f"all-reduces of " + ", ".join(fmt_bytes(b) for b in sizes),
                      highlight=False, markup=False)


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


def _render_arguments(s: dict, console: Console, top: int | None = 5) -> None:
    """The per-argument sharding table, largest per-device share first: the `top`
    largest and the totals by kind (all of them with top=None; JSON has every row). Its
    warnings go to stderr as the step is lowered."""
    rows = sorted(s.get("arguments_sharding") or [], key=lambda r: (-r[4], r[0]))
    if not rows:
        return
    shown = rows if top is None else rows[:top]
    t = Table(title=f"Arguments: sharding ({len(shown)} of {len(rows)} by bytes per device"
                    f"{'' if len(shown) == len(rows) else '; all with --verbose or --json'})")
    for col in ("argument", "global shape", "spec", "from", "per device"):
        t.add_column(col, justify="right" if col == "per device" else "left")
    for name, shape, spec, source, nbytes in shown:
        t.add_row(name, shape, spec, source, fmt_bytes(nbytes))
    totals: dict[str, list] = {}
    for name, _, spec, _, nbytes in rows:
        kind = name.split("/", 1)[0]
        entry = totals.setdefault(kind, [0, 0, 0])
        entry[0] += 1
        entry[1] += nbytes
        entry[2] += spec in ("P()", "PartitionSpec()")
    for kind, (count, nbytes, replicated) in sorted(totals.items(), key=lambda kv: -kv[1][1]):
        t.add_row(f"total {kind}", f"{count} arguments", f"{replicated} replicated", "",
                  fmt_bytes(nbytes))
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
        if e["mfu"] > e["hfu"]:
            t.add_row("  why MFU > HFU", "model flops count attention unmasked (PaLM);\n"
                      "causal kernels skip the masked half")
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
            t.add_row("  XLA buffer assignment", fmt_bytes(mem["xla_bytes"]))
        if mem.get("torch_reserved_bytes") is not None:
            t.add_row("  live tensors (allocated)", fmt_bytes(mem["peak_bytes"]))
        if mem.get("verdict_source"):
            t.add_row("  verdict from", f"{mem['verdict_source']}: {mem.get('verdict_reason', '')}")
    if e.get("topology"):
        t.add_row("topology", e["topology"])
    console.print(t)
    console.print(_time_table(e))


def _time_table(e: dict) -> Table:
    """Busy time per op class on the compute stream and per collective type on the
    communication streams: each kernel counted once, so the rows sum to the busy total
    (the streams overlap, so it can exceed the step)."""
    c = Table(title="Busy time by op class and collective type (each kernel once)")
    c.add_column("class")
    c.add_column("time", justify="right")
    compute = {k: v for k, v in e["by_class_s"].items() if k != "collective"}
    for k, v in sorted(compute.items(), key=lambda kv: -kv[1]):
        c.add_row(k, fmt_seconds(v))
    for k, v in sorted(e["collectives_s"].items(), key=lambda kv: -kv[1]):
        c.add_row(f"collective: {k}", fmt_seconds(v))
    # layer blocks (layer templates) price their collectives inside the block
    in_blocks = e["by_class_s"].get("collective", 0.0) - sum(e["collectives_s"].values())
    if in_blocks > 1e-12:
        c.add_row("collective: inside layer blocks", fmt_seconds(in_blocks))
    total = sum(e["by_class_s"].values())
    c.add_row("total busy (compute + communication streams)", fmt_seconds(total))
    return c
