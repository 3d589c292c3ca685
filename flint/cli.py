"""`flint` command line (thin: parse flags, call the library, render)."""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Optional

import typer
from rich.console import Console

from flint.errors import FlintError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Flint: training step -> workload graph of a cluster of any size.")
err = Console(stderr=True)
REMAT_POLICIES = ("none", "full", "dots")


@app.callback()
def _root():
    """Flint: training step -> workload graph of a cluster of any size."""


@app.command()
def extract(
    target: Optional[str] = typer.Argument(
        None, help="SCRIPT.py:FUNCTION of a training step; default: the built-in --model"),
    devices: int = typer.Option(4096, "--devices", "-n", help="virtual cluster size"),
    mesh: Optional[str] = typer.Option(
        None, help="mesh axes, e.g. data=512,model=8 (default: fsdp=N/8,model=8 for zoo "
                   "models, data=N for scripts)"),
    hardware: str = typer.Option("h100-sxm", help="compile target (see `flint hardware`)"),
    model: str = typer.Option("llama3-8b", help="built-in model when no TARGET is given: a "
                              "zoo/preset name, a model YAML or a Hugging Face config.json"),
    model_config: Optional[str] = typer.Option(None, help="model YAML or HF config.json "
                                               "(same as --model FILE)"),
    dims_layers: Optional[int] = typer.Option(None, "--n-layers", help="model: layers"),
    dims_hidden: Optional[int] = typer.Option(None, "--hidden", help="model: hidden size"),
    dims_heads: Optional[int] = typer.Option(None, "--heads", help="model: attention heads"),
    dims_kv: Optional[int] = typer.Option(None, "--kv-heads", help="model: KV heads"),
    dims_ffn: Optional[int] = typer.Option(None, "--ffn", help="model: FFN hidden size"),
    dims_vocab: Optional[int] = typer.Option(None, "--vocab", help="model: vocabulary"),
    dims_norm: Optional[str] = typer.Option(None, "--norm", help="model: rms | layer"),
    dims_act: Optional[str] = typer.Option(None, "--activation", help="model: swiglu | gelu "
                                           "| relu2"),
    dims_pos: Optional[str] = typer.Option(None, "--positional", help="model: rope | learned"),
    gemm_precision: Optional[str] = typer.Option(None, help="zoo: GEMM operands bf16 | fp8 "
                                                 "| mxfp8"),
    scan: bool = typer.Option(True, "--scan/--unroll", help="zoo: layers in lax.scan or not"),
    layers: Optional[int] = typer.Option(None, help="zoo: override the layer count"),
    seq_len: Optional[int] = typer.Option(None, help="zoo: override the sequence length"),
    batch_per_replica: int = typer.Option(1, help="zoo: sequences per data-parallel replica"),
    remat: Optional[str] = typer.Option(None, help="zoo: none | full | dots | selective "
                                        "(default: selective for the built-in showcase)"),
    sequence_parallel: bool = typer.Option(False, help="zoo: shard activations' sequence dim "
                                                       "over the TP axis"),
    devices_per_host: Optional[int] = typer.Option(None, help="devices per host (GPU: 8)"),
    args_fn: str = typer.Option("example_args", help="script: function giving example args"),
    with_estimate: bool = typer.Option(False, "--estimate", help="also predict the step "
                                       "time with the built-in cost model"),
    set_: list[str] = typer.Option([], "--set", help="with --estimate: what-if, e.g. "
                                                     "nic_bandwidth=800Gb/s"),
    passes: str = typer.Option("", help="graph passes to run, e.g. 'expand-loops'"),
    dump_dir: Optional[str] = typer.Option(None, help="dump the graph as text after "
                                                      "lowering and after each pass"),
    out: Optional[str] = typer.Option(None, help="write the graph as JSON to this file"),
    as_json: bool = typer.Option(False, "--json", help="print the summary as JSON"),
    framework: str = typer.Option("jax", help="jax | torch (TARGET or --model); a .mlir "
                                  "TARGET is StableHLO"),
    fuse: bool = typer.Option(True, "--fuse/--no-fuse", help="torch: fuse pointwise chains "
                              "as torch.compile would"),
):
    """Compile a training step for N compile-only devices and build its workload graph."""
    dims = {k: v for k, v in dict(layers=dims_layers, hidden=dims_hidden, heads=dims_heads,
                                  kv_heads=dims_kv, ffn=dims_ffn, vocab=dims_vocab,
                                  norm=dims_norm, activation=dims_act,
                                  positional=dims_pos).items() if v is not None}
    model = model_config or model
    zoo_options = {"dims": dims, "gemm_precision": gemm_precision}
    _run(lambda: _extract(target, devices, mesh, hardware, model, scan, layers, seq_len,
                          batch_per_replica, remat, sequence_parallel, devices_per_host,
                          args_fn, out, as_json, passes, dump_dir, with_estimate, set_,
                          framework, fuse, zoo_options))


