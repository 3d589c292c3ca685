"""`flint place`: Baechi device placement of a workload graph
over memory-limited devices, and the placed step's predicted time."""
from __future__ import annotations

from typing import Optional

import typer
from rich.console import Console

from flint.cli._common import check_output_file, cost_model_option, report_out, run
from flint.errors import FlintError


def place_command(
    graph_file: str = typer.Argument(..., help="a workload graph JSON (flint extract --out), "
                                               "a Chakra .et, or a directory of them"),
    algorithm: str = typer.Option("m-sct", help="m-sct | m-etf | m-topo"),
    devices: int = typer.Option(8, help="devices to place over (one NVLink domain)"),
    memory_limit: Optional[str] = typer.Option(None, help="memory per device, e.g. 40GB or "
                                               "64GiB (default: the hardware's HBM)"),
    hardware_name: str = typer.Option("h100-sxm", "--hardware", help="spec name or a spec "
                                      "YAML path: node times, link speed, HBM"),
    out: Optional[str] = typer.Option(None, help="write the placed multi-device graph as JSON"),
    cost_model: Optional[str] = typer.Option(None, "--cost-model", metavar="MODULE:FACTORY",
                                             help="a third-party cost model: "
                                             "package.module:factory (see README)"),
    as_json: bool = typer.Option(False, "--json", help="print the report as JSON"),
):
    """Place a training step's operators on memory-limited devices (Baechi's m-TOPO, m-ETF,
    m-SCT) and predict the placed step's time with the built-in cost model."""
    def go():
        report, placed = place_report(graph_file, algorithm, devices, memory_limit,
                                      hardware_name, out, cost_model_option(cost_model))
        if out:
            placed.save(out)
        report_out(report, as_json, render_place, out and f"wrote {out}")

    run(go)


def place_report(graph_file, algorithm, devices, memory_limit, hardware_name, out=None,
                 cost_model=None):
    """(report dict, placed graph); checks every argument before the work starts."""
    from flint.passes.place import ALGORITHMS

    if algorithm not in ALGORITHMS:
        raise FlintError(f"unknown --algorithm {algorithm!r}; use {' | '.join(ALGORITHMS)}")
    from flint.cluster import check_device_count

    check_device_count(devices)
    limit = 0.0
    if memory_limit is not None:
        from flint.hardware_models.units import parse_quantity

        limit = parse_quantity(memory_limit, "bytes", "--memory-limit")
        if limit <= 0:
            raise FlintError(f"--memory-limit {memory_limit!r} must be more than zero")
    if out:
        check_output_file(out)
    from flint.frontends.saved import load_graph
    from flint.hardware_models.estimate import estimate
    from flint.passes.place import place, transfers

    graph = load_graph(graph_file)
    result = place(graph, algorithm, devices, limit, hardware_name, cost_model)
    predicted = estimate(result.graph, hardware_name, cost_model=cost_model)
    count, nbytes = transfers(result.graph)
    report = {
        "graph": str(graph_file), "algorithm": algorithm, "devices": devices,
        "hardware": predicted.hardware, "nodes": len(result.device_of),
        "placement_time_s": result.placement_time_s, "step_time_s": predicted.step_time_s,
        "memory_limit_bytes": result.memory_limit_bytes,
        "per_device_bytes": result.per_device_bytes,
        "cost_model_per_device_bytes": predicted.memory.get("per_device_bytes", []),
        "per_device_nodes": [result.device_of.count(d) for d in range(devices)],
        "per_device_busy_s": predicted.pipeline.get("compute_busy_s", [predicted.compute_busy_s]),
        "transfers": count, "transfer_bytes": nbytes,
    }
    return report, result.graph


def render_place(r: dict, console: Console) -> None:
    from rich.table import Table

    from flint.render import fmt_bytes, fmt_seconds

    t = Table(title=f"flint place --algorithm {r['algorithm']}: {r['nodes']} nodes on "
                    f"{r['devices']} x {r['hardware']}", show_header=False)
    t.add_column("what")
    t.add_column("value", justify="right")
    t.add_row("algorithm", r["algorithm"])
    t.add_row("devices", f"{r['devices']} devices")
    t.add_row("placement time", f"{r['placement_time_s']:.3f} s")
    t.add_row("predicted step time", f"{r['step_time_s'] * 1e3:.1f} ms")
    t.add_row("memory limit per device", f"{r['memory_limit_bytes'] / 2**30:.2f} GiB")
    t.add_row("cross-device transfers", f"{r['transfers']} values, {fmt_bytes(r['transfer_bytes'])}")
    console.print(t)
    d = Table(title="per device")
    for name in ("device", "nodes", "memory bound (GiB)", "cost-model peak (GiB)", "busy"):
        d.add_column(name, justify="right")
    peaks = r["cost_model_per_device_bytes"] or [None] * r["devices"]
    busy = r["per_device_busy_s"]
    for i in range(r["devices"]):
        d.add_row(str(i), f"{r['per_device_nodes'][i]} nodes",
                  f"{r['per_device_bytes'][i] / 2**30:.2f} GiB",
                  f"{peaks[i] / 2**30:.2f} GiB" if peaks[i] is not None else "-",
                  fmt_seconds(busy[i]) if i < len(busy) else "-")
    console.print(d)
