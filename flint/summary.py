"""What a workload graph adds up to: node counts, flops, bytes, collectives, layers.

Collective sizes follow the nccl-tests convention (the "size" column of its reports):
all-reduce, reduce-scatter, all-to-all and permutes count the input buffer, all-gather
counts the gathered output buffer. Every total counts loop bodies `repeat` times.
"""
from __future__ import annotations

from collections import defaultdict

# `graph` below is a WorkloadGraph. No import of flint.graph: WorkloadGraph.summary() and
# .as_text() call in here, so the graph module stays the one that others depend on.


def summarize(graph) -> dict:
    kinds: dict[str, int] = defaultdict(int)
    classes: dict[str, dict] = defaultdict(lambda: {"nodes": 0, "flops": 0.0, "bytes": 0.0})
    phases: dict[str, float] = defaultdict(float)
    layers: dict[str, dict] = {}
    coll_type: dict[str, dict] = defaultdict(lambda: {"count": 0, "bytes": 0})
    coll_axis: dict[str, dict] = defaultdict(lambda: {"count": 0, "bytes": 0})
    flops = trans = read = written = 0.0
    for n in graph.nodes:
        r = n.repeat
        kinds[n.kind.value] += 1
        flops += n.flops * r
        trans += n.transcendentals * r
        read += n.bytes_read * r
        written += n.bytes_written * r
        cls = classes[n.op_class]
        cls["nodes"] += 1
        cls["flops"] += n.flops * r
        cls["bytes"] += (n.bytes_read + n.bytes_written) * r
        phases[n.meta.get("phase", "unknown")] += n.flops * r
        layer = layers.setdefault(n.meta.get("layer") or "(none)",
                                  {"nodes": 0, "flops": 0.0, "bytes": 0.0, "collective_bytes": 0})
        layer["nodes"] += 1
        layer["flops"] += n.flops * r
        layer["bytes"] += (n.bytes_read + n.bytes_written) * r
        if n.collective is not None:
            size = n.collective.size_bytes * r
            layer["collective_bytes"] += size
            coll_type[n.collective.type]["count"] += r
            coll_type[n.collective.type]["bytes"] += size
            axes = graph.communicators[n.collective.communicator].mesh_axes
            key = "+".join(axes) if axes else "(none)"
            coll_axis[key]["count"] += r
            coll_axis[key]["bytes"] += size
    cluster = graph.cluster
    return GraphSummary({
        "module": graph.meta.get("module", ""),
        "devices": cluster.devices,
        "mesh": {n: s for n, s in cluster.mesh},
        "hardware": cluster.hardware,
        "nodes": len(graph.nodes),
        "nodes_by_kind": dict(sorted(kinds.items())),
        "flops_per_device": flops,
        "transcendentals_per_device": trans,
        "bytes_read_per_device": read,
        "bytes_written_per_device": written,
        "flops_by_phase": dict(sorted(phases.items())),
        "op_classes": {k: classes[k] for k in sorted(classes)},
        "collectives_by_type": {k: coll_type[k] for k in sorted(coll_type)},
        "collectives_by_mesh_axis": {k: coll_axis[k] for k in sorted(coll_axis)},
        "communicators": len(graph.communicators),
        "layers": {k: layers[k] for k in sorted(layers)},
        "loops": [{"name": lp.name, "trip_count": lp.trip_count, "known": lp.trip_count_known}
                  for lp in graph.loops],
        "unknown_ops": graph.meta.get("unknown_ops", {}),
        "compiler_notes": graph.meta.get("compiler_notes", []),
        **{k: graph.meta[k] for k in ("arguments_sharding", "sharding_warnings",
                                      "model_flops_per_device", "memory_split", "training",
                                      "program_warnings", "capture")
           if k in graph.meta},
    })


class GraphSummary(dict):
    """The summary as a dict (what `--json` prints), shown as the report `flint extract`
    prints: `print(graph.summary())`, or `graph.summary()` at a REPL or in a notebook."""

    def report(self, width: int = 120) -> str:
        import io

        from rich.console import Console

        from flint.render import render_summary

        buffer = io.StringIO()
        render_summary(self, Console(file=buffer, width=width, force_terminal=False,
                                     color_system=None))
        return buffer.getvalue()

    def __str__(self) -> str:
        return self.report()

    def __repr__(self) -> str:
        return self.report()

    def _repr_pretty_(self, printer, cycle) -> None:   # IPython / Jupyter
        printer.text(self.report())


def graph_text(graph) -> str:
    lines = [f"# workload graph: {graph.meta.get('module', '')} on {graph.cluster.devices} "
             f"devices, mesh {dict(graph.cluster.mesh)}"]
    for c in graph.communicators:
        lines.append(f"comm{c.id}: {c.kind} size={c.size} groups={c.num_groups} "
                     f"axes={'+'.join(c.mesh_axes) or '-'} {c.spec[:60]}")
    for n in graph.nodes:
        extra = ""
        if n.collective is not None:
            extra = (f" comm{n.collective.communicator} {n.collective.size_bytes} B"
                     f"{' async' if n.collective.is_async else ''}")
        rep = f" x{n.repeat}" if n.repeat != 1 else ""
        lines.append(f"%{n.id} {n.name} = {n.kind.value}:{n.op}[{n.op_class}]"
                     f"({', '.join(f'%{i}' for i in n.inputs)}) flops={n.flops:.0f}"
                     f" bytes={n.bytes_read + n.bytes_written:.0f}{extra}{rep}")
    return "\n".join(lines) + "\n"
