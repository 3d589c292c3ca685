"""Pricing a plan's candidates with the engine (flint.engine.predict): one result row per
candidate, the unit of work of the local and Ray executors.

A row holds the candidate's layout, its TrainingRun's key (the key a sweep point of the
same run and what-ifs has, so plan and sweep rows of one run agree), what predict said
(step time, throughput, MFU, memory and its split, compute busy, exposed communication,
bubble, time per op class, collectives) and what the planner's closed form said of it.
Rows are appended to `results.jsonl` of the plan's output directory with flint.sweep's
writer (one whole line, fsync), so an interrupted plan resumes where it stopped.
"""
from __future__ import annotations

import time
from pathlib import Path

from flint.errors import FlintError

LAYOUT = ("devices", "tp", "cp", "pp", "vp", "ep", "zero", "hsdp", "micro_batch", "remat",
          "precision")


def what_if_pairs(what_if) -> tuple:
    """("nic_bandwidth=800Gb/s", ...) -> (("nic_bandwidth", "800Gb/s"), ...), sorted (a
    sweep point's what-if, so keys match)."""
    pairs = []
    for item in what_if:
        k, _, v = str(item).partition("=")
        pairs.append((k.strip(), v.strip()))
    return tuple(sorted(pairs))


def row_key(run_fields: dict, what_if) -> str:
    """The key a sweep point of this run under these what-ifs has."""
    from flint.run import TrainingRun
    from flint.sweep_space import SweepPoint

    return SweepPoint(TrainingRun.from_json(dict(run_fields)), what_if_pairs(what_if)).key()


def price(job: dict, cache=None, cost_model=None, timeline: bool = False):
    """One candidate priced: (row, prediction or None). `job`: {"run": TrainingRun
    fields, "what_if": [...], "layout": {...}, "analytic": {...}}."""
    from flint.engine import predict, stage_program
    from flint.hardware_models.pluggable import cost_model_name
    from flint.run import TrainingRun
    from flint.template_cache import program_key

    t0 = time.perf_counter()
    row = {**job["layout"], "key": job["key"], "what_if": list(job["what_if"]),
           "analytic": job.get("analytic", {})}
    name = cost_model_name(cost_model)
    if name is not None:
        row["cost_model"] = name
    try:
        run = TrainingRun.from_json(dict(job["run"]), "plan candidate")
        row["program"] = program_key(stage_program(run))
        p = predict(run, cost_model, job["what_if"], cache, timeline=timeline)
    except FlintError as err:
        return {**row, "status": "invalid", "error": str(err), "extracted": False,
                "time_s": time.perf_counter() - t0}, None
    except Exception as err:    # one broken layout must not end a plan
        return {**row, "status": "error", "error": f"{type(err).__name__}: {err}",
                "extracted": False, "time_s": time.perf_counter() - t0}, None
    mem = p.memory or {}
    args = mem.get("arguments_bytes") or {}
    row.update({
        "status": "ok", "step_time_s": p.step_time_s, "tokens_per_s": p.tokens_per_s,
        "tokens_per_s_per_device": p.tokens_per_s_per_device, "mfu": p.mfu, "hfu": p.hfu,
        "memory_bytes": p.memory_bytes, "memory_capacity_bytes": p.memory_capacity_bytes,
        "oom": bool(p.oom), "compute_busy_s": p.compute_busy_s,
        "exposed_communication_s": p.exposed_communication_s,
        "bubble_fraction": p.bubble_fraction, "by_class_s": dict(p.by_class_s),
        "collectives_s": dict(p.collectives_s), "microbatches": run.microbatches,
        "dp": run.dp, "stages": run.pp,
        "memory_split": {"parameters": args.get("parameters", 0.0)
                         + args.get("frozen_parameters", 0.0),
                         "optimizer_state": args.get("optimizer_state", 0.0),
                         "inputs": args.get("inputs", 0.0),
                         "temporaries": mem.get("temporaries_peak_bytes", 0.0)},
        "extracted": p.extracted, "time_s": time.perf_counter() - t0})
    return row, p


def price_group(directory: str, jobs: list, cost_model=None) -> list:
    """Price one stage program's jobs (one Ray task): rows in the jobs' order.
    `directory`: the stage-program cache."""
    from flint.hardware_models.pluggable import resolve_cost_model

    factory = resolve_cost_model(cost_model)
    return [price(job, Path(directory) if directory else None, factory)[0] for job in jobs]
