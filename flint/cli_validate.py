"""`flint validate` and `flint calibrate` (registered on the main app)."""
from __future__ import annotations

import json
import os
import sys
from typing import Optional

import typer
from rich.console import Console

from flint.cli import _check_output_dir, _run, app, err
from flint.errors import FlintError


def _graph(graph_path: Optional[str], model: Optional[str], devices: int, mesh: Optional[str],
           hardware: str):
    """The graph to compare with: a saved graph, the zoo step extracted now, or None (the
    trace carries its HLO)."""
    if graph_path:
        from flint.graph import WorkloadGraph

        return WorkloadGraph.load(graph_path)
    if model:
        from flint.cli_targets import captured_step
        from flint.frontends.targets import prepare_environment

        prepare_environment()
        step, args, _, info = captured_step(None, devices, mesh, hardware, model, True, None,
                                            None, 1, None, False, None, "example_args")
        graph = step.workload(*args)
        graph.meta["model_flops_per_device"] = info["model_flops"] / devices
        return graph
    return None


def warn_if_other_gpu(trace, spec) -> None:
    """One line on stderr when the trace's recorded GPU is not the spec's."""
    from flint.validate.trace_gpu import gpu_mismatch

    line = gpu_mismatch(trace.hardware, trace.hardware_memory_bytes, spec)
    if line:
        print(f"{line} ({trace.path})", file=sys.stderr, flush=True)


@app.command()
def validate(
    graph: Optional[str] = typer.Argument(None, help="a saved graph (flint extract --out); "
                                          "omit for an nsys-jax archive, which ships its HLO"),
    trace: list[str] = typer.Option(..., help="nsys-jax .zip, JAX profiler trace/log dir, "
                                    "xplane.pb, Kineto JSON; repeat for the per-process "
                                    "nsys-jax archives of one multi-process run"),
    hardware: str = typer.Option("h100-sxm", help="spec name or calibrated .yaml"),
    set_: list[str] = typer.Option([], "--set", help="what-if, e.g. hbm_bandwidth=3TB/s"),
    steps: Optional[str] = typer.Option(None, help="step numbers, e.g. 2-5 (default: all "
                                        "but warm-up)"),
    exclude: list[str] = typer.Option([], help="op name (substring) left out of both sides, "
                                      "e.g. a known data-dependent outlier"),
    module: Optional[str] = typer.Option(None, help="XLA module in the trace (default: the "
                                         "one with the most GPU time)"),
    model: Optional[str] = typer.Option(None, help="instead of GRAPH: extract this zoo model"),
    devices: Optional[int] = typer.Option(None, help="device count of the run (default: "
                                          "what the HLO and trace show; with --model: 8)"),
    mesh: Optional[str] = typer.Option(None, help="with --model: mesh"),
    target: str = typer.Option("cpu", help="with --model: compile target"),
    plot: Optional[str] = typer.Option(None, help="write a predicted-vs-measured PNG"),
    as_json: bool = typer.Option(False, "--json"),
):
    """Compare Flint's prediction with a real profiler trace, op by op and per step."""
    def go():
        from flint.hardware_models.spec import load_spec
        from flint.validate.report import render_validation, scatter_plot
        from flint.validate.workflow import open_input, run_validate

        spec = load_spec(hardware, set_)
        if devices is not None:
            from flint.cluster import check_device_count

            check_device_count(devices)
        if plot:
            _check_output_dir(plot, "--plot")
        g = _graph(graph, model, devices or 8, mesh, target)
        inp = open_input(trace, g, spec.name, module, devices)
        warn_if_other_gpu(inp.trace, spec)
        v = run_validate(inp, spec, steps, exclude)
        if plot:
            scatter_plot(v, plot)
        if as_json:
            print(json.dumps(v.to_json(), indent=1, sort_keys=True))
        else:
            render_validation(v, Console())
    _run(go)


@app.command()
def calibrate(
    trace: list[str] = typer.Option(..., help="trace(s) to fit on (repeatable)"),
    graph: list[str] = typer.Option([], help="graph per trace, in order (nsys-jax archives "
                                    "and NCCL-only Kineto traces need none)"),
    hardware: str = typer.Option("h100-sxm", help="the spec to calibrate"),
    out: str = typer.Option(..., help="calibrated spec to write (.yaml)"),
    fit_steps: Optional[str] = typer.Option(None, help="steps to fit on, e.g. 2-3"),
    check_steps: Optional[str] = typer.Option(None, help="held-out steps, e.g. 4-5"),
    exclude: list[str] = typer.Option([], help="op name (substring) not fitted nor scored"),
    module: Optional[str] = typer.Option(None),
    as_json: bool = typer.Option(False, "--json"),
):
    """Fit efficiencies (per op class, per network level) to traces; write a spec YAML."""
    def go():
        from flint.graph import WorkloadGraph
        from flint.hardware_models.spec import load_spec
        from flint.validate.report import render_calibration
        from flint.validate.workflow import open_input, run_calibrate, write_calibrated_spec

        if not out.endswith((".yaml", ".yml")):
            raise FlintError(f"--out {out!r}: a calibrated spec is a .yaml file")
        _check_output_dir(out)
        spec = load_spec(hardware)
        if len(graph) > len(trace):
            raise FlintError(f"{len(graph)} --graph for {len(trace)} --trace")
        graphs = [WorkloadGraph.load(g) for g in graph] + [None] * (len(trace) - len(graph))
        inputs = [open_input(t, g, spec.name, module) for t, g in zip(trace, graphs)]
        for inp in inputs:
            warn_if_other_gpu(inp.trace, spec)
        report = run_calibrate(inputs, spec, fit_steps, check_steps, exclude)
        write_calibrated_spec(hardware, report.calibration, out, trace)
        if as_json:
            print(json.dumps({"out": out, "efficiency": report.calibration.efficiency,
                              "hardware": report.calibration.hardware,
                              "notes": report.calibration.notes, "rows": report.rows},
                             indent=1, sort_keys=True))
        else:
            render_calibration(report, Console())
            err.print(f"wrote {out} ({os.path.getsize(out)} B): use --hardware {out}",
                      markup=False)
    _run(go)
