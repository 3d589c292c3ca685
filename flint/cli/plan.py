"""`flint plan`: the fastest layout of a model on a cluster (ranked, explained, priced by
the engine), and with --what-if which hardware change buys the most."""
from __future__ import annotations

import re
import time
from typing import Optional

import typer

from flint.cli._common import check_output_file, cost_model_option, err, report_out, run
from flint.errors import FlintError

EXECUTORS = ("local", "ray")


def _ints(text: Optional[str], name: str):
    if not text:
        return None
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise FlintError(f"--{name} takes comma-separated integers, got {text!r}") from None
    if not values or min(values) < 0:
        raise FlintError(f"--{name} takes comma-separated non-negative integers, got {text!r}")
    return values


def _words(text: Optional[str], name: str, allowed: tuple):
    if not text:
        return None
    values = tuple(w.strip() for w in text.split(",") if w.strip())
    for v in values:
        if v not in allowed:
            raise FlintError(f"--{name}: {v!r} is not one of {', '.join(allowed)}")
    return values


def parse_devices(text: str) -> tuple:
    """'1024', '256,512,1024' or '256-1024' (the powers of two between, ends included)."""
    m = re.fullmatch(r"\s*(\d+)\s*-\s*(\d+)\s*", text or "")
    if m:
        lo, hi = int(m.group(1)), int(m.group(2))
        if not 0 < lo <= hi:
            raise FlintError(f"--devices {text!r}: a range is LOW-HIGH with 0 < LOW <= HIGH")
        out, v = {lo, hi}, 1
        while v <= hi:
            if v > lo:
                out.add(v)
            v *= 2
        return tuple(sorted(out))
    values = _ints(text, "devices")
    if not values or min(values) < 1:
        raise FlintError(f"--devices takes a count, a list (64,128) or a range (64-1024), "
                         f"got {text!r}")
    return tuple(sorted(set(values)))


def parse_tokens(text: str) -> int:
    """'8M', '4194304', '2.5k' -> tokens."""
    m = re.fullmatch(r"\s*([\d.]+)\s*([kKmMgG]?)\s*", text or "")
    if not m:
        raise FlintError(f"--global-batch-tokens takes a number of tokens like 4M, got {text!r}")
    scale = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2).lower()]
    return int(round(float(m.group(1)) * scale))


def parse_budget(text: Optional[str]):
    """'40' (candidates priced) or '300s' / '5m' (wall time) -> (candidates, seconds)."""
    if not text:
        return None, None
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(s|m|min)?\s*", text)
    if not m:
        raise FlintError(f"--budget takes a number of candidates (40) or a time (300s, 5m), "
                         f"got {text!r}")
    value = float(m.group(1))
    if not m.group(2):
        if value < 1 or value != int(value):
            raise FlintError(f"--budget: {text!r} candidates must be a whole number >= 1")
        return int(value), None
    return None, value * (60 if m.group(2) in ("m", "min") else 1)


