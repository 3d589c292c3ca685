"""What every command shares: the stderr console, running a command's body (one line and
exit 2 for bad input), output-path checks, and printing a report as a table or JSON."""
from __future__ import annotations

import json
import os
import sys

import typer
from rich.console import Console

from flint.render import report_console

# Progress and notes: off a terminal (a log) as wide as the reports, so that a progress
# line is one line of the log rather than wrapped at 80 columns.
err = report_console(stderr=True)


def run(fn) -> None:
    """Every command's body runs here: one plain line and exit 2 for bad input, 130 for an
    interrupt (flint.guard)."""
    from flint.guard import run_command

    _exit(run_command(fn))


def _exit(code: int) -> None:
    from flint.frontends.host_devices import needs_hard_exit

    if needs_hard_exit():  # JAX's one-process distributed runtime hangs at shutdown
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    raise typer.Exit(code)


def check_output_file(out: str, what: str = "--out") -> None:
    """An output FILE path: writable, not a directory (flint.guard.check_output_file)."""
    from flint.guard import check_output_file as check

    check(out, what)


def print_json(report) -> None:
    """The one JSON layout of every command's `--json`: sorted keys, indent 1."""
    print(json.dumps(report, sort_keys=True, indent=1))


def report_out(report, as_json: bool, render, wrote: str | None = None) -> None:
    """A command's report: JSON on stdout, or `render(report, console)` and a note of the
    file written on stderr."""
    if as_json:
        print_json(report)
        return
    render(report, Console())
    if wrote:
        err.print(wrote, markup=False, highlight=False)


def cost_model_option(spec: str | None):
    """`--cost-model package.module:factory` -> the factory (None: the built-in model)."""
    if spec is None:
        return None
    from flint.hardware_models.pluggable import load_cost_model_factory

    return load_cost_model_factory(spec)
