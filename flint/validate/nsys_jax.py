"""nsys-jax archives: the optimized HLO XLA ran plus per-thunk GPU times (NVIDIA JAX-Toolbox).

Layout: `dump/*.<module>.sm_*_gpu_after_optimizations.hlo.pb.xz` (HloProto) and
`nvtx_gpu_proj_trace/trace.parquet`: one row per module execution
(`TSL:XlaModule:#...hlo_module=<module>...`) and one per thunk (`TSL:Thunk:#...hlo_op=<op>#`)
with GPU-projected start/duration in ns; a thunk's ParentId is its execution's RangeId.
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


@dataclass
class ModuleRun:
    device: int                      # thread id of the device's launcher
    start_ns: int
    duration_ns: int
    ops_ns: dict = field(default_factory=dict)   # hlo_op -> summed GPU time in this run


@dataclass
class NsysJaxTrace:
    path: str
    module: str
    hlo: bytes                       # HloProto of the optimized module
    runs: list[ModuleRun]

    def steps(self) -> list[list[ModuleRun]]:
        """Executions grouped into steps (the k-th run of every device), in time order."""
        by_dev: dict[int, list[ModuleRun]] = defaultdict(list)
        for r in sorted(self.runs, key=lambda r: r.start_ns):
            by_dev[r.device].append(r)
        count = min(len(v) for v in by_dev.values())
        return [[by_dev[d][k] for d in sorted(by_dev)] for k in range(count)]


def read_nsys_jax(path, module: str = "jit_train_step") -> NsysJaxTrace:
    path = Path(path)
    if not path.is_file():
        raise FlintError(f"file not found: {path}")
    try:
        z = zipfile.ZipFile(path)
    except zipfile.BadZipFile:
        raise FlintError(f"{path} is not an nsys-jax archive (not a zip file)") from None
    names = z.namelist()
    hlo_name = next((n for n in names if n.endswith(".hlo.pb.xz") and f".{module}." in n
                     and "after_optimizations" in n), None)
    parquet = next((n for n in names if n.endswith("trace.parquet")), None)
    if hlo_name is None or parquet is None:
        raise FlintError(f"{path} has no optimized HLO of {module!r} or no trace.parquet")
    import lzma

    import pyarrow.parquet as pq

    try:
        hlo = lzma.decompress(z.read(hlo_name))
        df = pq.read_table(io.BytesIO(z.read(parquet))).to_pandas()
    except Exception as e:  # noqa: BLE001 - corrupt members surface as many error types
        raise FlintError(f"{path} is corrupt: {type(e).__name__}: {e}") from None
    missing = [c for c in _COLUMNS if c not in df.columns]
    if missing:
        raise FlintError(f"{path}: {parquet} lacks the column(s) {', '.join(missing)} "
                         f"(not an nsys-jax trace table)")
    try:
        return NsysJaxTrace(str(path), module, hlo, _module_runs(df, module, path))
    except (ValueError, TypeError, OverflowError) as e:
        raise FlintError(f"{path}: malformed row in {parquet}: {type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''}") from None


# The trace table's columns Flint reads, in the order _module_runs expects the first three.
_COLUMNS = ("Name", "Projected Start", "Projected Duration", "TID", "RangeId", "ParentId")


def _module_runs(df, module: str, path) -> list[ModuleRun]:
    df = df[list(_COLUMNS)]
    names_col = df["Name"].fillna("").astype(str)
    mods = df[names_col.str.startswith("TSL:XlaModule") &
              names_col.str.contains(f"hlo_module={module}", regex=False)]
    if mods.empty:
        raise FlintError(f"{path} has no executions of module {module!r}")
    runs = {}
    for row in mods.itertuples(index=False):
        runs[row.RangeId] = ModuleRun(int(row.TID), int(row._1), int(row._2))
    if any(r.duration_ns < 0 for r in runs.values()):
        raise ValueError("a negative module duration")
    thunks = df[names_col.str.startswith("TSL:Thunk")]
    parent_of = dict(zip(thunks["RangeId"], thunks["ParentId"]))
    has_child = set(thunks["ParentId"])
    for rid, name, dur in zip(thunks["RangeId"], thunks["Name"], thunks["Projected Duration"]):
        if rid in has_child:  # a while/conditional thunk: its children carry the time
            continue
        run, hops = parent_of.get(rid), 0
        while run is not None and run not in runs and hops < 16:
            run, hops = parent_of.get(run), hops + 1
        m = _HLO_OP.search(str(name))
        if run in runs and m:
            ops = runs[run].ops_ns
            ops[m.group(1)] = ops.get(m.group(1), 0) + int(dur)
    return list(runs.values())


def measured_from_nsys(trace: NsysJaxTrace) -> MeasuredTrace:
    """The archive as steps x devices x ops (the k-th execution of every device is step k)."""
    steps = []
    for k, runs in enumerate(trace.steps()):
        steps.append(MeasuredStep(
            k + 1, max(r.duration_ns for r in runs) * 1e-9,
            {str(r.device): {op: ns * 1e-9 for op, ns in sorted(r.ops_ns.items())}
             for r in runs}))
    return MeasuredTrace(trace.path, "nsys-jax", trace.module, steps, trace.hlo)
