"""`flint anonymize`: a graph that can be shared, with names,
source locations and layer paths gone, shapes optionally perturbed, and the estimate kept."""
from __future__ import annotations

import os

import typer
from rich.console import Console

from flint.cli._common import check_output_file, report_out, run
from flint.errors import FlintError


def anonymize_command(
    graph_file: str = typer.Argument(..., help="a workload graph JSON (flint extract --out), "
                                               "a Chakra .et, or a directory of them"),
    out: str = typer.Option(..., "--out", help="write the anonymized graph JSON here"),
    perturb: str = typer.Option("0", metavar="FRACTION", help="perturb every dimension size "
                                "by up to this fraction, e.g. 0.05 (default: shapes kept)"),
    seed: int = typer.Option(0, help="seed of the shape perturbation"),
    hardware_name: str = typer.Option("h100-sxm", "--hardware", help="spec name or a spec "
                                      "YAML path to compare the estimates on"),
    as_json: bool = typer.Option(False, "--json", help="print the report as JSON"),
):
    """Strip node names, source locations, layer paths and model names from a graph,
    optionally perturb its shapes, and check that its predicted step time is kept."""
    def go():
        report, anonymized = anonymize_report(graph_file, out, perturb, seed, hardware_name)
        anonymized.save(out)
        report_out(report, as_json, render_anonymize, f"wrote {out}")

    run(go)


def anonymize_report(graph_file, out, perturb, seed, hardware_name):
    """(report dict, anonymized graph); every argument is checked before the work starts."""
    from flint.passes.anonymize import Anonymize

    try:
        fraction = float(perturb)
    except ValueError:
        raise FlintError(f"--perturb {perturb!r} is not a number (a fraction such as 0.05)") \
            from None
    anonymize = Anonymize(perturb=fraction, seed=seed)
    check_output_file(out)
    if os.path.abspath(out) == os.path.abspath(graph_file):
        raise FlintError(f"--out {out!r} would overwrite the graph being anonymized")
    from flint.frontends.saved import load_graph
    from flint.hardware_models.estimate import estimate
    from flint.hardware_models.spec import load_spec

    load_spec(hardware_name)   # a bad --hardware fails before the graph is read
    graph = load_graph(graph_file)
    anonymized = anonymize.run(graph)
    before = estimate(graph, hardware_name).step_time_s
    after = estimate(anonymized, hardware_name).step_time_s
    report = {"graph": str(graph_file), "out": str(out), "hardware": hardware_name,
              "perturb": fraction, "seed": seed, **changes(graph, anonymized),
              "step_time_s": {"original": before, "anonymized": after},
              "step_time_difference": (after - before) / before if before else 0.0}
    return report, anonymized


def changes(old, new) -> dict:
    """What anonymizing changed: names, meta entries, shapes (largest relative dim change)."""
    from flint.hlo.shapes import parse_shape

    largest = 0.0
    reshaped = 0
    for a, b in zip(old.nodes, new.nodes):
        if (a.outputs, a.operands) == (b.outputs, b.operands):
            continue
        reshaped += 1
        for s, t in zip(a.outputs + a.operands, b.outputs + b.operands):
            for x, y in zip(parse_shape(s).leaves(), parse_shape(t).leaves()):
                largest = max([largest] + [abs(j / i - 1) for i, j in zip(x.dims, y.dims) if i])
    return {
        "nodes": len(old.nodes),
        "names_replaced": sum(a.name != b.name for a, b in zip(old.nodes, new.nodes))
        + sum(a.name != b.name for a, b in zip(old.loops, new.loops)),
        "node_meta_entries_dropped": sum(len(a.meta.keys() - b.meta.keys())
                                         for a, b in zip(old.nodes, new.nodes)),
        "node_meta_values_rewritten": sum(a.meta[k] != b.meta[k] for a, b in
                                          zip(old.nodes, new.nodes) for k in b.meta),
        "graph_meta_keys_dropped": sorted(old.meta.keys() - new.meta.keys()),
        "nodes_reshaped": reshaped, "largest_dim_change": largest,
    }


def render_anonymize(r: dict, console: Console) -> None:
    from rich.table import Table

    t = Table(title=f"flint anonymize {r['graph']} -> {r['out']}", show_header=False)
    t.add_column("what")
    t.add_column("value", justify="right")
    t.add_row("nodes", f"{r['nodes']} nodes")
    t.add_row("names replaced (nodes, loops)", f"{r['names_replaced']} names")
    t.add_row("node meta entries dropped", f"{r['node_meta_entries_dropped']} entries")
    t.add_row("layer / iteration labels rewritten", f"{r['node_meta_values_rewritten']} labels")
    t.add_row("graph meta keys dropped", f"{len(r['graph_meta_keys_dropped'])} keys")
    t.add_row("shape perturbation", f"up to {r['perturb'] * 100:.1f} % (seed {r['seed']})")
    t.add_row("nodes with perturbed shapes", f"{r['nodes_reshaped']} nodes")
    t.add_row("largest dimension change", f"{r['largest_dim_change'] * 100:.2f} %")
    steps = r["step_time_s"]
    t.add_row(f"step time on {r['hardware']}, original", _time(steps["original"]))
    t.add_row(f"step time on {r['hardware']}, anonymized", _time(steps["anonymized"]))
    t.add_row("difference", f"{r['step_time_difference'] * 100:+.3f} %")
    console.print(t)


def _time(seconds: float) -> str:
    """Three decimals, so that the two step times can be told apart."""
    return f"{seconds * 1e3:.3f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.3f} us"
