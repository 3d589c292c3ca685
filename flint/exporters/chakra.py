"""`flint export --format chakra`: one Chakra ET per rank plus ASTRA-sim's inputs.

    stats = export_chakra(graph, "out/", hardware="h100-sxm")
    # out/workload.0.et ... out/workload.4095.et, comm_groups.json, network.yml,
    # system.json, remote_memory.json, run_astra_sim.sh, flint_export.json

Loops are unrolled first (Chakra has no loops). Every node carries `duration_micros`
from Flint's cost model and `num_ops` / `tensor_size` for ASTRA-sim's roofline mode, plus
standard Chakra fields. The annotated rank's file (rank 0 by default; `annotate="all"` or
"none" to change) also carries shapes and one `flint_node` attribute per node, which lets
`flint import` rebuild the graph exactly: that record is the same on every rank and would
otherwise make up three quarters of every file.

Files are written by a thread pool into a temporary directory beside DIR and renamed into
it at the end, so an interrupted export leaves no partial file behind.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from flint.errors import FlintError
from flint.exporters import astra_sim
from flint.exporters.chakra_alltoallv import ALL_TO_ALL, expert_work_by_rank
from flint.exporters.chakra_check import check_plan
from flint.exporters.chakra_plan import ChakraPlan
from flint.graph import WorkloadGraph, dumps_json
from flint.guard import HeldSignals
from flint.io import current_umask
from flint.hardware_models.estimate import durations_as_run, node_durations
from flint.hardware_models.pluggable import cost_model_name
from flint.hardware_models.schedule import simulate


def flint_step_s(flat: WorkloadGraph, durations: list[float], duplex: bool = True) -> float:
    """Flint's own step time for the exported (loop-free) graph and durations; with
    duplex=False, each rank's sends and receives take turns on one stream (ASTRA-sim's
    rule: one transfer in flight per rank), the figure ASTRA-sim should reproduce."""
    return simulate(flat, durations, duplex=duplex).step_time


_PREFIX = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")


@dataclass
class ExportStats:
    ranks: int
    nodes_per_rank: int
    bytes: int
    encode_s: float          # encoding the rank-independent plan (once)
    write_s: float           # specializing and writing every rank's file
    files: list[str]

    @property
    def mb_per_s(self) -> float:
        return self.bytes / 1e6 / self.write_s if self.write_s else 0.0

    def to_json(self) -> dict:
        return {"ranks": self.ranks, "nodes_per_rank": self.nodes_per_rank,
                "bytes": self.bytes, "encode_s": self.encode_s, "write_s": self.write_s,
                "MB_per_s": self.mb_per_s}


def export_chakra(graph: WorkloadGraph, out_dir, *, prefix: str = "workload",
                  hardware: str | None = None, overrides=(), annotate: str = "rank0",
                  ranks: range | None = None, workers: int = 4, progress=None,
                  check: bool = True, cost_model=None) -> ExportStats:
    """Write the export into `out_dir` (created if missing). `ranks` limits which rank
    files are written (default all); `progress(n_done)` is called as files complete.
    `check`: first prove that every rank runs to completion under ASTRA-sim's issue rule
    (chakra_check) and refuse the export otherwise."""
    if not _PREFIX.fullmatch(prefix):
        raise FlintError(f"bad file prefix {prefix!r}: use letters, digits, _ . - (not "
                         f"starting with . or -)")
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise FlintError(f"--out {out} exists and is not a directory")
    if not out.absolute().parent.is_dir():
        raise FlintError(f"output directory {str(out.absolute().parent)!r} does not exist")
    n = graph.cluster.devices
    ranks = range(n) if ranks is None else ranks
    if annotate not in ("rank0", "all", "none"):
        raise FlintError(f"--annotate must be rank0, all or none, not {annotate!r}")
    t0 = time.perf_counter()
    flat, durations, model = node_durations(graph, hardware, overrides, cost_model)
    durations = durations_as_run(flat, durations, model)   # ASTRA-sim models no contention
    linked = with_links(model, flat)
    inputs = astra_sim.AstraSimInputs.build(linked, flat, durations)
    dims = [d["npus"] for d in inputs.dims]
    routes = hierarchical_all_to_alls(linked.network, flat)
    work = expert_work_by_rank(flat, durations, model)
    plain = (ChakraPlan(flat, durations, False, dims, routes, work) if annotate != "all"
             else None)
    full = (ChakraPlan(flat, durations, True, dims, routes, work)
            if annotate == "all" or (annotate == "rank0" and 0 in ranks) else None)
    plan = plain or full
    if check:                  # refuse what ASTRA-sim could not run to completion
        check_plan(plan)
    encode_s = time.perf_counter() - t0

    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial",
                                dir=out.absolute().parent))
    try:
        t1 = time.perf_counter()

        def write(rank: int) -> int:
            source = full if (full is not None and (plain is None or rank == 0)) else plain
            data = source.rank_bytes(rank)
            with open(tmp / f"{prefix}.{rank}.et", "wb") as f:
                f.write(data)
            return len(data)

        total = write_ranks(write, ranks, workers, progress)
        write_s = time.perf_counter() - t1
        side = {
            "comm_groups.json": json.dumps(plan.comm_groups(), separators=(",", ":")) + "\n",
            "network.yml": inputs.network_yaml(),
            "system.json": inputs.system_json(),
            "remote_memory.json": astra_sim.REMOTE_MEMORY_JSON,
            "run_astra_sim.sh": astra_sim.run_script(prefix, n),
            "flint_export.json": dumps_json({
                "format": "flint.chakra-export", "version": 1, "prefix": prefix,
                "ranks": n, "files_written": len(ranks), "hardware": model.spec.name,
                "overrides": list(overrides), "nodes_per_rank": len(plan.graph.nodes),
                "annotate": annotate, "chakra_ids": "2i+1",
                "network_dimensions": inputs.dims, "algorithms": inputs.algorithms,
                "flint_step_s": flint_step_s(flat, durations),
                "flint_step_one_transfer_s": flint_step_s(flat, durations, duplex=False),
                **({"cost_model": cost_model_name(cost_model)} if cost_model else {})}),
        }
        for name, text in side.items():
            (tmp / name).write_text(text)
        os.chmod(tmp / "run_astra_sim.sh", 0o755)
        os.chmod(tmp, 0o777 & ~current_umask())
        files = _move_into(tmp, out, prefix, prune=len(ranks) == n)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return ExportStats(n, len(plan.graph.nodes), total, encode_s, write_s, files)


def write_ranks(write, ranks, workers: int, progress=None) -> int:
    """`write(rank)` for every rank on `workers` threads; returns the sum of what the calls
    return. At most twice `workers` ranks are queued at a time, so an interrupt drops little
    queued work (and 65,536 ranks are not 65,536 futures). Interrupts are taken between
    files (HeldSignals): one raised inside the pool's own locking left a writer waiting on
    a lock the interrupted main thread held, and the export hung."""
    total = done = 0
    depth = 2 * max(1, workers)
    queued: deque = deque()
    with HeldSignals() as held:
        pool = ThreadPoolExecutor(max_workers=max(1, workers))

        def collect() -> None:          # the oldest queued rank's file, then a safe point
            nonlocal total, done
            total += queued.popleft().result()
            done += 1
            if progress is not None:
                progress(done)
            held.check()

        try:
            for rank in ranks:
                held.check()
                queued.append(pool.submit(write, rank))
                while queued and (len(queued) >= depth or queued[0].done()):
                    collect()
            while queued:
                collect()
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
    return total


def check_export(graph: WorkloadGraph, hardware: str | None = None, overrides=(),
                 cost_model=None) -> dict:
    """What `export_chakra` checks before writing, alone: encode the plan and prove every
    rank finishes under ASTRA-sim's issue rule (a DeadlockError otherwise)."""
    t0 = time.perf_counter()
    flat, durations, model = node_durations(graph, hardware, overrides, cost_model)
    durations = durations_as_run(flat, durations, model)   # ASTRA-sim models no contention
    network = with_links(model, flat).network
    dims = [d["npus"] for d in astra_sim.network_dimensions(network)]
    plan = ChakraPlan(flat, durations, False, dims, hierarchical_all_to_alls(network, flat))
    check_plan(plan)
    return {"ranks": plan.devices, "pipeline_stages": plan.stages,
            "lanes_simulated": len(plan.lanes), "nodes_per_rank": len(flat.nodes),
            "check_s": time.perf_counter() - t0, "deadlock_free": True}


