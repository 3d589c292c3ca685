"""nsys-jax archives: the optimized HLO XLA ran plus per-thunk GPU times (NVIDIA JAX-Toolbox).

Layout: `dump/module_<program id>.<module>.sm_*_gpu_after_optimizations.hlo.pb.xz`
(HloProto), `dump/module_<program id>.<module>.gpu_target_config.pbtxt.xz` (the GPU XLA
compiled for) and `nvtx_gpu_proj_trace/trace.parquet`: one row per module execution
(`TSL:XlaModule:#...hlo_module=<module>,program_id=<id>#`) and one per thunk
(`TSL:Thunk:#...hlo_op=<op>#`) with GPU-projected start/duration in ns; a thunk's ParentId
is its execution's RangeId.

A multi-process run writes one archive per process, each holding its own devices; the
archives of a run are read together, devices named `<archive>:<thread>`.
"""
from __future__ import annotations

import io
import re
import zipfile
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from flint.errors import FlintError
from flint.validate.measured import MeasuredStep, MeasuredTrace

_HLO_OP = re.compile(r"hlo_op=([^#,]+)")
_MODULE = re.compile(r"hlo_module=([^#,]+)")
_PROGRAM = re.compile(r"program_id=(\d+)")
_COLUMNS = ["Name", "Projected Start", "Projected Duration", "TID", "RangeId", "ParentId"]


def _columns(present: list[str], where: str = "the trace table") -> list[str]:
    """The columns read (only those used: a long trace has millions of rows); PID when
    there, to tell processes apart in a merged archive."""
    missing = [c for c in _COLUMNS if c not in present]
    if missing:
        raise FlintError(f"{where} lacks the column(s) {', '.join(missing)} "
                         f"(not an nsys-jax trace table)")
    return _COLUMNS + [c for c in ("PID",) if c in present]


@dataclass
class ModuleRun:
    device: str                      # launcher thread id, prefixed by the archive in a run
    start_ns: int
    duration_ns: int
    ops_ns: dict = field(default_factory=dict)   # hlo_op -> summed GPU time in this run
    # (start ns, duration ns, hlo_op) of every leaf thunk, kept only when asked for
    thunks: list | None = None


@dataclass
class NsysJaxTrace:
    path: str
    module: str
    hlo: bytes                       # HloProto of the optimized module
    runs: list[ModuleRun]
    gpu: str = ""                    # the GPU XLA compiled for (gpu_target_config)
    gpu_memory_bytes: float = 0.0

    def steps(self) -> list[list[ModuleRun]]:
        """Executions grouped into steps (the k-th run of every device), in time order."""
        by_dev: dict[str, list[ModuleRun]] = defaultdict(list)
        for r in sorted(self.runs, key=lambda r: r.start_ns):
            by_dev[r.device].append(r)
        count = min(len(v) for v in by_dev.values())
        return [[by_dev[d][k] for d in sorted(by_dev)] for k in range(count)]


