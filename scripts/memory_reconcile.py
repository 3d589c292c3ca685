"""Flint's memory figure against the compiler's and the allocator's, term by term.

Showcase (the built-in llama3-8b step, `flint extract --devices N`): the step is compiled
again with XLA dumping its buffer assignment; the table sets Flint's liveness peak (the
graph as Flint prices it: attention as fused kernels) beside Flint's liveness of the very
program XLA compiled (attention left as XLA's ops, the S x S scores materialized) and
XLA's own allocation (arguments + unaliased outputs + the preallocated temp buffer), and
names what makes up the difference: the score buffers of the reference attention (from
XLA's memory-usage report) and XLA's packing of its temporaries into one buffer.

Torch FSDP2 twin (`flint extract --framework torch --model llama3-8b ...`): the live
tensors against PyTorch's caching allocator replayed over them (block rounding, the
fragmentation of the segments that hold live blocks, and the cache kept without memory
pressure).

    python scripts/memory_reconcile.py [--devices 4096] [--torch-devices 64] [--no-torch] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

GIB = 2 ** 30
FLINT = [sys.executable, "-m", "flint"]


def extract(args: list[str], out: Path, dump: Path | None = None) -> None:
    env = dict(os.environ)
    if dump is not None:
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_dump_to={dump}".strip()
    r = subprocess.run([*FLINT, "extract", *args, "--out", str(out)], env=env,
                       capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"memory_reconcile: flint extract failed: {r.stderr.strip()[-500:]}")


def usage_report(dump: Path) -> tuple[float, list[tuple[float, list[str]]]]:
    """(total bytes, [(chunk bytes, shapes using it)]) from XLA's memory-usage report of the
    train step (the chunks it lists: the largest, together ~95% of the total)."""
    found = sorted(dump.glob("*jit_train_step*memory-usage-report.txt"))
    if not found:
        sys.exit(f"memory_reconcile: no memory-usage report in {dump}")
    text = found[-1].read_text()
    total = float(re.search(r"Total bytes:\s*(\d+)", text).group(1))
    chunks = []
    for line in text.splitlines():
        m = re.match(r"\s*[\d.]+\w+\(\s*\d+%\);\s*([\d.]+)(\w+);\s*\d+;\s*\d+;\s*(.*)$", line)
        if m:
            scale = {"B": 1, "KiB": 2 ** 10, "MiB": 2 ** 20, "GiB": GIB}[m.group(2)]
            chunks.append((float(m.group(1)) * scale, re.findall(r"\w+\[[\d,]*\]", m.group(3))))
        elif chunks and not line.strip():
            break                       # the first table only: the default memory space
    return total, chunks


def showcase(devices: int) -> dict:
    from flint.graph import WorkloadGraph
    from flint.hardware_models.memory import estimate_memory
    from flint.hlo.dump import dump_modules
    from flint.hlo.loaders import load_hlo
    from flint.passes.lower_hlo import lower_hlo

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        extract(["--devices", str(devices)], tmp / "g.json", tmp / "dump")
        graph = WorkloadGraph.load(tmp / "g.json")
        flint = estimate_memory(graph)
        module = next(m for m in dump_modules(tmp / "dump") if "jit_train_step" in m.name)
        program = lower_hlo(load_hlo(module.path), graph.cluster, collapse_attention=False)
        program.meta.update({k: graph.meta[k] for k in ("arguments", "aliased_arguments",
                                                        "output_bytes") if k in graph.meta})
        as_compiled = estimate_memory(program)
        total, chunks = usage_report(tmp / "dump")
    xla = graph.meta["xla_memory"]
    seqs = {(a["seq_q"], a["seq_kv"]) for a in (n.meta.get("attention") for n in graph.nodes)
            if isinstance(a, dict)}
    scores = sum(size for size, shapes in chunks
                 if any(_dims(s)[-2:] in [list(q) for q in seqs] for s in shapes))
    args = sum(flint.arguments_bytes.values())
    return {
        "graph": f"flint extract --devices {devices}", "xla_total": total,
        "rows": [
            ("arguments (parameters, optimizer state, inputs)", args, args,
             xla["argument_bytes"]),
            ("results not aliased to an argument", flint.unaliased_outputs_bytes,
             as_compiled.unaliased_outputs_bytes,
             xla["output_bytes"] - xla["alias_bytes"]),
            ("temporaries at the peak", flint.temporaries_peak_bytes,
             as_compiled.temporaries_peak_bytes, xla["temp_bytes"]),
            ("total", flint.peak_bytes, as_compiled.peak_bytes,
             xla["argument_bytes"] + xla["output_bytes"] - xla["alias_bytes"]
             + xla["temp_bytes"]),
        ],
        "scores_in_xla_chunks": scores,
        "packing": xla["temp_bytes"] - as_compiled.temporaries_peak_bytes,
        "attention_calls": sum(1 for n in graph.nodes if n.meta.get("attention")),
        "verdict": (flint.verdict_bytes, flint.verdict_source, flint.verdict_reason),
    }


def torch_fsdp2(devices: int) -> dict:
    from flint.graph import WorkloadGraph
    from flint.hardware_models.memory import estimate_memory
    from flint.hardware_models.torch_allocator import replay

    args = ["--framework", "torch", "--model", "llama3-8b", "--devices", str(devices),
            "--mesh", f"fsdp={devices}", "--seq-len", "8192", "--remat", "full"]
    with tempfile.TemporaryDirectory() as tmp:
        extract(args, Path(tmp) / "t.json")
        graph = WorkloadGraph.load(Path(tmp) / "t.json")
    mem = estimate_memory(graph)
    alloc = replay(graph)
    return {"graph": "flint extract " + " ".join(args), "live": mem.peak_bytes,
            "allocated": alloc.peak_allocated, "needed": alloc.peak_needed,
            "reserved": alloc.peak_reserved,
            "verdict": (mem.verdict_bytes, mem.verdict_source, mem.verdict_reason)}


def _dims(shape: str) -> list[int]:
    inner = shape.split("[", 1)[1].rstrip("]")
    return [int(d) for d in inner.split(",") if d]


def render(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=130)
    s = report.get("showcase")
    if s:
        t = Table(title=f"Showcase ({s['graph']}): per-device memory, GiB")
        for col in ("term", "Flint (fused attention)", "Flint on XLA's program", "XLA"):
            t.add_column(col, justify="left" if col == "term" else "right")
        for name, a, b, c in s["rows"]:
            t.add_row(name, f"{a / GIB:.2f}", f"{b / GIB:.2f}", f"{c / GIB:.2f}")
        console.print(t)
        console.print(
            f"  XLA's temp buffer holds the {s['attention_calls']} attention calls' S x S score "
            f"buffers of its reference attention: chunks using them total "
            f"{s['scores_in_xla_chunks'] / GIB:.2f} GiB of its {s['xla_total'] / GIB:.2f} GiB "
            f"(memory-usage report); a fused kernel never writes them.\n"
            f"  XLA's heap-simulated packing of its temporaries into one buffer (that buffer's "
            f"fragmentation, and lifetimes XLA keeps longer than node-order liveness: async "
            f"collectives' buffers until their done, loop state): "
            f"{s['packing'] / GIB:+.2f} GiB over Flint's liveness of the same program.\n"
            f"  verdict: {s['verdict'][0] / GIB:.2f} GiB from {s['verdict'][1]} ({s['verdict'][2]})",
            highlight=False)
    tr = report.get("torch")
    if tr:
        t = Table(title=f"Torch FSDP2 twin ({tr['graph']}): per-device memory, GiB")
        for col in ("figure", "GiB", "what it adds"):
            t.add_column(col, justify="right" if col == "GiB" else "left")
        t.add_row("live tensors (Flint liveness)", f"{tr['live'] / GIB:.2f}", "")
        t.add_row("allocated blocks", f"{tr['allocated'] / GIB:.2f}",
                  f"{(tr['allocated'] - tr['live']) / GIB:+.2f}: 512 B / 2 MiB rounding (an "
                  f"out-of-place kernel's output beside its dying inputs in both)")
        t.add_row("segments holding live blocks (verdict)", f"{tr['needed'] / GIB:.2f}",
                  f"{(tr['needed'] - tr['allocated']) / GIB:+.2f}: free pieces of those segments")
        t.add_row("reserved, cache never released", f"{tr['reserved'] / GIB:.2f}",
                  f"{(tr['reserved'] - tr['needed']) / GIB:+.2f}: cached free segments "
                  f"(released under memory pressure)")
        console.print(t)
        console.print(f"  verdict: {tr['verdict'][0] / GIB:.2f} GiB from {tr['verdict'][1]}",
                      highlight=False)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", type=int, default=4096)
    p.add_argument("--torch-devices", type=int, default=64)
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    report = {"showcase": showcase(a.devices)}
    if not a.no_torch:
        report["torch"] = torch_fsdp2(a.torch_devices)
    if a.json:
        print(json.dumps(report, indent=1, default=str))
    else:
        render(report)


if __name__ == "__main__":
    main()