def hierarchical_all_to_alls(network, flat: WorkloadGraph) -> frozenset:
    """Ids of the all-to-alls Flint's network model prices DeepEP's way (the export
    writes their traffic along that route)."""
    return frozenset(
        n.id for n in flat.nodes
        if n.collective is not None and n.collective.type in ALL_TO_ALL
        and flat.communicators[n.collective.communicator].kind == "groups"
        and astra_sim.algorithm_for(network, n, flat.communicators[n.collective.communicator])
        == "hierarchical")


def with_links(model, flat: WorkloadGraph):
    """`model` when its network half is Flint's NetworkModel; otherwise the built-in model
    of its spec. ASTRA-sim simulates the collectives itself: its network.yml describes the
    links of the hardware (NetworkModel's levels), while a third-party network model only
    prices the collectives, which the export's durations and manifest carry."""
    from flint.hardware_models.compute import RooflineCompute
    from flint.hardware_models.cost_model import DefaultCostModel
    from flint.hardware_models.network import NetworkModel

    if isinstance(getattr(model, "network", None), NetworkModel):
        return model
    return DefaultCostModel(model.spec, RooflineCompute(model.spec),
                            NetworkModel(model.spec, flat.cluster))


def _move_into(tmp: Path, out: Path, prefix: str, prune: bool) -> list[str]:
    """Rename the finished files into `out`; rank files of an earlier export with the same
    prefix that this one did not write are removed, so the directory is one consistent set."""
    names = sorted(os.listdir(tmp))
    if not out.exists():
        os.rename(tmp, out)
        return names
    fresh = set(names)
    for old in os.listdir(out):
        if prune and old.startswith(prefix + ".") and old.endswith(".et") and old not in fresh:
            os.unlink(out / old)
    for name in names:
        os.replace(tmp / name, out / name)
    return names
