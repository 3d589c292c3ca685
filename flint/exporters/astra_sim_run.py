"""Run ASTRA-sim on a Flint export and compare its step with Flint's own.

    binary = find_astra_sim("../shared/tools/astra-sim")     # or $ASTRA_SIM
    result = run_export("et/", binary)                       # AstraSimResult
    result = second_opinion(graph, "h100-sxm", binary)       # export to a temp dir, run

ASTRA-sim exits 0 even when ranks deadlock; a run counts as finished only when every
rank printed "sys[N] finished, T cycles" (cycles are ns). Its step is the slowest rank's.
The congestion-unaware analytical binary takes any number of network dimensions and is
the alpha-beta model Flint's own estimate is; the congestion-aware one is used only when
asked for and the network has one dimension (it refuses more).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from flint.errors import FlintError
from flint.exporters.astra_sim import BINARY_AWARE, BINARY_UNAWARE

DEFAULT_PLACE = Path("..") / "shared" / "tools" / "astra-sim"
_FINISHED = re.compile(r"sys\[(\d+)\] finished, (\d+) cycles")
# runs of one export before a crash is reported as ranks that did not finish: of 120 runs
# of the `tiny` export here (two at once), 16 died before every rank printed, 6 of them
# by SIGSEGV without a word from glibc, 10 by glibc's SIGABRT
_CRASH_ATTEMPTS = 8


@dataclass
class AstraSimBinary:
    path: Path
    lib: Path | None

    @property
    def aware(self) -> bool:
        return "Congestion_Aware" in self.path.name


@dataclass
class AstraSimResult:
    ranks: int
    finished: int
    astra_sim_step_s: float
    flint_step_s: float
    wall_s: float
    binary: str
    per_rank_s: list = field(default_factory=list)
    log_tail: str = ""
    # Flint's step with each rank's sends and receives taking turns on one stream, as an
    # ASTRA-sim rank runs them (Flint's own lets a stage send and receive at once)
    flint_one_transfer_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.finished == self.ranks

    @property
    def difference(self) -> float:
        """ASTRA-sim's step relative to Flint's (0.05: ASTRA-sim 5% slower)."""
        return self.astra_sim_step_s / self.flint_step_s - 1 if self.flint_step_s else 0.0

    @property
    def difference_one_transfer(self) -> float:
        """ASTRA-sim's step relative to Flint's under ASTRA-sim's one-transfer rule."""
        ref = self.flint_one_transfer_s or self.flint_step_s
        return self.astra_sim_step_s / ref - 1 if ref else 0.0

    def to_json(self) -> dict:
        return {"ranks": self.ranks, "finished": self.finished, "ok": self.ok,
                "astra_sim_step_s": self.astra_sim_step_s, "flint_step_s": self.flint_step_s,
                "flint_one_transfer_s": self.flint_one_transfer_s,
                "difference": self.difference,
                "difference_one_transfer": self.difference_one_transfer,
                "wall_s": self.wall_s, "binary": self.binary, "per_rank_s": self.per_rank_s}


def find_astra_sim(given: str | None = None, aware: bool = False) -> AstraSimBinary | None:
    """`given` (a binary, or a directory with bin/), else $ASTRA_SIM, else
    ../shared/tools/astra-sim; None when there is none."""
    for where in (given, os.environ.get("ASTRA_SIM"), str(DEFAULT_PLACE)):
        if not where:
            continue
        p = Path(where)
        if p.is_dir():
            exe = p / "bin" / (BINARY_AWARE if aware else BINARY_UNAWARE)
            lib = p / "lib"
        else:
            exe, lib = p, p.parent.parent / "lib"
        if exe.is_file() and os.access(exe, os.X_OK):
            return AstraSimBinary(exe.absolute(), lib.absolute() if lib.is_dir() else None)
        if given and where == given:
            raise FlintError(f"--astra-sim {given}: no ASTRA-sim binary there (a binary, or a "
                             f"directory holding bin/{BINARY_UNAWARE})")
    return None


