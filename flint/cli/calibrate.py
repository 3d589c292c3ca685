"""`flint calibrate`: efficiencies (per op class, per network level) fitted to traces,
written as a spec YAML that --hardware then takes."""
from __future__ import annotations

import os
from typing import Optional

import typer

from flint.cli._common import check_output_file, err, report_out, run
from flint.errors import FlintError


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
    xla_emitters: Optional[str] = typer.Option(
        None, help="an XLA program's GPU fusion emitters: mlir (XLA on CUDA since 2024, the "
                   "default) | legacy (the LLVM emitters before them)"),
    as_json: bool = typer.Option(False, "--json"),
):
    """Fit efficiencies (per op class, per network level) to traces; write a spec YAML."""
    def go():
        from flint.graph import WorkloadGraph
        from flint.hardware_models.spec import load_spec
        from flint.validate.report import render_calibration
        from flint.validate.trace_gpu import warn_if_other_gpu
        from flint.validate.workflow import open_input, run_calibrate, write_calibrated_spec

        if not out.endswith((".yaml", ".yml")):
            raise FlintError(f"--out {out!r}: a calibrated spec is a .yaml file")
        check_output_file(out)
        spec = load_spec(hardware)
        if len(graph) > len(trace):
            raise FlintError(f"{len(graph)} --graph for {len(trace)} --trace")
        graphs = [WorkloadGraph.load(g) for g in graph] + [None] * (len(trace) - len(graph))
        inputs = [open_input(t, g, spec.name, module, xla_emitters=xla_emitters)
                  for t, g in zip(trace, graphs)]
        for inp in inputs:
            warn_if_other_gpu(inp.trace, spec)
        report = run_calibrate(inputs, spec, fit_steps, check_steps, exclude)
        write_calibrated_spec(hardware, report.calibration, out, trace)
        summary = {"out": out, "efficiency": report.calibration.efficiency,
                   "hardware": report.calibration.hardware,
                   "notes": report.calibration.notes, "rows": report.rows}
        report_out(summary, as_json, lambda _, console: render_calibration(report, console))
        if not as_json:
            err.print(f"wrote {out} ({os.path.getsize(out)} B): use --hardware {out}",
                      markup=False)

    run(go)