def plan(
    model: str = typer.Option(..., help="preset/zoo name (`flint models`), a model YAML or a "
                              "Hugging Face config.json"),
    devices: str = typer.Option(..., "--devices", "-n", help="GPUs: a count, a list "
                                "(256,512) or a range (256-1024: powers of two between)"),
    seq_len: int = typer.Option(..., help="training sequence length (tokens)"),
    global_batch: Optional[int] = typer.Option(None, help="sequences per step"),
    global_batch_tokens: Optional[str] = typer.Option(None, help="tokens per step (e.g. "
                                                      "8M): sequences = tokens / seq-len"),
    hardware: str = typer.Option("h100-sxm", help="hardware spec (`flint hardware`)"),
    devices_per_host: Optional[int] = typer.Option(None, help="GPUs per host (default: "
                                                   "the spec's)"),
    precision: str = typer.Option("bf16", help="precisions the plan may use, e.g. bf16,fp8"),
    tp: Optional[str] = typer.Option(None, help="pin tensor-parallel degrees, e.g. 4,8"),
    cp: Optional[str] = typer.Option(None, help="pin context-parallel degrees"),
    pp: Optional[str] = typer.Option(None, help="pin pipeline degrees"),
    vp: Optional[str] = typer.Option(None, help="pin virtual stages per pipeline stage"),
    ep: Optional[str] = typer.Option(None, help="pin expert-parallel degrees (MoE)"),
    zero: Optional[str] = typer.Option(None, help="ZeRO stages to consider (default 1,3)"),
    hsdp: Optional[str] = typer.Option(None, help="shard-group sizes: zero 3's FSDP groups, "
                                       "zero 1/2's optimizer groups (0 = all of DP)"),
    micro_batch: Optional[str] = typer.Option(None, help="micro-batch sizes (default "
                                              "1,2,4,8)"),
    remat: Optional[str] = typer.Option(None, help="remat policies (default none,selective,"
                                        "full)"),
    dispatcher: str = typer.Option("alltoall", help="MoE token dispatcher: alltoall | deepep"),
    set_: list[str] = typer.Option([], "--set", help="plan under a hardware what-if, e.g. "
                                   "nic_bandwidth=800Gb/s (repeat for more)"),
    what_if: list[str] = typer.Option([], "--what-if", help="co-design: re-plan at each "
                                      "point of a knob: KNOB (x0.5 and x2), KNOB=V1,V2, or "
                                      "all; knobs: peak_bf16, peak_fp8, hbm_bandwidth, "
                                      "hbm_capacity, scale_up_bandwidth, scale_up_domain, "
                                      "nic_bandwidth, oversubscription, devices"),
    top: int = typer.Option(10, help="rows of the ranked table"),
    budget: Optional[str] = typer.Option(None, help="candidates to price (e.g. 40) or wall "
                                         "time (e.g. 300s); default 24 candidates"),
    programs: int = typer.Option(8, help="distinct stage programs the plan may price "
                                 "(compiled or cached alike)"),
    margin: float = typer.Option(0.10, help="stop when no unpriced layout is estimated "
                                 "within this fraction of the best"),
    out: Optional[str] = typer.Option(None, "--out", help="output directory: results.jsonl "
                                      "(resume an interrupted plan), plan.json"),
    cache: Optional[str] = typer.Option(None, help="stage-program cache (default: "
                                        "$FLINT_CACHE or ~/.cache/flint)"),
    executor: str = typer.Option("local", help="local | ray (one task per stage program)"),
    workers: int = typer.Option(2, help="ray: worker processes"),
    report: Optional[str] = typer.Option(None, "--report", help="write a one-file HTML "
                                         "report (opens offline)"),
    cost_model: Optional[str] = typer.Option(None, "--cost-model", metavar="MODULE:FACTORY",
                                             help="a third-party cost model"),
    as_json: bool = typer.Option(False, "--json", help="print the plan as JSON"),
):
    """Plan a training run: search TP (with SP), CP, PP x VP x schedule, EP, data
    parallelism with ZeRO/FSDP, micro-batch, remat and precision; prune by divisibility and
    a memory floor, rank with a closed form from the spec's figures, price the best with
    the engine (`flint predict`'s number), and explain the winner. With --what-if, re-plan
    at each hardware point and rank the knobs by how much they move the best step."""
    def go():
        from flint.plan_search import Budget
        from flint.plan_space import PlanRequest

        if executor not in EXECUTORS:
            raise FlintError(f"unknown --executor {executor!r}; use {' | '.join(EXECUTORS)}")
        if workers < 1 or top < 1 or programs < 0 or not 0 <= margin <= 10:
            raise FlintError("--workers and --top must be >= 1, --programs >= 0, --margin "
                             "in 0..10")
        if report:
            check_output_file(report, "--report")
        if out:
            from flint.guard import check_output_dir

            check_output_dir(out)
        factory = cost_model_option(cost_model)
        if (global_batch is None) == (global_batch_tokens is None):
            raise FlintError("give the global batch: --global-batch SEQUENCES or "
                             "--global-batch-tokens TOKENS")
        gbs = global_batch
        if global_batch_tokens is not None:
            tokens = parse_tokens(global_batch_tokens)
            if tokens % seq_len:
                raise FlintError(f"--global-batch-tokens {global_batch_tokens}: {tokens} "
                                 f"tokens are not whole sequences of {seq_len}")
            gbs = tokens // seq_len
        from flint.models import OFFLOADED_NAMES, REMAT_POLICIES

        # the planner's analytic model keeps activations on the device: a host-offload
        # policy is priced by `flint predict`, not planned
        planned_remats = tuple(r for r in REMAT_POLICIES if r not in OFFLOADED_NAMES)
        from flint.run_schema import PRECISIONS

        request = PlanRequest(
            model=model, devices=parse_devices(devices), seq_len=seq_len, global_batch=gbs,
            hardware=hardware, devices_per_host=devices_per_host or 0, dispatcher=dispatcher,
            what_if=tuple(set_), tp=_ints(tp, "tp"), cp=_ints(cp, "cp"), pp=_ints(pp, "pp"),
            vp=_ints(vp, "vp"), ep=_ints(ep, "ep"), zero=_ints(zero, "zero"),
            hsdp=_ints(hsdp, "hsdp"), micro_batch=_ints(micro_batch, "micro-batch"),
            remat=_words(remat, "remat", planned_remats),
            precision=_words(precision, "precision", PRECISIONS) or ("bf16",))
        _check_run_fields(request)
        n, seconds = parse_budget(budget)
        the_budget = Budget(candidates=n or Budget.candidates, seconds=seconds or 0.0,
                            programs=programs, margin=margin)
        _plan(request, the_budget, out, cache, factory if factory else None, cost_model,
              executor, workers, what_if, report, top, as_json)

    run(go)


