"""One entry point for every trace format Flint reads."""
from __future__ import annotations

import zipfile
from dataclasses import replace
from pathlib import Path

from flint.errors import FlintError
from flint.validate.measured import MeasuredTrace

_COLLECTIVE_PREFIXES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all",
                        "collective-permute", "collective-broadcast", "ragged-all-to-all")


def read_trace(path, module: str | None = None) -> MeasuredTrace:
    """nsys-jax archive (.zip), JAX profiler output (file or log dir), or Kineto JSON. A
    list of paths is the archives of one multi-process run (nsys-jax: one per process)."""
    if isinstance(path, (list, tuple)):
        if len(path) != 1:
            return _read_run(list(path), module)
        path = path[0]
    p = Path(path)
    if not p.exists():
        raise FlintError(f"trace not found: {p}")
    if p.is_dir():
        from flint.validate.jax_profiler import read_jax_profile

        return read_jax_profile(p, module)
    if zipfile.is_zipfile(p):
        from flint.validate.nsys_jax import measured_from_nsys, read_nsys_jax

        return measured_from_nsys(read_nsys_jax(p, module))
    if p.name.endswith(".xplane.pb"):
        from flint.validate.jax_profiler import read_jax_profile

        return read_jax_profile(p, module)
    from flint.validate.jax_profiler import is_jax_profile, read_jax_profile
    from flint.validate.trace_events import read_trace_document

    doc = read_trace_document(p)
    events = doc["traceEvents"]
    if not events:
        raise FlintError(f"{p} is an empty trace")
    if is_jax_profile(events):
        return read_jax_profile(p, module, events)
    from flint.validate.kineto import kineto_steps
    from flint.validate.trace_gpu import gpu_of_kineto

    if any(e.get("cat") == "kernel" for e in events):
        gpu, memory = gpu_of_kineto(doc)
        return replace(kineto_steps({"traceEvents": events}, str(p)), hardware=gpu,
                       hardware_memory_bytes=memory)
    raise FlintError(f"{p}: neither a JAX/XLA profile (no hlo_op events) nor a PyTorch "
                     f"Kineto trace (no GPU kernels)")


def _read_run(paths: list, module: str | None) -> MeasuredTrace:
    not_archives = [str(p) for p in paths if not (Path(p).is_file() and zipfile.is_zipfile(p))]
    if not_archives:
        raise FlintError(f"several traces of one run must all be nsys-jax archives (one per "
                         f"process); not one: {not_archives[0]}")
    from flint.validate.nsys_jax import measured_from_nsys, read_nsys_jax_run

    return measured_from_nsys(read_nsys_jax_run(paths, module))


def graph_from_trace(trace: MeasuredTrace, hardware: str = "unknown",
                     devices: int | None = None):
    """The WorkloadGraph of the optimized HLO a trace ships (nsys-jax archives do), for
    `devices` devices or, by default, as many as the HLO and the trace show."""
    if trace.hlo is None:
        raise FlintError(f"{trace.path} carries no HLO: pass the graph (or the extract "
                         f"inputs) of the step it profiled")
    from flint.cluster import Cluster
    from flint.hlo.loaders import module_from_proto
    from flint.passes.lower_hlo import lower_hlo

    module = module_from_proto(trace.hlo, trace.path)
    named = devices_named(module)
    if devices is None:
        devices = max(module.num_partitions * module.replica_count, named,
                      max((len(s.ops) for s in trace.steps), default=1))
    elif devices < named:
        raise FlintError(f"--devices {devices}: the HLO's collectives name device {named - 1}")
    return lower_hlo(module, Cluster(devices, (("devices", devices),), hardware, "gpu",
                                     min(devices, 8)))


def devices_named(module) -> int:
    """1 + the largest device id the module's collectives name (replica groups, source-
    target pairs); 1 when none does. A per-process trace holds one process's devices,
    while its SPMD program's collectives span them all."""
    import numpy as np

    from flint.hlo.replica_groups import parse_replica_groups, parse_source_target_pairs

    top = 0
    for comp in module.computations.values():
        for ins in comp.instructions:
            if not ins.opcode.startswith(_COLLECTIVE_PREFIXES) or ins.opcode.endswith("-done"):
                continue
            if ins.opcode.startswith("collective-permute"):
                ids = parse_source_target_pairs(ins.attr("source_target_pairs"))
            else:
                text = ins.replica_groups()
                if not text or text.strip() in ("{}", ""):
                    continue
                ids = parse_replica_groups(text, 1)
            if np.size(ids):
                top = max(top, int(np.max(ids)) + 1)
    return max(top, 1)
