"""Extracted stage programs on disk, by the key of what the compiler saw.

    cache = TemplateCache()                 # $FLINT_CACHE, else ~/.cache/flint
    graph, extracted = cache.get(program)   # compile once; later calls load it

A program (a dict, `extract_program` compiles it) is everything an extraction depends on:
model dims, one pipeline stage's mesh and device count, micro-batch, remat, precision,
compile target and the workload version of Flint's zoo (flint.stage.stage_program). Graphs hold work (flops, bytes,
shapes, collectives), never prices, so one cached graph serves every spec and what-if.
Writes go to a temporary file renamed into place, so concurrent processes (sweep
workers) that compile the same program leave one whole file.
"""
from __future__ import annotations

import hashlib
import json
import os
from collections import OrderedDict
from pathlib import Path
from typing import Callable

from flint.graph import WorkloadGraph

CACHE_ENV = "FLINT_CACHE"
KEPT_IN_MEMORY = 4


def extract_program(program: dict) -> WorkloadGraph:
    """Compile one zoo program for its compile-only devices and lower it (as `flint
    extract` does). Keys: framework, model (a name or a mapping of dims), devices, mesh
    ([[axis, size], ...]), batch_per_replica, remat, sequence_parallel, scan, seq_len,
    layers, hardware (the compile target or a spec naming one); optional
    gemm_precision, devices_per_host, lora ([rank, targets] or [rank, targets, base]);
    other keys (workload_version) only key the cache."""
    from flint.frontends.request import ExtractRequest, extract

    torch = program["framework"] == "torch"
    request = ExtractRequest(
        framework=program["framework"], fuse=bool(program.get("fuse", True)),
        reshard_after_forward=bool(program.get("reshard_after_forward", True)),
        scan=None if torch else program["scan"], devices=program["devices"], mesh=",".join(f"{n}={s}" for n, s in program["mesh"]),
        hardware=program["hardware"], model=program["model"],
        layers=program["layers"] or None, seq_len=program["seq_len"] or None,
        batch_per_replica=program["batch_per_replica"], remat=program["remat"],
        sequence_parallel=program["sequence_parallel"],
        gemm_precision=program.get("gemm_precision"), attention=program.get("attention"),
        attention_dropout=float(program.get("attention_dropout", 0.0)),
        devices_per_host=program.get("devices_per_host"),
        lora=tuple(program.get("lora", ())),
        compiler_options=tuple(sorted(program.get("compiler_options", {}).items())))
    # the engine chose every sharding: the argument-sharding notes `flint extract` prints
    # for a user's own step (replicated embeddings under pure data parallelism) are noise
    import contextlib
    import io

    with contextlib.redirect_stderr(io.StringIO()):
        graph, _ = extract(request)
    return graph


def default_cache_dir() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "flint"


def program_key(program: dict) -> str:
    return hashlib.sha256(json.dumps(program, sort_keys=True).encode()).hexdigest()[:16]


class TemplateCache:
    def __init__(self, directory=None, extract: Callable[[dict], WorkloadGraph] | None = None):
        self.directory = Path(directory) if directory else default_cache_dir()
        self._extract = extract
        self._memory: OrderedDict[str, WorkloadGraph] = OrderedDict()

    def path(self, program: dict) -> Path:
        return self.directory / "templates" / f"{program_key(program)}.json"

    def has(self, program: dict) -> bool:
        return program_key(program) in self._memory or self.path(program).is_file()

    def get(self, program: dict) -> tuple[WorkloadGraph, bool]:
        """(the program's graph, whether it was compiled now)."""
        key = program_key(program)
        if key in self._memory:
            self._memory.move_to_end(key)
            return self._memory[key], False
        path = self.path(program)
        extracted = not path.is_file()
        if extracted:
            graph = (self._extract or extract_program)(program)
            path.parent.mkdir(parents=True, exist_ok=True)
            graph.save(path)          # atomic: a temporary file renamed
        else:
            graph = WorkloadGraph.load(path)
        self._memory[key] = graph
        while len(self._memory) > KEPT_IN_MEMORY:
            self._memory.popitem(last=False)
        return graph, extracted