def _check_run_fields(request) -> None:
    """The fixed fields (model, spec, what-ifs, sequence) are checked once up front, as a
    run would be, so a typo is one line before any work."""
    from flint.hardware_models.spec import load_spec
    from flint.frontends.targets import resolve_target
    from flint.plan_space import model_config

    model_config(request)
    try:
        resolve_target(request.hardware)
        load_spec(request.hardware, list(request.what_if))
    except FlintError as e:
        raise FlintError(f"hardware: {e}") from None


def _plan(request, budget, out, cache, factory, cost_model_name, executor, workers,
          what_if, report, top, as_json) -> None:
    from pathlib import Path

    from flint.plan_explain import render, report as plan_report
    from flint.plan_search import search

    t0 = time.perf_counter()
    progress, on_event = _progress()
    kw = dict(out=out, cache=cache, cost_model=cost_model_name if executor == "ray" else factory,
              executor=executor, workers=workers)
    study = None
    try:
        with progress:
            if what_if:
                from flint.hardware_models.spec import load_spec
                from flint.plan_whatif import codesign, knob_points

                spec = load_spec(request.hardware, list(request.what_if))
                points = knob_points(spec, what_if, request.devices[0])
                study = codesign(request, points, budget, on_event=on_event, **kw)
                result = study.baseline
            else:
                result = search(request, budget, on_event=on_event, **kw)
    except KeyboardInterrupt:
        if out:
            err.print(f"kept the priced candidates in {out}/results.jsonl; the same command "
                      f"resumes", markup=False, highlight=False, soft_wrap=True)
        raise
    doc = plan_report(result, top)
    if study is not None:
        doc["sensitivity"] = study.sensitivity
        doc["points"] = [{"knob": p.knob, "value": p.text,
                          "winner": r.winner if not isinstance(r, Exception) else None,
                          "error": str(r) if isinstance(r, Exception) else None}
                         for p, r in study.points]
    wrote = []
    if out:
        import json

        from flint.io import write_atomic

        write_atomic(Path(out) / "plan.json", json.dumps(doc, sort_keys=True, indent=1) + "\n")
        wrote.append(str(Path(out) / "plan.json"))
    if report:
        from flint.io import write_atomic
        from flint.plan_html import render_html

        timeline = _winner_timeline(result, cache, factory) if result.winner else None
        write_atomic(report, render_html(doc, timeline, doc.get("sensitivity")))
        wrote.append(report)

    def show(d, console):
        render(d, console, top)
        if study is not None:
            from flint.plan_whatif import render_sensitivity

            render_sensitivity(study.sensitivity, console)

    report_out(doc, as_json, show, "wrote " + ", ".join(wrote) if wrote and not as_json else None)
    err.print(f"planned in {time.perf_counter() - t0:.1f} s", markup=False, highlight=False)


def _winner_timeline(result, cache, factory):
    """The winner's predicted timeline (one more warm predict)."""
    from flint.engine import predict
    from flint.plan_space import Candidate

    w = result.winner
    c = Candidate(**{k: w[k] for k in Candidate.__dataclass_fields__})
    p = predict(c.run(result.request), factory, list(result.request.what_if), cache,
                timeline=True)
    return p.timeline


def _progress():
    """A progress bar on stderr: candidates priced of the budget, stage programs
    compiled, time left; the candidate being priced beside it."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.fields[info]}"), console=err, transient=True)
    state = {"task": None, "prefix": ""}

    def on_event(kind, info):
        if kind == "ranked":
            progress.console.print(
                f"{state['prefix']}{info['raw']:,} candidates, {info['valid']:,} valid, "
                f"{info['ranked']:,} clear the memory floor; ranking done, pricing the best",
                markup=False, highlight=False, soft_wrap=True)
            return
        if kind == "point":
            p = info["point"]
            state["prefix"] = f"[{p.knob}={p.text}] "
            progress.console.print(f"what-if {info['index'] + 1}/{info['total']}: "
                                   f"{p.knob}={p.text}", markup=False, highlight=False,
                                   soft_wrap=True)
            return
        if state["task"] is None:
            state["task"] = progress.add_task("pricing", total=info["total"], info="")
        left = f"~{info['left_s']:.0f} s left" if info.get("left_s") else ""
        text = (f"{info['compiled']} compiled, {info['elapsed_s']:.0f} s, {left}"
                + (f"  {info['layout']}" if kind == "pricing" else ""))
        progress.update(state["task"], completed=info["priced"], total=info["total"],
                        info=text, description=f"{state['prefix']}pricing")
        if kind == "priced" and info.get("row"):
            r = info["row"]
            from flint.plan_explain import layout, seconds, size

            what = (f"{seconds(r['step_time_s'])}, {size(r['memory_bytes'])}"
                    + (" OOM" if r["oom"] else "") if r["status"] == "ok"
                    else f"{r['status']}: {r.get('error', '')}")

            progress.console.print(f"{state['prefix']}[{info['priced']}/{info['total']}] "
                                   f"{layout(r)}: {what}"
                                   + (" (compiled)" if r.get("extracted") else ""),
                                   markup=False, highlight=False, soft_wrap=True)

    return progress, on_event