class _Archive:
    """One archive's member names and module/thunk rows."""

    def __init__(self, path: Path):
        if not path.is_file():
            raise FlintError(f"file not found: {path}")
        try:
            self.zip = zipfile.ZipFile(path)
        except zipfile.BadZipFile:
            raise FlintError(f"{path} is not an nsys-jax archive (not a zip file)") from None
        self.path = path
        self.names = self.zip.namelist()
        parquet = next((n for n in self.names if n.endswith("trace.parquet")), None)
        if parquet is None:
            raise FlintError(f"{path} has no trace.parquet: not an nsys-jax archive")
        import pyarrow.parquet as pq

        df = self.read(parquet, lambda b: pq.read_table(io.BytesIO(b), columns=_columns(
            pq.ParquetFile(io.BytesIO(b)).schema_arrow.names, f"{path}: {parquet}")).to_pandas())
        names = df["Name"].fillna("").astype(str)
        df = df.assign(Name=names)
        self.parquet = parquet
        self.modules = df[names.str.startswith("TSL:XlaModule")].copy()
        self.modules["module"] = self.modules["Name"].str.extract(_MODULE, expand=False)
        self.modules["program"] = self.modules["Name"].str.extract(_PROGRAM, expand=False)
        self.thunks = df[names.str.startswith("TSL:Thunk")]

    def read(self, member: str, decode):
        try:
            return decode(self.zip.read(member))
        except FlintError:
            raise
        except MemoryError:
            raise FlintError(f"{self.path}: out of memory reading {member}") from None
        except Exception as e:  # noqa: BLE001 - corrupt members surface as many error types
            raise FlintError(f"{self.path} is corrupt: {type(e).__name__}: {e}") from None

    def gpu_time(self) -> dict[str, int]:
        """Module name -> GPU-projected time of all its executions (ns)."""
        return self.modules.groupby("module")["Projected Duration"].sum().astype(int).to_dict()

    def hlo_member(self, module: str, program: str | None) -> str | None:
        """The optimized HLO of `module` (of its program id when the trace names one)."""
        found = [n for n in self.names if n.endswith(".hlo.pb.xz")
                 and "after_optimizations" in n and f".{module}." in n]
        prefix = f"module_{int(program):04d}." if program else None
        return next((n for n in found if prefix and prefix in n), found[0] if found else None)

    def runs(self, module: str, prefix: str,
             keep_thunks: bool = False) -> tuple[list[ModuleRun], str | None]:
        try:
            return self._runs(module, prefix, keep_thunks)
        except (ValueError, TypeError, OverflowError) as e:
            raise FlintError(f"{self.path}: malformed row in {self.parquet}: "
                             f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                             ) from None

    def _runs(self, module: str, prefix: str,
              keep_thunks: bool) -> tuple[list[ModuleRun], str | None]:
        """(the executions of `module` with their leaf thunk times, its program id). A module
        compiled more than once (same name, several program ids) is taken at its busiest."""
        mods = self.modules[self.modules["module"] == module]
        if mods.empty:
            have = ", ".join(sorted(self.modules["module"].dropna().unique()))
            raise FlintError(f"{self.path} has no executions of module {module!r} "
                             f"(it has: {have or 'none'})")
        program = None
        if mods["program"].notna().any():
            program = mods.groupby("program")["Projected Duration"].sum().idxmax()
            mods = mods[mods["program"] == program]
        devices = [f"{prefix}{int(t)}" for t in mods["TID"]]
        if "PID" in mods and mods["PID"].nunique() > 1:   # a merged archive: processes'
            devices = [f"{prefix}{int(p)}:{int(t)}"        # thread ids may coincide
                       for p, t in zip(mods["PID"], mods["TID"])]
        runs = {rid: ModuleRun(dev, int(start), int(dur), thunks=[] if keep_thunks else None)
                for rid, dev, start, dur in zip(mods["RangeId"], devices,
                                                mods["Projected Start"],
                                                mods["Projected Duration"])}
        if any(r.duration_ns < 0 for r in runs.values()):
            raise ValueError("a negative module duration")
        thunks = self.thunks
        parent_of = dict(zip(thunks["RangeId"], thunks["ParentId"]))
        has_child = set(thunks["ParentId"])
        for rid, name, start, dur in zip(thunks["RangeId"], thunks["Name"],
                                         thunks["Projected Start"], thunks["Projected Duration"]):
            if rid in has_child:  # a while/conditional thunk: its children carry the time
                continue
            run, hops = parent_of.get(rid), 0
            while run is not None and run not in runs and hops < 16:
                run, hops = parent_of.get(run), hops + 1
            m = _HLO_OP.search(name)
            if run in runs and m:
                ops = runs[run].ops_ns
                ops[m.group(1)] = ops.get(m.group(1), 0) + int(dur)
                if keep_thunks:
                    runs[run].thunks.append((int(start), int(dur), m.group(1)))
        return list(runs.values()), program

    def gpu(self, module: str, program: str | None) -> tuple[str, float]:
        """(device description, memory in bytes) from the module's gpu_target_config."""
        import lzma

        found = [n for n in self.names if n.endswith("gpu_target_config.pbtxt.xz")
                 and f".{module}." in n]
        prefix = f"module_{int(program):04d}." if program else None
        member = next((n for n in found if prefix and prefix in n), found[0] if found else None)
        if member is None:
            return "", 0.0
        text = self.read(member, lambda b: lzma.decompress(b).decode(errors="replace"))
        name = re.search(r'device_description_str:\s*"([^"]*)"', text)
        memory = re.search(r"device_memory_size:\s*(\d+)", text)
        return (name.group(1) if name else "", float(memory.group(1)) if memory else 0.0)


def read_nsys_jax(path, module: str | None = None) -> NsysJaxTrace:
    return read_nsys_jax_run([path], module)


def read_nsys_jax_run(paths, module: str | None = None) -> NsysJaxTrace:
    """The archives of one run (one per process), joined: every archive's devices, the
    HLO of the first. `module` defaults to the one with the most GPU time."""
    paths = [Path(p) for p in paths]
    seen = set()
    for p in paths:
        if p.resolve() in seen:
            raise FlintError(f"{p} is given twice: pass each process's archive once")
        seen.add(p.resolve())
    archives = [_Archive(p) for p in paths]
    if not archives:
        raise FlintError("no nsys-jax archive given")
    module = module or _busiest_module(archives)
    runs, programs = [], []
    for i, a in enumerate(archives):
        got, program = a.runs(module, f"{i}:" if len(archives) > 1 else "")
        runs += got
        programs.append(program)
    first = archives[0]
    hlo_name = first.hlo_member(module, programs[0])
    if hlo_name is None:
        raise FlintError(f"{first.path} has no optimized HLO of module {module!r}")
    import lzma

    hlo = first.read(hlo_name, lzma.decompress)
    gpu, memory = first.gpu(module, programs[0])
    where = ", ".join(str(p) for p in paths)
    return NsysJaxTrace(where, module, hlo, runs, gpu, memory)


def read_thunks(path, module: str | None = None) -> list[ModuleRun]:
    """One archive's executions of `module` (default: the busiest) with every leaf thunk's
    GPU-projected start and length (ModuleRun.thunks), for timing analyses."""
    archive = _Archive(Path(path))
    return archive.runs(module or _busiest_module([archive]), "", keep_thunks=True)[0]


def _busiest_module(archives: list[_Archive]) -> str:
    """The module with the most GPU time over all archives that has an optimized HLO."""
    total: dict[str, int] = defaultdict(int)
    for a in archives:
        for name, ns in a.gpu_time().items():
            total[name] += ns
    for name in sorted(total, key=lambda n: (-total[n], n)):
        if archives[0].hlo_member(name, None) is not None:
            return name
    raise FlintError(f"{archives[0].path} has no module execution with an optimized HLO "
                     f"in its dump/")


def measured_from_nsys(trace: NsysJaxTrace) -> MeasuredTrace:
    """The archive as steps x devices x ops (the k-th execution of every device is step k)."""
    steps = []
    for k, runs in enumerate(trace.steps()):
        steps.append(MeasuredStep(
            k + 1, max(r.duration_ns for r in runs) * 1e-9,
            {r.device: {op: ns * 1e-9 for op, ns in sorted(r.ops_ns.items())} for r in runs}))
    return MeasuredTrace(trace.path, "nsys-jax", trace.module, steps, trace.hlo, trace.gpu,
                         trace.gpu_memory_bytes)
