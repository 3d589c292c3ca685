"""`flint rescale`: re-target a workload graph to another
cluster size without re-extracting it (passes.rescale), and what that changed."""
from __future__ import annotations

from typing import Optional

import typer
from rich.console import Console

from flint.cli._common import check_output_file, report_out, run


def rescale_command(
    graph_file: str = typer.Argument(..., help="a workload graph JSON (flint extract --out), "
                                               "a Chakra .et, or a directory of them"),
    devices: int = typer.Option(..., "--devices", "-n", help="target cluster size"),
    mesh: Optional[str] = typer.Option(None, help="target mesh with the graph's axis names, "
                                       "e.g. fsdp=128,model=8 (default: the data-parallel "
                                       "axis absorbs the change)"),
    axis: Optional[str] = typer.Option(None, help="the axis that absorbs the change "
                                       "(default: fsdp or data, or a one-axis mesh's axis)"),
    out: str = typer.Option(..., "--out", help="write the rescaled graph as JSON"),
    hardware_name: Optional[str] = typer.Option(None, "--hardware", help="cost model for "
                                                "the step times (default: the graph's)"),
    as_json: bool = typer.Option(False, "--json", help="print the report as JSON"),
):
    """Re-target a workload graph to DEVICES devices: communicators rebuilt on the new
    mesh, collective bytes and parameter shards resized along the data-parallel axis (for
    graphs that cannot be re-extracted, such as imported Chakra traces)."""
    def go():
        from flint.frontends.saved import load_graph
        from flint.passes.rescale import Rescale

        from flint.cluster import check_device_count

        if devices > 0:       # (0 and below: the pass's own message)
            check_device_count(devices)
        check_output_file(out)
        if hardware_name is not None:
            from flint.hardware_models.spec import load_spec

            load_spec(hardware_name)   # a bad name fails before any work
        graph = load_graph(graph_file)
        rescaled = Rescale(devices, mesh or "", axis or "").run(graph)
        report = rescale_report(graph, rescaled, hardware_name)
        rescaled.save(out)
        report.update(graph=str(graph_file), out=str(out))
        report_out(report, as_json, render_rescale, f"wrote {out}")

    run(go)


def rescale_report(before, after, hardware_name=None) -> dict:
    """Before and after: cluster, communicators, collective bytes, predicted step."""
    from flint.hardware_models.estimate import estimate

    def side(graph) -> dict:
        s = graph.summary()
        e = estimate(graph, hardware_name)
        return {"devices": graph.cluster.devices, "mesh": dict(graph.cluster.mesh),
                "collective_bytes": sum(v["bytes"] for v in s["collectives_by_type"].values()),
                "collective_bytes_by_type": {k: v["bytes"] for k, v in
                                             s["collectives_by_type"].items()},
                "step_time_s": e.step_time_s, "memory_bytes": e.memory_bytes,
                "hardware": e.hardware}

    resized = sum(a.size != b.size for a, b in zip(before.communicators, after.communicators))
    colls = [(a, b) for a, b in zip(before.nodes, after.nodes) if a.collective is not None]
    changed = sum((a.collective.bytes_in, a.collective.bytes_out) !=
                  (b.collective.bytes_in, b.collective.bytes_out) for a, b in colls)
    others = sum(a.collective is None and (a.outputs, a.operands) != (b.outputs, b.operands)
                 for a, b in zip(before.nodes, after.nodes))
    return {"before": side(before), "after": side(after),
            "communicators": len(after.communicators), "communicators_resized": resized,
            "collectives": len(colls), "collectives_rescaled": changed,
            "nodes_rescaled": others}


def render_rescale(r: dict, console: Console) -> None:
    from rich.table import Table

    from flint.render import fmt_bytes, fmt_seconds

    b, a = r["before"], r["after"]

    def mesh(m):
        return ",".join(f"{k}={v}" for k, v in m.items())

    t = Table(title=f"flint rescale {r['graph']} -> {r['out']}",
              caption=f"per device; step time and memory from the cost model on {a['hardware']}")
    for name in ("", "before", "after"):
        t.add_column(name, justify="left" if not name else "right")
    t.add_row("devices", f"{b['devices']} devices", f"{a['devices']} devices")
    t.add_row("mesh", mesh(b["mesh"]), mesh(a["mesh"]))
    t.add_row("communicators rebuilt", "", f"{r['communicators']} ({r['communicators_resized']} "
              f"with new group sizes)")
    t.add_row("collectives rescaled", "", f"{r['collectives_rescaled']} of {r['collectives']}")
    t.add_row("other nodes on resized shards", "", f"{r['nodes_rescaled']} nodes")
    t.add_row("collective bytes per step", fmt_bytes(b["collective_bytes"]),
              fmt_bytes(a["collective_bytes"]))
    t.add_row("predicted step time", fmt_seconds(b["step_time_s"]),
              fmt_seconds(a["step_time_s"]))
    t.add_row("peak memory", fmt_bytes(b["memory_bytes"]),
              fmt_bytes(a["memory_bytes"]))
    console.print(t)
