"""`flint import`: Chakra execution traces (Flint's, or Chakra's own converter's) -> a
workload graph that `flint estimate` and the other commands then work on."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from flint.cli._common import check_output_file, report_out, run


def import_(
    source: str = typer.Argument(..., help="a Chakra .et file or a directory of "
                                           "<prefix>.<rank>.et files"),
    rank: Optional[int] = typer.Option(None, help="which rank's file to read from a "
                                                  "directory (default: the lowest)"),
    comm_groups: Optional[str] = typer.Option(None, help="communicator-group JSON that "
                                              "pg_name refers to (default: DIR/comm_groups.json)"),
    out: Optional[str] = typer.Option(None, help="write the graph as JSON to this file"),
    check: bool = typer.Option(True, "--check/--no-check", help="for a directory: first "
                               "prove every rank runs to completion under ASTRA-sim's "
                               "issue rule (reads every rank's file)"),
    as_json: bool = typer.Option(False, "--json", help="print the summary as JSON"),
):
    """Read Chakra execution traces (Flint's, or Chakra's own converter's) into a
    workload graph; `flint estimate` then works on it."""
    def go():
        from flint.frontends.chakra import import_chakra

        if out:
            check_output_file(out)
        if check and Path(source).is_dir():
            from flint.frontends.chakra_ranks import check_directory

            check_directory(source, comm_groups)
        graph = import_chakra(source, rank, comm_groups)
        if out:
            graph.save(out)
        from flint.render import render_summary

        report_out(graph.summary(), as_json, render_summary, out and f"wrote {out}")

    run(go)
