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


def _axis(text: str):
    """'tp=1,2,4' -> ('tp', [1, 2, 4]); values are YAML scalars."""
    import yaml

    name, eq, values = text.partition("=")
    if not eq or not name.strip():
        raise FlintError(f"--axis takes FIELD=V1,V2,..., got {text!r}")
    try:
        return name.strip(), [yaml.safe_load(v) for v in values.split(",") if v.strip()]
    except yaml.YAMLError:
        raise FlintError(f"--axis {text!r}: values are plain words or numbers") from None


def sweep(
    space_file: Optional[str] = typer.Argument(None, help="search space YAML: TrainingRun "
                                               "fields (one value or a list) and what_if"),
    out: str = typer.Option(..., "--out", help="output directory (cache, results, plots)"),
    model: Optional[str] = typer.Option(None, help="model preset/zoo name, YAML or HF "
                                        "config.json"),
    seq_len: Optional[int] = typer.Option(None, help="training sequence length (tokens)"),
    devices: Optional[str] = typer.Option(None, help="device counts, e.g. 64,256,1024"),
    tp: Optional[str] = typer.Option(None, help="tensor-parallel degrees, e.g. 1,8"),
    cp: Optional[str] = typer.Option(None, help="context-parallel degrees"),
    pp: Optional[str] = typer.Option(None, help="pipeline-parallel degrees, e.g. 1,4"),
    vp: Optional[str] = typer.Option(None, help="virtual stages per pipeline stage"),
    ep: Optional[str] = typer.Option(None, help="expert-parallel degrees (MoE models)"),
    zero: Optional[str] = typer.Option(None, help="ZeRO stages, e.g. 1,3"),
    micro_batch: Optional[str] = typer.Option(None, help="sequences per micro-batch per "
                                              "data-parallel rank"),
    global_batch: Optional[int] = typer.Option(None, help="sequences per step (fixed)"),
    remat: Optional[str] = typer.Option(None, help="remat policies, e.g. selective,full"),
    precision: Optional[str] = typer.Option(None, help="GEMM precisions, e.g. bf16,fp8"),
    schedule: Optional[str] = typer.Option(None, help="pipeline schedules: gpipe,1f1b,"
                                                      "interleaved"),
    hardware: Optional[str] = typer.Option(None, help="hardware specs, e.g. h100-sxm,b200"),
    axis: list[str] = typer.Option([], "--axis", help="any TrainingRun field as an axis, "
                                   "e.g. --axis framework=megatron,xla (repeat for more)"),
    what_if: list[str] = typer.Option([], "--what-if", help="a hardware what-if scenario, "
                                      "e.g. 'nic_bandwidth=800Gb/s;hbm_bandwidth=4.8TB/s'; "
                                      "repeat for more; '' is the baseline"),
    budget: Optional[int] = typer.Option(None, help="price a random subset of this size"),
    seed: Optional[int] = typer.Option(None, help="seed for --budget"),
    cost_model: Optional[str] = typer.Option(None, "--cost-model", metavar="MODULE:FACTORY",
                                             help="a third-party cost model: "
                                             "package.module:factory (see README)"),
    executor: str = typer.Option("local", help="local | ray"),
    workers: int = typer.Option(2, help="ray: worker processes"),
    as_json: bool = typer.Option(False, "--json", help="print the Pareto fronts as JSON"),
):
    """Sweep training configurations (any TrainingRun field) and hardware what-ifs."""
    def go():
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
        from rich.progress import TimeRemainingColumn

        from flint.guard import check_output_dir
        from flint.sweep import run_sweep
        from flint.sweep_report import pareto_front, render_front, write_outputs
        from flint.sweep_space import SearchSpace

        if executor not in EXECUTORS:
            raise FlintError(f"unknown --executor {executor!r}; use {' | '.join(EXECUTORS)}")
        if workers < 1:
            raise FlintError(f"--workers must be at least 1, not {workers}")
        check_output_dir(out)
        cost_model_option(cost_model)     # a bad --cost-model fails before the work
        words = lambda text: text and text.split(",")  # noqa: E731
        flags = {"model": model, "seq_len": seq_len, "global_batch": global_batch,
                 "budget": budget, "seed": seed,
                 "devices": devices and _ints(devices, "devices"), "tp": tp and _ints(tp, "tp"),
                 "cp": cp and _ints(cp, "cp"), "pp": pp and _ints(pp, "pp"),
                 "vp": vp and _ints(vp, "vp"), "ep": ep and _ints(ep, "ep"),
                 "zero": zero and _ints(zero, "zero"),
                 "micro_batch": micro_batch and _ints(micro_batch, "micro-batch"),
                 "remat": words(remat), "precision": words(precision),
                 "schedule": words(schedule), "hardware": words(hardware),
                 "what_if": [_what_if(w) for w in what_if]}
        flags.update(dict(_axis(a) for a in axis))
        space = SearchSpace.from_dict(_space_doc(space_file, flags))
        points, skipped = space.expand()
        err.print(f"{_configurations(len(points))} ({len(skipped)} skipped as invalid)",
                  highlight=False)
        if not points:
            _report_invalid(skipped)
        times = {"extract": [], "estimate": []}
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeRemainingColumn(), console=err, transient=True) as progress:
            task = progress.add_task("sweeping", total=len(points))

            def on_result(row, count, total):
                progress.update(task, completed=count)
                kind = "extract" if row.get("extracted") else "estimate"
                times[kind].append(row["time_s"])
                what = (f"{row['step_time_s'] * 1e3:9.1f} ms/step {row['memory_gib']:6.1f} GiB"
                        f"{' OOM' if row['oom'] else ''}" if row["status"] == "ok"
                        else f"{row['status']}: {row.get('error', '')}")
                progress.console.print(f"[{count}/{total}] {row['time_s']:7.2f} s "
                                       f"{'(compiled) ' if kind == 'extract' else ''}"
                                       f"{_label(row)}: {what}", highlight=False, markup=False)

            rows = run_sweep(space, out, executor, workers, on_result, cost_model)
        failed = [r for r in rows if r["status"] != "ok"]
        if rows and len(failed) == len(rows):       # every point failed when priced
            _report_invalid([{"reason": r.get("error") or r["status"]} for r in failed])
        paths = write_outputs(out, rows, skipped)
        fronts = pareto_front(rows)
        here = sum(len(v) for v in times.values())
        if here < len(rows):     # resumed, or another sweep on this directory priced them
            err.print(f"{_configurations(len(rows) - here)} read from {out}/results.jsonl "
                      f"(priced by an earlier or a concurrent sweep), not priced again",
                      highlight=False, markup=False)
        for kind, values in times.items():
            if values:
                err.print(f"{_configurations(len(values))} with "
                          f"{'a compile' if kind == 'extract' else 'pricing only'}: median "
                          f"{statistics.median(values):.2f} s, max {max(values):.2f} s per "
                          f"configuration", highlight=False)
        report = {"pareto": {k: [r["key"] for r in v] for k, v in fronts.items()},
                  "configurations": len(rows), "priced": len(rows) - len(failed),
                  "skipped": len(skipped), "outputs": paths}
        report_out(report, as_json, lambda _, console: render_front(fronts, console),
                   None if as_json else "wrote " + ", ".join(paths.values()))

    run(go)


def _label(row: dict) -> str:
    from flint.sweep_space import SweepPoint
    from flint.run import TrainingRun

    fields = {k: row[k] for k in TrainingRun.__dataclass_fields__}
    return SweepPoint(TrainingRun.from_json(fields), tuple(sorted(row["what_if"].items()))).label()


def _report_invalid(skipped: list[dict]) -> None:
    """Every point is invalid: the reasons, most common first (the sweep still writes its
    tables, which list them)."""
    reasons: dict[str, int] = {}
    for s in skipped:
        reasons[s["reason"]] = reasons.get(s["reason"], 0) + 1
    err.print("no valid configuration; why:", highlight=False)
    for why, n in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))[:10]:
        err.print(f"  {n:5d} x {why}", highlight=False, markup=False)


def _configurations(n: int) -> str:
    return f"{n} configuration{'' if n == 1 else 's'}"
