"""`flint export`: a workload graph -> Chakra ETs (+ ASTRA-sim inputs), Flint JSON or a
Perfetto timeline of the predicted step."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from flint.cli._common import cost_model_option, err, report_out, run
from flint.errors import FlintError

FORMATS = ("chakra", "json", "perfetto")
# File prefixes become file names and words in the generated run_astra_sim.sh: letters,
# digits, '.', '_' and '-' only, starting with a letter or digit.
PREFIX = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def check_prefix(prefix: str) -> str:
    if not PREFIX.match(prefix):
        raise FlintError(f"--prefix {prefix!r}: use letters, digits, '.', '_' and '-' only "
                         f"(starting with a letter or digit, at most 100 characters)")
    return prefix


def remove_stale_partials(out: str) -> None:
    """`.NAME.*.partial` directories an export killed outright (SIGKILL, power loss) left
    beside its output directory; an interrupted export removes its own."""
    import shutil

    target = Path(out).absolute()
    for stale in target.parent.glob(f".{glob_escape(target.name)}.*.partial"):
        if stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)


def glob_escape(text: str) -> str:
    import glob

    return glob.escape(text)


def parse_ranks(text: Optional[str], devices: int) -> range | None:
    if not text:
        return None
    try:
        lo, _, hi = text.partition("-")
        r = range(int(lo), int(hi or lo) + 1)
    except ValueError:
        raise FlintError(f"--ranks {text!r} is not like 0-7") from None
    if not r or r.start < 0 or r.stop > devices:
        raise FlintError(f"--ranks {text} is outside the graph's {devices} ranks")
    return r


def export(
    graph_file: str = typer.Argument(..., help="a workload graph JSON, a Chakra .et, or a "
                                               "directory of them"),
    fmt: str = typer.Option("chakra", "--format", help="chakra | json | perfetto"),
    out: Optional[str] = typer.Option(None, "--out", help="output directory (created if "
                                      "missing); without it and with --check, check only"),
    hardware_name: Optional[str] = typer.Option(None, "--hardware", help="cost model for "
                                                "durations and ASTRA-sim inputs"),
    set_: list[str] = typer.Option([], "--set", help="what-if, e.g. nic_bandwidth=800Gb/s"),
    cost_model: Optional[str] = typer.Option(None, "--cost-model", metavar="MODULE:FACTORY",
                                             help="a third-party cost model: "
                                             "package.module:factory (see README)"),
    prefix: str = typer.Option("workload", help="file prefix: <prefix>.<rank>.et"),
    annotate: str = typer.Option("rank0", help="chakra: ranks whose files carry Flint's "
                                 "node records for exact import: rank0 | all | none"),
    ranks: Optional[str] = typer.Option(None, help="chakra: write only these ranks, e.g. 0-7"),
    workers: int = typer.Option(4, help="chakra: writer threads"),
    check: bool = typer.Option(False, "--check", help="chakra: prove the export (or a "
                               "directory of ETs given as input) runs to completion under "
                               "ASTRA-sim's issue rule; refuse it otherwise. Exports are "
                               "always checked before writing"),
    as_json: bool = typer.Option(False, "--json", help="print the export report as JSON"),
):
    """Write a workload graph as Chakra ETs (+ ASTRA-sim inputs), Flint JSON or a Perfetto
    timeline of the predicted step."""
    def go():
        from flint.frontends.saved import load_graph
        from flint.guard import check_output_dir

        factory = cost_model_option(cost_model)
        if fmt not in FORMATS:
            raise FlintError(f"unknown --format {fmt!r}; use {' | '.join(FORMATS)}")
        check_prefix(prefix)
        if annotate not in ("rank0", "all", "none"):
            raise FlintError(f"--annotate must be rank0, all or none, not {annotate!r}")
        if workers < 1:
            raise FlintError(f"--workers must be at least 1, not {workers}")
        if out is None and not check:
            raise FlintError("--out is required (or --check alone, to check only)")
        if out is not None:
            check_output_dir(out)
        if hardware_name is not None or set_:
            from flint.hardware_models.spec import load_spec

            load_spec(hardware_name or "h100-sxm", set_)   # bad figures fail before the work
        graph = load_graph(graph_file, check=check)
        if out is None:
            from flint.exporters.chakra import check_export

            report = check_export(graph, hardware_name, set_, factory)
            return report_out(report, as_json, _render_check)
        if fmt == "chakra":
            remove_stale_partials(out)
        if fmt == "chakra":
            report = _export_chakra(graph, out, hardware_name, set_, prefix, annotate, ranks,
                                    workers, factory)
        else:
            report = _export_single(graph, fmt, out, hardware_name, set_, prefix, factory)
        report_out(report, as_json, _render_export)

    run(go)


def _export_chakra(graph, out, hardware_name, overrides, prefix, annotate, ranks, workers,
                   cost_model=None):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from flint.exporters.chakra import export_chakra

    selected = parse_ranks(ranks, graph.cluster.devices)
    count = len(selected) if selected is not None else graph.cluster.devices
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=err, transient=True,
                  disable=not err.is_terminal) as progress:
        task = progress.add_task("writing Chakra ETs", total=count)
        stats = export_chakra(graph, out, prefix=prefix, hardware=hardware_name,
                              overrides=overrides, annotate=annotate, ranks=selected,
                              workers=workers, cost_model=cost_model,
                              progress=lambda done: progress.update(task, completed=done))
    return {"format": "chakra", "out": str(out), **stats.to_json(),
            "files_written": count, "side_files": [f for f in stats.files
                                                   if not f.endswith(".et")]}


def _export_single(graph, fmt, out, hardware_name, overrides, prefix, cost_model=None):
    out_dir = Path(out)
    if not out_dir.absolute().parent.is_dir():
        raise FlintError(f"output directory {str(out_dir.absolute().parent)!r} does not exist")
    timeline = None
    if fmt == "perfetto":
        from flint.hardware_models.estimate import estimate

        timeline = estimate(graph, hardware_name, overrides, cost_model=cost_model).timeline
    out_dir.mkdir(exist_ok=True)
    if fmt == "json":
        path = out_dir / f"{prefix}.json"
        graph.save(path)
    else:
        from flint.exporters.perfetto import write_timeline

        path = out_dir / f"{prefix}.trace.json"
        write_timeline(timeline, path)
    return {"format": fmt, "out": str(path), "bytes": path.stat().st_size}


def _render_check(r: dict, console: Console) -> None:
    print(f"check passed: all {r['ranks']} ranks run to completion under ASTRA-sim's issue "
          f"rule ({r['lanes_simulated']} lane(s) simulated, {r['check_s']:.2f} s)")


def _render_export(r: dict, console: Console) -> None:
    from rich.table import Table

    from flint.render import fmt_bytes, fmt_seconds

    t = Table(title=f"flint export --format {r['format']} -> {r['out']}", show_header=False)
    t.add_column("what")
    t.add_column("value", justify="right")
    if r["format"] == "chakra":
        t.add_row("ranks in the cluster", f"{r['ranks']} ranks")
        t.add_row("rank files written", f"{r['files_written']} files")
        t.add_row("nodes per rank", f"{r['nodes_per_rank']} nodes")
        t.add_row("bytes written (rank files)", fmt_bytes(r["bytes"]))
        t.add_row("encode once (plan + cost model)", fmt_seconds(r["encode_s"]))
        t.add_row("specialize + write all ranks", fmt_seconds(r["write_s"]))
        t.add_row("write throughput", f"{r['MB_per_s']:.1f} MB/s")
        t.add_row("side files (ASTRA-sim inputs, manifest)", ", ".join(r["side_files"]))
    else:
        t.add_row("bytes written", fmt_bytes(r["bytes"]))
    console.print(t)