def run_export(export_dir, binary: AstraSimBinary, timeout_s: float | None = None
               ) -> AstraSimResult:
    """Run ASTRA-sim on a Flint export directory (from a scratch directory: it writes
    log/ into the current one); a timeout counts as not finished."""
    d = Path(export_dir).absolute()
    manifest = json.loads((d / "flint_export.json").read_text())
    ranks = int(manifest["ranks"])
    dims = manifest.get("network_dimensions", [])
    if binary.aware and len(dims) > 1:
        raise FlintError(f"{binary.path.name} only supports 1-dimension networks; this export "
                         f"has {len(dims)} (use {BINARY_UNAWARE})")
    if manifest.get("files_written", ranks) != ranks:
        raise FlintError(f"{d} holds {manifest.get('files_written')} of {ranks} rank files; "
                         f"ASTRA-sim needs every rank")
    cmd = [str(binary.path), f"--workload-configuration={d / manifest['prefix']}",
           f"--comm-group-configuration={d / 'comm_groups.json'}",
           f"--system-configuration={d / 'system.json'}",
           f"--network-configuration={d / 'network.yml'}",
           f"--remote-memory-configuration={d / 'remote_memory.json'}"]
    env = dict(os.environ)
    if binary.lib is not None:
        env["LD_LIBRARY_PATH"] = str(binary.lib) + (
            ":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    t0 = time.perf_counter()
    per_rank: dict[int, int] = {}
    out = ""
    for _ in range(_CRASH_ATTEMPTS):
        out, crashed = _run_once(cmd, env, timeout_s)
        for m in _FINISHED.finditer(out):
            per_rank.setdefault(int(m.group(1)), int(m.group(2)))
        # the prebuilt binary double-frees a 4-byte block while it simulates all-gathers
        # on sub-groups (valgrind: 16 invalid frees on the `tiny` export, none on exports
        # without such all-gathers); what the corrupted heap does next depends on its
        # layout: glibc's check aborts ("malloc_consolidate(): unaligned fastbin chunk
        # detected", SIGABRT) or a later access faults first (SIGSEGV, no message), after
        # all, some or (rarely) no ranks printed their result. The simulation is
        # deterministic, so the ranks of several runs are pooled; a run that exits by
        # itself (a deadlock too exits 0) is the whole answer
        if not crashed or len(per_rank) == ranks:
            break
    wall = time.perf_counter() - t0
    step = max(per_rank.values(), default=0) * 1e-9
    return AstraSimResult(ranks, len(per_rank), step, float(manifest.get("flint_step_s", 0.0)),
                          wall, binary.path.name,
                          [per_rank.get(r, 0) * 1e-9 if r in per_rank else None
                           for r in range(ranks)],
                          "\n".join(out.splitlines()[-5:]),
                          float(manifest.get("flint_step_one_transfer_s", 0.0)))


def _run_once(cmd: list[str], env: dict, timeout_s: float | None) -> tuple[str, bool]:
    """(the binary's output, whether a signal killed it) for one run in a scratch directory
    (ASTRA-sim writes log/ into the current one); a timeout keeps what it printed."""
    scratch = tempfile.mkdtemp(prefix="flint-astra-sim.")
    try:
        proc = subprocess.run(cmd, cwd=scratch, env=env, capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) \
            else (e.stdout or "")
        return out, False
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    out = proc.stdout + proc.stderr
    return out, proc.returncode < 0


def second_opinion(graph, hardware: str | None, binary: AstraSimBinary, overrides=(),
                   timeout_s: float | None = None, keep: str | None = None) -> AstraSimResult:
    """Export `graph` (un-annotated, checked) to a temporary directory (or `keep`) and
    run ASTRA-sim on it."""
    from flint.exporters.chakra import export_chakra

    tmp = tempfile.mkdtemp(prefix="flint-astra-export.")
    try:
        out = Path(keep) if keep else Path(tmp) / "et"
        export_chakra(graph, out, hardware=hardware, overrides=overrides, annotate="none")
        return run_export(out, binary, timeout_s)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def where_they_differ(result: AstraSimResult) -> list[str]:
    """Lines that say how ASTRA-sim's figures relate to Flint's."""
    lines = []
    if not result.ok:
        lines.append(f"only {result.finished} of {result.ranks} ranks finished in ASTRA-sim "
                     f"(a deadlock, a timeout or a crash: its log tail says which)")
        return lines
    steps = [s for s in result.per_rank_s if s is not None]
    if steps and max(steps) > min(steps) * 1.001:
        lines.append(f"ranks finish between {min(steps) * 1e3:.3f} ms and "
                     f"{max(steps) * 1e3:.3f} ms in ASTRA-sim (Flint prices one rank)")
    diff = result.difference
    lines.append(f"ASTRA-sim's step is {abs(diff) * 100:.1f}% "
                 f"{'longer' if diff >= 0 else 'shorter'} than Flint's")
    return lines


def report_second_opinion(graph, hardware, overrides, backend: str, astra_sim: str | None,
                          as_json: bool) -> None:
    """`flint estimate --backend astra-sim`: Flint's step and ASTRA-sim's, and where they
    differ, as a table or JSON."""
    if backend != "astra-sim":
        raise FlintError(f"unknown --backend {backend!r}; use flint | astra-sim")
    binary = find_astra_sim(astra_sim)
    if binary is None:
        raise FlintError("no ASTRA-sim binary: pass --astra-sim PATH or set ASTRA_SIM "
                         "(looked in ../shared/tools/astra-sim)")
    result = second_opinion(graph, hardware, binary, overrides)
    notes = where_they_differ(result)
    if int(graph.meta.get("mpmd_devices", 1) or 1) > 1:
        notes.append("pipeline send/recv: a rendezvous in both (the export's receiver "
                     "sends a 1-byte clear-to-send first), which costs ASTRA-sim one more "
                     "small message's latency per transfer")
    if any(n.collective is not None and n.collective.type in ("all-to-all",
                                                               "ragged-all-to-all")
           for n in graph.nodes):
        notes.append("all-to-all: per-peer sends and receives in the export; an ASTRA-sim "
                     "rank sends them one at a time, each paying its link latency, where "
                     "NCCL issues one group (small all-to-alls come out longer there); the "
                     "congestion-unaware backend shares no link between concurrent messages "
                     "(a hot rank's incoming traffic is not queued)")
    report = {**result.to_json(), "where_they_differ": notes}
    if as_json:
        print(json.dumps(report, sort_keys=True, indent=1))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"step time: Flint vs ASTRA-sim ({result.binary}, {result.ranks} ranks)",
              show_header=False)
    t.add_column("what")
    t.add_column("value", justify="right")
    t.add_row("Flint step", f"{result.flint_step_s * 1e3:.3f} ms")
    t.add_row("ASTRA-sim step", f"{result.astra_sim_step_s * 1e3:.3f} ms"
              if result.ok else "did not finish")
    t.add_row("difference", f"{result.difference * 100:+.1f} %" if result.ok else "-")
    t.add_row("ranks finished", f"{result.finished} of {result.ranks} ranks")
    t.add_row("ASTRA-sim wall time", f"{result.wall_s:.2f} s")
    Console().print(t)
    for line in report["where_they_differ"]:
        print(line)
    if not result.ok:
        raise FlintError(f"ASTRA-sim did not finish: {result.finished} of {result.ranks} "
                         f"ranks")
