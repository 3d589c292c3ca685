"""Design-space sweeps: price every point of a SearchSpace with the engine
(flint.engine.predict, the same number `flint predict` gives) and append one result per
point.

    rows = run_sweep(SearchSpace.from_dict(doc), "out/")

The output directory holds `templates/<program key>.json` (the stage-program cache, shared
by later sweeps), `results.jsonl` (one line per finished point, appended with a single
write and fsync, so an interrupted sweep resumes where it stopped), `claims/` (one lock
per point while it is priced: concurrent sweeps or Ray workers on one directory never
price a point twice) and, at the end, the tables and plots of `flint.sweep_report`.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Callable

from flint.errors import FlintError
from flint.hardware_models.pluggable import cost_model_name, resolve_cost_model
from flint.sweep_space import SearchSpace, SweepPoint, program_of

RESULTS = "results.jsonl"


def evaluate(point: SweepPoint, directory, cost_model=None) -> dict:
    """One result row: the run's fields, the what-if, and the prediction (or why not)."""
    from flint.engine import predict

    t0 = time.perf_counter()
    row = {"key": point.key(), "program": program_of(point), **point.run.to_json(),
           "what_if": dict(point.what_if), "dp": point.run.dp,
           "microbatches": point.run.microbatches}
    name = cost_model_name(cost_model)
    if name is not None:
        row["cost_model"] = name
    try:
        p = predict(point.run, cost_model, point.overrides(), Path(directory))
    except FlintError as err:
        return {**row, "status": "invalid", "error": str(err), "extracted": False,
                "time_s": time.perf_counter() - t0}
    except Exception as err:   # one broken configuration must not end a long sweep
        return {**row, "status": "error", "error": f"{type(err).__name__}: {err}",
                "extracted": False, "time_s": time.perf_counter() - t0}
    return {**row, "status": "ok", "step_time_s": p.step_time_s,
            "tokens_per_s": p.tokens_per_s, "tokens_per_s_per_device": p.tokens_per_s_per_device,
            "mfu": p.mfu, "hfu": p.hfu, "memory_gib": p.memory_bytes / 2**30,
            "memory_capacity_gib": p.memory_capacity_bytes / 2**30, "oom": p.oom,
            "compute_busy_s": p.compute_busy_s,
            "exposed_communication_s": p.exposed_communication_s,
            "bubble_fraction": p.bubble_fraction, "extracted": p.extracted,
            "time_s": time.perf_counter() - t0}


def evaluate_group(directory: str, points: list[SweepPoint], cost_model=None) -> list[dict]:
    """Price one program's points (a unit of work for any executor). `cost_model`: a
    factory, or its `module:factory` name (what crosses to Ray workers)."""
    factory = resolve_cost_model(cost_model)
    return [evaluate(p, directory, factory) for p in points]


def load_results(directory, cost_model: str | None = None) -> dict[str, dict]:
    """Finished rows by point key; a torn last line (a killed sweep) is ignored, and so
    are rows another cost model (by name; None: the built-in) priced."""
    path = Path(directory) / RESULTS
    rows: dict[str, dict] = {}
    if not path.is_file():
        return rows
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and "key" in row and row.get("cost_model") == cost_model:
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


class Claims:
    """One advisory lock per point key (`claims/<key>.lock`, flock): held while this
    process prices the point, released when its row is written or the process dies, so a
    crashed sweep leaves nothing stale behind."""

    def __init__(self, directory: Path):
        self.directory = directory / "claims"
        self.directory.mkdir(exist_ok=True)
        self.held: dict[str, int] = {}

    def take(self, key: str, wait: bool = False) -> bool:
        import fcntl

        if key in self.held:    # ours already: a second descriptor's flock would wait on it
            return True
        fd = os.open(self.directory / f"{key}.lock", os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            return False
        self.held[key] = fd
        return True

    def release(self, key: str) -> None:
        import fcntl

        fd = self.held.pop(key, None)
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def release_all(self) -> None:
        for key in list(self.held):
            self.release(key)


def run_sweep(space: SearchSpace, directory, executor: str = "local", workers: int = 2,
              on_result: Callable[[dict, int, int], None] | None = None,
              cost_model=None) -> list[dict]:
    """Price every point not already in `directory`'s results; returns all rows of this
    space (old and new) in the space's order. `cost_model`: a factory or its
    `module:factory` name (hardware_models.pluggable); None: the built-in model. Points
    another process is pricing (its claim held) are waited for, not priced again."""
    factory = resolve_cost_model(cost_model)
    name = cost_model_name(cost_model)
    points, _ = space.expand()
    directory = Path(directory)
    if not directory.parent.is_dir():
        raise FlintError(f"output directory {str(directory.parent)!r} does not exist")
    directory.mkdir(exist_ok=True)
    done = load_results(directory, name)
    total, count = len(points), sum(p.key() in done for p in points)
    claims = Claims(directory)

    def record(row):
        nonlocal count
        append_result(directory, row)
        done[row["key"]] = row
        claims.release(row["key"])
        count += 1
        if on_result:
            on_result(row, count, total)

    try:
        todo = _claim(points, done, claims, directory, name)
        if executor == "local":
            for p in todo:
                record(evaluate(p, directory, factory))
        elif executor == "ray":
            from flint.sweep_ray import run_groups

            run_groups(str(directory), _groups(todo), workers, record, evaluate_group,
                       name if isinstance(cost_model, str) else factory)
        else:
            raise FlintError(f"unknown executor {executor!r}; use local or ray")
        # points others were pricing: wait for their claims, then read their rows
        for p in points:
            if p.key() not in done and claims.take(p.key(), wait=True):
                claims.release(p.key())
                done.update(load_results(directory, name))
                if p.key() not in done:   # the other process died: price it here
                    record(evaluate(p, directory, factory))
    finally:
        claims.release_all()
    return [done[p.key()] for p in points]


def _claim(points, done, claims: Claims, directory, name) -> list[SweepPoint]:
    """The points this process prices: not finished, and not claimed by another."""
    mine = [p for p in points if p.key() not in done and claims.take(p.key())]
    done.update(load_results(directory, name))     # finished while we took the claims?
    for p in mine:
        if p.key() in done:
            claims.release(p.key())
    return [p for p in mine if p.key() not in done]


def _groups(points: list[SweepPoint]) -> list[list[SweepPoint]]:
    groups: dict[str, list[SweepPoint]] = {}
    for p in points:
        groups.setdefault(program_of(p), []).append(p)
    return list(groups.values())
