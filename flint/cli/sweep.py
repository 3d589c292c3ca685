"""`flint sweep`: a design-space sweep from a YAML space file and/or flags."""
from __future__ import annotations

import statistics
from typing import Optional

import typer
from flint.cli._common import cost_model_option, err, report_out, run
from flint.errors import FlintError

EXECUTORS = ("local", "ray")


def _ints(text: str, name: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise FlintError(f"--{name} takes comma-separated integers, got {text!r}") from None


def _what_if(text: str) -> dict:
    """'nic_bandwidth=800Gb/s;hbm_bandwidth=4.8TB/s' -> one scenario ('' = baseline)."""
    out = {}
    for item in filter(None, (t.strip() for t in text.split(";"))):
        key, eq, value = item.partition("=")
        if not eq:
            raise FlintError(f"--what-if items look like field=value, got {item!r}")
        out[key.strip()] = value.strip()
    return out


def _space_doc(space_file, flags: dict) -> dict:
    doc = {}
    if space_file:
        import yaml

        from flint.io import read_text

        try:
            doc = yaml.safe_load(read_text(space_file, limit=2**20)) or {}
        except (yaml.YAMLError, RecursionError) as e:
            raise FlintError(f"{space_file} is not valid YAML: {str(e).splitlines()[0]}") from None
        if not isinstance(doc, dict):
            raise FlintError(f"{space_file} must hold a mapping of axes to values")
    doc.update({k: v for k, v in flags.items() if v not in (None, [], "")})
    return doc


def sweep(
    space_file: Optional[str] = typer.Argument(None, help="search space YAML (axes: devices, "
                                               "tp, pp, microbatch, remat, what_if, ...)"),
    out: str = typer.Option(..., "--out", help="output directory (cache, results, plots)"),
    model: Optional[str] = typer.Option(None, help="zoo model (default llama3-8b)"),
    devices: Optional[str] = typer.Option(None, help="device counts, e.g. 64,256,1024"),
    tp: Optional[str] = typer.Option(None, help="tensor-parallel degrees, e.g. 1,8"),
    pp: Optional[str] = typer.Option(None, help="pipeline-parallel degrees, e.g. 1,4"),
    microbatch: Optional[str] = typer.Option(None, help="sequences per microbatch per replica"),
    global_batch: Optional[int] = typer.Option(None, help="sequences per step (fixed)"),
    remat: Optional[str] = typer.Option(None, help="remat policies, e.g. none,full"),
    schedule: Optional[str] = typer.Option(None, help="pipeline schedules: gpipe,1f1b,"
                                                      "interleaved"),
    hardware: Optional[str] = typer.Option(None, help="hardware specs, e.g. h100-sxm,b200"),
    what_if: list[str] = typer.Option([], "--what-if", help="a hardware what-if scenario, "
                                      "e.g. 'nic_bandwidth=800Gb/s;hbm_bandwidth=4.8TB/s'; "
                                      "repeat for more; '' is the baseline"),
    budget: Optional[int] = typer.Option(None, help="evaluate a random subset of this size"),
    seed: Optional[int] = typer.Option(None, help="seed for --budget"),
    cost_model: Optional[str] = typer.Option(None, "--cost-model", metavar="MODULE:FACTORY",
                                             help="a third-party cost model: "
                                             "package.module:factory (see README)"),
    executor: str = typer.Option("local", help="local | ray"),
    workers: int = typer.Option(2, help="ray: worker processes"),
    as_json: bool = typer.Option(False, "--json", help="print the Pareto fronts as JSON"),
):
    """Sweep cluster size, parallelism, microbatching, remat and hardware what-ifs."""
    def go():
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        from flint.sweep import run_sweep
        from flint.sweep_report import pareto_front, render_front, write_outputs
        from flint.guard import check_output_dir
        from flint.sweep_space import Config, SearchSpace

        if executor not in EXECUTORS:
            raise FlintError(f"unknown --executor {executor!r}; use {' | '.join(EXECUTORS)}")
        if workers < 1:
            raise FlintError(f"--workers must be at least 1, not {workers}")
        check_output_dir(out)
        cost_model_option(cost_model)     # a bad --cost-model fails before the work
        flags = {"model": model, "global_batch": global_batch, "budget": budget, "seed": seed,
                 "devices": devices and _ints(devices, "devices"), "tp": tp and _ints(tp, "tp"),
                 "pp": pp and _ints(pp, "pp"),
                 "microbatch": microbatch and _ints(microbatch, "microbatch"),
                 "remat": remat and remat.split(","), "schedule": schedule and schedule.split(","),
                 "hardware": hardware and hardware.split(","),
                 "what_if": [_what_if(w) for w in what_if]}
        space = SearchSpace.from_dict(_space_doc(space_file, flags))
        configs, skipped = space.expand()
        err.print(f"{len(configs)} configurations ({len(skipped)} skipped as invalid), "
                  f"{len({c.program_key() for c in configs})} programs to extract")
        times = {"extract": [], "estimate": []}
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      console=err, transient=True) as progress:
            task = progress.add_task("sweeping", total=len(configs))

            def on_result(row, count, total):
                progress.update(task, completed=count)
                kind = "extract" if row.get("extracted") else "estimate"
                times[kind].append(row["time_s"])
                what = (f"{row['step_time_s'] * 1e3:9.1f} ms/step {row['memory_gib']:6.1f} GiB"
                        f"{' OOM' if row['oom'] else ''}" if row["status"] == "ok"
                        else f"{row['status']}: {row.get('error', '')}")
                label = Config.from_json(row).label()
                progress.console.print(f"[{count}/{total}] {row['time_s']:7.2f} s "
                                       f"{'(extracted) ' if kind == 'extract' else ''}"
                                       f"{label}: {what}", highlight=False)

            rows = run_sweep(space, out, executor, workers, on_result, cost_model)
        paths = write_outputs(out, rows)
        fronts = pareto_front(rows)
        for kind, values in times.items():
            if values:
                err.print(f"{len(values)} configurations with {kind}: median "
                          f"{statistics.median(values):.2f} s, max {max(values):.2f} s per "
                          f"configuration")
        report = {"pareto": {k: [r["key"] for r in v] for k, v in fronts.items()},
                  "configurations": len(rows), "outputs": paths}
        report_out(report, as_json, lambda _, console: render_front(fronts, console),
                   None if as_json else "wrote " + ", ".join(paths.values()))

    run(go)
