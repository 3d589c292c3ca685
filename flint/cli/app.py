"""The `flint` command: every command registered here, in the order `flint --help` lists
them (build a graph, predict, export, check against reality, explore, transform, tools).
Each command's module only parses options, calls the library and renders the report."""
from __future__ import annotations

import sys

import typer

from flint.cli.anonymize import anonymize_command
from flint.cli.calibrate import calibrate
from flint.cli.estimate import estimate
from flint.cli.export import export
from flint.cli.extract import extract
from flint.cli.hardware import hardware
from flint.cli.import_chakra import import_
from flint.cli.models import models
from flint.cli.place import place_command
from flint.cli.plan import plan
from flint.cli.predict import predict
from flint.cli.replay import replay_command
from flint.cli.rescale import rescale_command
from flint.cli.sweep import sweep
from flint.cli.validate import validate

HELP = "Flint: training step -> workload graph of a cluster of any size."
# (name, function, the one-line summary `flint --help` shows; `flint NAME --help` shows the
# function's whole docstring)
COMMANDS = (
    ("predict", predict, "Predict one training configuration's step, memory, MFU."),
    ("extract", extract, "Compile a training step for N virtual devices -> workload graph."),
    ("estimate", estimate, "Predict a graph's step time (built-in or --cost-model)."),
    ("export", export, "Write a graph as Chakra ETs + ASTRA-sim inputs, JSON or Perfetto."),
    ("import", import_, "Read Chakra execution traces into a workload graph."),
    ("validate", validate, "Compare the prediction with a real profiler trace."),
    ("calibrate", calibrate, "Fit efficiencies to traces; write a calibrated spec YAML."),
    ("sweep", sweep, "Sweep training configurations (any run field) and what-ifs."),
    ("plan", plan, "Find the fastest layout of a model on a cluster; hardware co-design."),
    ("place", place_command, "Place operators on memory-limited devices (Baechi)."),
    ("rescale", rescale_command, "Re-target a graph to another cluster size."),
    ("anonymize", anonymize_command, "Strip names from a graph, keeping its step time."),
    ("replay", replay_command, "Write a runnable JAX benchmark replaying a graph."),
    ("models", models, "List the model presets and zoo models with their dims."),
    ("hardware", hardware, "List the hardware specs and the compile target each uses."),
)

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help=HELP)


@app.callback()
def _root():
    """Flint: training step -> workload graph of a cluster of any size."""


for _name, _function, _summary in COMMANDS:
    app.command(name=_name, short_help=_summary)(_function)


def main(argv: list[str] | None = None) -> None:
    """The `flint` entry point (tests call it in-process with `argv`). A bad flag is one
    line and exit 2, like every other bad input; help and --help print as usual."""
    from typer import _click as click   # typer's own click, whose exceptions it raises

    from flint.guard import (INTERRUPTED_EXIT, error_line, install_signal_handlers, interrupted,
                             interrupt_reported, restore_signal_handlers)

    previous = install_signal_handlers()
    try:
        code = app(args=argv, prog_name="flint", standalone_mode=False)
        if code == INTERRUPTED_EXIT and not interrupt_reported():
            interrupted()   # typer turns Ctrl-C while it parses into a silent exit 130
    except click.exceptions.NoArgsIsHelpError as e:
        click.echo(e.ctx.get_help() if e.ctx else str(e))
        code = 0
    except click.exceptions.UsageError as e:
        where = f" (see: {e.ctx.command_path} --help)" if e.ctx else ""
        error_line(e.format_message() + where)
        code = 2
    except (KeyboardInterrupt, typer.Abort):   # before a command's own handler
        interrupted()
        code = INTERRUPTED_EXIT
    finally:
        restore_signal_handlers(previous)
    sys.exit(code if isinstance(code, int) else 0)
