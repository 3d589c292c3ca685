"""`flint validate`: Flint's prediction against a real profiler trace, op by op and per step."""
from __future__ import annotations

from typing import Optional

import typer

from flint.cli._common import check_output_file, cost_model_option, report_out, run


def _graph(graph_path: Optional[str], model: Optional[str], devices: int, mesh: Optional[str],
           hardware: str):
    """The graph to compare with: a saved graph, the zoo step extracted now, or None (the
    trace carries its HLO)."""
    if graph_path:
        from flint.hlo.dump import is_hlo_target

        if is_hlo_target(graph_path):   # the XLA dump of the traced run, read as compiled
            from flint.frontends.hlo_dump import load_dump

            return load_dump(graph_path)       # compiled for the GPU its dump names
        from flint.graph import WorkloadGraph

        return WorkloadGraph.load(graph_path)
    if model:
        from flint.frontends.request import ExtractRequest, extract

        graph, _ = extract(ExtractRequest(model=model, devices=devices, mesh=mesh,
                                          hardware=hardware))
        return graph
    return None


def validate(
    graph: Optional[str] = typer.Argument(None, help="a saved graph (flint extract --out) or the "
                                          "run's XLA dump; "
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
    cost_model: Optional[str] = typer.Option(None, "--cost-model", metavar="MODULE:FACTORY",
                                             help="predict with a third-party cost model: "
                                             "package.module:factory (see README)"),
    xla_emitters: Optional[str] = typer.Option(
        None, help="an XLA program's GPU fusion emitters: mlir (XLA on CUDA since 2024, the "
                   "default) | legacy (the LLVM emitters before them)"),
    as_json: bool = typer.Option(False, "--json"),
):
    """Compare Flint's prediction with a real profiler trace, op by op and per step."""
    def go():
        from flint.hardware_models.spec import load_spec
        from flint.validate.report import render_validation, scatter_plot
        from flint.validate.trace_gpu import warn_if_other_gpu
        from flint.validate.workflow import open_input, run_validate

        factory = cost_model_option(cost_model)
        spec = load_spec(hardware, set_)
        if devices is not None:
            from flint.cluster import check_device_count

            check_device_count(devices)
        if plot:
            check_output_file(plot, "--plot")
        g = _graph(graph, model, devices or 8, mesh, target)
        inp = open_input(trace, g, spec.name, module, devices, xla_emitters)
        warn_if_other_gpu(inp.trace, spec)
        v = run_validate(inp, spec, steps, exclude, factory, hardware, set_)
        if plot:
            scatter_plot(v, plot)
        report_out(v.to_json(), as_json, lambda _, console: render_validation(v, console))

    run(go)