@app.command()
def estimate(
    graph_file: str = typer.Argument(..., help="a workload graph JSON (flint extract --out), "
                                               "a Chakra .et, or a directory of them"),
    hardware_name: Optional[str] = typer.Option(None, "--hardware", help="spec name or a "
                                                "spec YAML path (default: the graph's)"),
    set_: list[str] = typer.Option([], "--set", help="what-if, e.g. hbm_bandwidth=4.8TB/s"),
    algorithm: str = typer.Option("auto", help="collective algorithm: auto|ring|tree|"
                                               "hierarchical|direct"),
    trace: Optional[str] = typer.Option(None, help="write the predicted timeline "
                                                   "(Chrome/Perfetto trace JSON)"),
    plot: Optional[str] = typer.Option(None, help="write a PNG breakdown of the step"),
    backend: str = typer.Option("flint", help="flint | astra-sim: also run ASTRA-sim on a "
                                "Chakra export of the graph and compare the steps"),
    astra_sim: Optional[str] = typer.Option(None, "--astra-sim", help="ASTRA-sim binary or "
                                            "directory (default: $ASTRA_SIM, "
                                            "../shared/tools/astra-sim)"),
    as_json: bool = typer.Option(False, "--json", help="print the estimate as JSON"),
    routing: Optional[str] = typer.Option(None, help="MoE graphs: tokens per expert, "
                                          "balanced | zipf:S | imbalance:F | histogram:..."),
):
    """Predict the step time of a workload graph with the built-in cost model."""
    def go():
        from flint.cli_export import load_any_graph

        for flag, path in (("--trace", trace), ("--plot", plot)):
            if path:
                _check_output_dir(path, flag)
        graph = load_any_graph(graph_file)
        if routing:
            from flint.passes.moe_routing import MoeRouting

            graph = MoeRouting.for_graph(graph, routing).run(graph)
        if backend != "flint":
            from flint.exporters.astra_sim_run import report_second_opinion

            return report_second_opinion(graph, hardware_name, set_, backend, astra_sim,
                                         as_json)
        _estimate(graph, hardware_name, set_, algorithm, trace, as_json, plot)

    _run(go)


def _estimate(graph, hardware_name, overrides, algorithm, trace, as_json, plot=None):
    from flint.hardware_models.estimate import estimate as run_estimate
    from flint.hardware_models.network import ALGORITHMS

    if algorithm not in ALGORITHMS:
        raise FlintError(f"unknown collective algorithm {algorithm!r}; use {'|'.join(ALGORITHMS)}")
    result = run_estimate(graph, hardware_name, overrides, algorithm=algorithm)
    if trace:
        from flint.exporters.perfetto import write_timeline

        write_timeline(result.timeline, trace)
    if plot:
        from flint.exporters.plot import write_breakdown

        write_breakdown(result.to_json(), plot)
    report = result.to_json()
    if "moe_routing" in graph.meta:
        report["moe_routing"] = graph.meta["moe_routing"]
    if as_json:
        print(json.dumps(report, sort_keys=True, indent=1))
    else:
        from flint.render import render_estimate

        render_estimate(report, Console())
        if "moe_routing" in graph.meta:
            r = graph.meta["moe_routing"]
            Console().print(f"MoE routing {r['distribution']}: hottest expert "
                            f"{r['max_over_mean_expert']:.2f}x the mean, straggler EP rank "
                            f"{r['straggler_factor']:.2f}x a balanced rank's tokens; "
                            f"all-to-all {r['all_to_all_straggler_bytes_per_rank'] / 1e6:.2f} "
                            f"MB per rank (balanced "
                            f"{r['all_to_all_balanced_bytes_per_rank'] / 1e6:.2f} MB); "
                            f"dropped tokens {100 * r['dropped_token_share']:.1f}%")


@app.command()
def hardware():
    """List the compile targets Flint knows."""
    from flint.frontends.targets import ALIASES, known_hardware

    for name in known_hardware():
        aliases = [a for a, t in ALIASES.items() if t == name]
        print(name + (f"  (also: {', '.join(aliases)})" if aliases else ""))


