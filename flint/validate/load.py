"""One entry point for every trace format Flint reads."""
from __future__ import annotations

import zipfile
from pathlib import Path

from flint.errors import FlintError
from flint.validate.measured import MeasuredTrace


def read_trace(path, module: str | None = None) -> MeasuredTrace:
    """nsys-jax archive (.zip), JAX profiler output (file or log dir), or Kineto JSON."""
    p = Path(path)
    if not p.exists():
        raise FlintError(f"trace not found: {p}")
    if p.is_dir():
        from flint.validate.jax_profiler import read_jax_profile

        return read_jax_profile(p, module)
    if zipfile.is_zipfile(p):
        from flint.validate.nsys_jax import measured_from_nsys, read_nsys_jax

        return measured_from_nsys(read_nsys_jax(p, module or "jit_train_step"))
    if p.name.endswith(".xplane.pb"):
        from flint.validate.jax_profiler import read_jax_profile

        return read_jax_profile(p, module)
    from flint.validate.jax_profiler import is_jax_profile, load_trace_events, read_jax_profile

    events = load_trace_events(p)
    if not events:
        raise FlintError(f"{p} is an empty trace")
    if is_jax_profile(events):
        return read_jax_profile(p, module, events)
    from flint.validate.kineto import kineto_steps

    if any(e.get("cat") == "kernel" for e in events):
        return kineto_steps({"traceEvents": events}, str(p))
    raise FlintError(f"{p}: neither a JAX/XLA profile (no hlo_op events) nor a PyTorch "
                     f"Kineto trace (no GPU kernels)")


def graph_from_trace(trace: MeasuredTrace, hardware: str = "unknown"):
    """The WorkloadGraph of the optimized HLO a trace ships (nsys-jax archives do)."""
    if trace.hlo is None:
        raise FlintError(f"{trace.path} carries no HLO: pass the graph (or the extract "
                         f"inputs) of the step it profiled")
    from flint.cluster import Cluster
    from flint.hlo.loaders import hlo_text_from_proto
    from flint.hlo.module import parse_module
    from flint.passes.lower_hlo import lower_hlo

    module = parse_module(hlo_text_from_proto(trace.hlo))
    devices = max(module.num_partitions * module.replica_count,
                  max((len(s.ops) for s in trace.steps), default=1))
    return lower_hlo(module, Cluster(devices, (("devices", devices),), hardware, "gpu",
                                     min(devices, 8)))
