"""Design-space sweeps: extract each distinct program once, re-estimate it for every
pipeline depth, schedule and hardware what-if, and append one result per configuration.

    rows = run_sweep(SearchSpace.from_dict(doc), "out/")

The output directory holds `graphs/<program key>.json` (the extraction cache, shared by
later sweeps), `results.jsonl` (one line per finished configuration, appended with a
single write and fsync, so an interrupted sweep resumes where it stopped) and, at the
end, the tables and plots of `flint.sweep_report`.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from flint.errors import FlintError
from flint.graph import WorkloadGraph
from flint.sweep_space import Config, SearchSpace

RESULTS = "results.jsonl"


def extract_program(program: dict) -> WorkloadGraph:
    """Compile one zoo program for its compile-only devices and lower it (as `flint
    extract` does)."""
    from flint.cli_targets import captured_step
    from flint.frontends.targets import prepare_environment

    prepare_environment()
    mesh = ",".join(f"{n}={s}" for n, s in program["mesh"])
    devices = program["devices"]
    step, args, label, info = captured_step(
        None, devices, mesh, program["hardware"], program["model"], program["scan"],
        program["layers"] or None, program["seq_len"] or None, program["batch_per_replica"],
        program["remat"], program["sequence_parallel"], None, "example_args",
        gemm_precision=program.get("gemm_precision"))
    graph = step.lower(*args).compile().workload()
    graph.meta["model"] = label
    graph.meta["model_flops_per_device"] = info["model_flops"] / devices
    if info.get("experts"):
        graph.meta["moe"] = {k: info[k] for k in ("experts", "top_k", "ep", "capacity_factor")}
    return graph


@dataclass
class Evaluator:
    """Graphs by program (disk cache); pipelined graphs and their memory analysis by
    pipeline shape (in memory: both depend on the graph only, not on the hardware)."""

    directory: Path
    extract: Callable[[dict], WorkloadGraph] = extract_program
    graphs: dict = field(default_factory=dict)
    pipelined: dict = field(default_factory=dict)

    def graph(self, cfg: Config) -> tuple[WorkloadGraph, bool]:
        key = cfg.program_key()
        if key in self.graphs:
            return self.graphs[key], False
        path = self.directory / "graphs" / f"{key}.json"
        extracted = not path.is_file()
        if extracted:
            graph = self.extract(cfg.program())
            path.parent.mkdir(parents=True, exist_ok=True)
            graph.save(path)
        else:
            graph = WorkloadGraph.load(path)
        self.graphs = {key: graph}      # one program at a time: configs come grouped
        self.pipelined = {}
        return graph, extracted

    def pipeline(self, cfg: Config, graph: WorkloadGraph):
        """(the graph the configuration runs, its memory analysis)."""
        from flint.hardware_models.memory import estimate_memory
        from flint.passes.pipeline import PipelineParallel

        shape = (cfg.pp, cfg.microbatches, cfg.schedule, cfg.virtual, cfg.pipeline_split,
                 cfg.hardware if cfg.pipeline_split == "time" else "")
        if shape not in self.pipelined:
            piped = graph if cfg.pp == 1 and cfg.microbatches == 1 else PipelineParallel(
                stages=cfg.pp, microbatches=cfg.microbatches, schedule=cfg.schedule,
                virtual=cfg.virtual, split=cfg.pipeline_split, hardware=shape[-1]).run(graph)
            self.pipelined[shape] = (piped, estimate_memory(piped))
        return self.pipelined[shape]

    def evaluate(self, cfg: Config) -> dict:
        from flint.hardware_models.estimate import estimate

        t0 = time.perf_counter()
        row = {"key": cfg.key(), "program": cfg.program_key(), **cfg.to_json()}
        try:
            graph, extracted = self.graph(cfg)
            t1 = time.perf_counter()
            piped, memory = self.pipeline(cfg, graph)
            e = estimate(piped, cfg.hardware, cfg.overrides(), memory=memory)
        except FlintError as err:
            return {**row, "status": "invalid", "error": str(err),
                    "time_s": time.perf_counter() - t0, "extracted": False}
        except Exception as err:   # one broken configuration must not end a long sweep
            return {**row, "status": "error", "error": f"{type(err).__name__}: {err}",
                    "time_s": time.perf_counter() - t0, "extracted": False}
        from flint.models.describe import resolve_model

        seq = cfg.seq_len or resolve_model(cfg.model).seq_len
        tokens = cfg.dp * cfg.microbatch * cfg.microbatches * seq    # the global batch
        return {**row, "status": "ok", "step_time_s": e.step_time_s,
                "tokens_per_s": tokens / e.step_time_s if e.step_time_s else 0.0,
                "mfu": e.mfu, "memory_gib": e.memory_bytes / 2**30,
                "memory_capacity_gib": e.memory_capacity_bytes / 2**30, "oom": e.oom,
                "compute_busy_s": e.compute_busy_s,
                "exposed_communication_s": e.exposed_communication_s,
                "bubble_fraction": e.pipeline.get("bubble_fraction", 0.0),
                "comm_wait_fraction": e.pipeline.get("comm_wait_fraction", 0.0),
                "extracted": extracted, "estimate_s": time.perf_counter() - t1,
                "time_s": time.perf_counter() - t0}


def group_by_program(configs: list[Config]) -> list[list[Config]]:
    """Configurations grouped by program, groups in first-appearance order."""
    groups: dict[str, list[Config]] = {}
    for c in configs:
        groups.setdefault(c.program_key(), []).append(c)
    return list(groups.values())


def evaluate_group(directory: str, configs: list[Config]) -> list[dict]:
    """Evaluate one program's configurations (a unit of work for any executor)."""
    ev = Evaluator(Path(directory))
    return [ev.evaluate(c) for c in configs]


def load_results(directory) -> dict[str, dict]:
    """Finished rows by config key; a torn last line (a killed sweep) is ignored."""
    path = Path(directory) / RESULTS
    rows: dict[str, dict] = {}
    if not path.is_file():
        return rows
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and "key" in row:
            rows[row["key"]] = row
    return rows


def append_result(directory, row: dict) -> None:
    """One write of one whole line, then fsync: a crash leaves whole rows only."""
    data = (json.dumps(row, sort_keys=True) + "\n").encode()
    fd = os.open(Path(directory) / RESULTS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def run_sweep(space: SearchSpace, directory, executor: str = "local", workers: int = 2,
              on_result: Callable[[dict, int, int], None] | None = None) -> list[dict]:
    """Run every configuration not already in `directory`'s results; returns all rows of
    this space (old and new), in the space's order."""
    configs, _ = space.expand()
    directory = Path(directory)
    if not directory.parent.is_dir():
        raise FlintError(f"output directory {str(directory.parent)!r} does not exist")
    directory.mkdir(exist_ok=True)
    done = load_results(directory)
    todo = [c for c in configs if c.key() not in done]
    total, count = len(configs), len(configs) - len(todo)

    def record(row):
        nonlocal count
        append_result(directory, row)
        done[row["key"]] = row
        count += 1
        if on_result:
            on_result(row, count, total)

    groups = group_by_program(todo)
    if executor == "local":
        ev = Evaluator(directory)
        for group in groups:
            for cfg in group:
                record(ev.evaluate(cfg))
    elif executor == "ray":
        from flint.sweep_ray import run_groups

        run_groups(str(directory), groups, workers, record)
    else:
        raise FlintError(f"unknown executor {executor!r}; use local or ray")
    return [done[c.key()] for c in configs]