def _extract(target, devices, mesh, hardware_name, model, scan, layers, seq_len,
             batch_per_replica, remat, sequence_parallel, devices_per_host, args_fn, out,
             as_json, passes="", dump_dir=None, with_estimate=False, overrides=(),
             framework="jax", fuse=True, zoo_options=None):
    from flint.frontends.targets import prepare_environment, resolve_target
    from flint.passes import parse_pipeline, run_pipeline

    from flint.cluster import check_device_count

    if framework not in ("jax", "torch"):
        raise FlintError(f"unknown --framework {framework!r}; use jax or torch")
    check_device_count(devices)
    if remat is not None and remat not in REMAT_POLICIES:
        raise FlintError(f"unknown --remat {remat!r}; use {' | '.join(REMAT_POLICIES)}")
    if devices_per_host is not None and devices_per_host < 1:
        raise FlintError(f"--devices-per-host must be at least 1, not {devices_per_host}")
    prepare_environment()
    resolve_target(hardware_name)  # fail fast on bad flags, before JAX starts
    pipeline = parse_pipeline(passes)
    if with_estimate or overrides:
        from flint.hardware_models.spec import load_spec
        from flint.hardware_models.topology import topology_for

        # bad --set values, or a cluster the devices do not fit, fail before compiling
        topology_for(load_spec(hardware_name, overrides), devices)
    for path in filter(None, (out, dump_dir and os.path.join(dump_dir, "x"))):
        _check_output_dir(path)
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    t_start = time.perf_counter()
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  console=err, transient=True, disable=not err.is_terminal) as progress:
        task = progress.add_task("starting JAX", total=None)

        def stage(text):
            progress.update(task, description=text)

        if framework == "torch" or (target or "").endswith((".mlir", ".mlirbc")):
            from flint.cli_targets import other_frontend_graph

            graph, timings = other_frontend_graph(
                target, framework, devices, mesh, hardware_name, model, layers, seq_len,
                batch_per_replica, devices_per_host, fuse, stage, bool(sequence_parallel))
        else:
            graph, timings = _jax_graph(target, devices, mesh, hardware_name, model, scan,
                                        layers, seq_len, batch_per_replica, remat,
                                        sequence_parallel, devices_per_host, args_fn, stage,
                                        zoo_options)
        dump = _dumper(dump_dir)
        dump(None, graph)
        graph = run_pipeline(graph, pipeline, callback=dump)
        if out:
            stage(f"writing {out}")
            graph.save(out)
    timings = dict(timings, total_s=time.perf_counter() - t_start)
    summary = graph.summary()
    predicted = None
    if with_estimate:
        from flint.hardware_models.estimate import estimate as run_estimate

        predicted = run_estimate(graph, None, overrides).to_json()
    if as_json:
        report = {"summary": summary, "timings_s": timings}
        if predicted is not None:
            report["estimate"] = predicted
        print(json.dumps(report, sort_keys=True, indent=1))
    else:
        from flint.render import render_estimate, render_summary

        render_summary(summary, Console(), timings)
        if predicted is not None:
            render_estimate(predicted, Console())
        if out:
            err.print(f"wrote {out} ({os.path.getsize(out) / 2**20:.2f} MiB)",
                      markup=False)


def _jax_graph(target, devices, mesh, hardware_name, model, scan, layers, seq_len,
               batch_per_replica, remat, sequence_parallel, devices_per_host, args_fn, stage,
               zoo_options=None):
    from flint.cli_targets import captured_step

    step, args, label, info = captured_step(target, devices, mesh, hardware_name, model,
                                            scan, layers, seq_len, batch_per_replica,
                                            remat, sequence_parallel, devices_per_host,
                                            args_fn, **(zoo_options or {}))
    stage(f"tracing and lowering {label} for {devices} devices")
    lowered = step.lower(*args)
    stage(f"compiling with XLA for {devices} x {step.cfg.hardware} (no hardware runs)")
    compiled = lowered.compile()
    stage("lowering optimized HLO into the workload graph")
    graph = compiled.workload()
    graph.meta["model"] = label
    if info.get("model_flops"):
        graph.meta["model_flops_per_device"] = info["model_flops"] / devices
        if info.get("experts"):
            graph.meta["moe"] = {k: info[k] for k in ("experts", "top_k", "ep",
                                                      "capacity_factor")}
    return graph, compiled.timings


def _dumper(dump_dir):
    """Callback writing `00-lower-hlo.txt`, `01-<pass>.txt`, ... into dump_dir."""
    from flint.io import write_atomic

    count = [0]

    def dump(p, graph):
        if dump_dir:
            name = p.name if p is not None else "lower-hlo"
            write_atomic(os.path.join(dump_dir, f"{count[0]:02d}-{name}.txt"), graph.as_text())
        count[0] += 1

    return dump


def _check_output_dir(out: str, what: str = "--out") -> None:
    """An output FILE path: writable, not a directory (flint.guard.check_output_file)."""
    from flint.guard import check_output_file

    check_output_file(out, what)


def report_out(report: dict, as_json: bool, render, wrote: str | None = None) -> None:
    """A command's report: JSON on stdout, or `render(report, console)` and a note of the
    file written on stderr."""
    if as_json:
        print(json.dumps(report, sort_keys=True, indent=1))
        return
    render(report, Console())
    if wrote:
        err.print(wrote, markup=False, highlight=False)


def _run(fn) -> None:
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


if __name__ == "__main__":
    # `python -m flint.cli`: run the app of the importable module, on which the commands
    # of the other CLI modules (flint.cli_validate) registered themselves.
    from flint.cli import main as _main

    _main()


# Registers `flint validate`, `calibrate`, `export`, `import`, `sweep`, `replay`, `rescale`,
# `anonymize` (and others) on `app`.
from flint import (cli_anonymize, cli_export, cli_place, cli_replay,  # noqa: E402,F401
                   cli_rescale, cli_sweep, cli_validate)
