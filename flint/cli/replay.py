"""`flint replay`: a workload graph -> a standalone JAX program
that replays its compute and collectives, with its own `--steps` timing loop."""
from __future__ import annotations

import os
from collections import Counter

import typer
from rich.console import Console
from rich.table import Table

from flint.cli._common import check_output_file, report_out, run
from flint.errors import FlintError


def replay_command(
    graph_file: str = typer.Argument(..., help="a workload graph JSON (flint extract --out), "
                                               "a Chakra .et, or a directory of them"),
    out: str = typer.Option(..., "--out", help="write the replay program here (e.g. bench.py)"),
    as_json: bool = typer.Option(False, "--json", help="print the summary as JSON"),
):
    """Write a runnable benchmark of a graph: the same GEMMs, memory traffic and collectives
    in the graph's order, as one JAX program over a mesh like the graph's. Run it with
    `python bench.py --steps 10` (host CPU devices or GPUs; `--profile DIR` traces it, and
    `flint validate GRAPH --trace DIR` checks the trace against the graph)."""
    def go():
        from flint.frontends.saved import load_graph
        from flint.io import write_atomic
        from flint.replay import program_from_spec, replay_spec
        from flint.replay.spec import prepared

        check_output_file(out)
        name = os.path.basename(graph_file)
        if any(ord(c) < 32 or ord(c) == 127 for c in name):
            raise FlintError(f"graph file name {name!r} has control characters; rename it "
                             f"(the name is written into the generated program)")
        spec = replay_spec(prepared(load_graph(graph_file)))
        write_atomic(out, program_from_spec(spec, os.path.basename(graph_file)), mode=0o777)
        report_out(summarize(spec, out), as_json, render,
                   f"wrote {out}; run: python {out} --steps 10")

    run(go)


def summarize(spec: dict, out: str) -> dict:
    from flint.replay.spec import nbytes

    ops = Counter(op["op"] for op in spec["ops"])
    colls = Counter(op["type"] for op in spec["ops"] if op["op"] == "coll")
    return {"out": out, "devices": spec["devices"], "mesh": spec["graph_mesh"],
            "ops": len(spec["ops"]), "gemms": ops["gemm"], "memory_bound_ops": ops["ew"],
            "collectives": dict(sorted(colls.items())),
            "persistent_buffers": len(spec["buffers"]),
            "persistent_buffer_bytes_per_device": sum(nbytes(s) for s in spec["buffers"]),
            "approximations": spec["approximations"]}


def render(s: dict, console: Console) -> None:
    t = Table(title=f"replay program {s['out']}")
    t.add_column("")
    t.add_column("", justify="right")
    mesh = ",".join(f"{a}={n}" for a, n in s["mesh"])
    t.add_row("devices", f"{s['devices']} devices (mesh {mesh})")
    t.add_row("ops, in graph order", f"{s['ops']} ops")
    t.add_row("GEMMs (same shapes, dtypes, flops)", f"{s['gemms']} ops")
    t.add_row("memory-bound ops (same bytes)", f"{s['memory_bound_ops']} ops")
    for kind, n in s["collectives"].items():
        t.add_row(f"{kind} (same sizes, groups)", f"{n} ops")
    t.add_row("input buffers", f"{s['persistent_buffers']} buffers, "
              f"{s['persistent_buffer_bytes_per_device'] / 2**20:.1f} MiB per device")
    for what, n in s["approximations"].items():
        t.add_row(f"approximated: {what}", f"{n} ops")
    console.print(t)
