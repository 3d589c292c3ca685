"""The validate and calibrate workflows behind `flint validate` / `flint calibrate`."""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path

from flint.errors import FlintError
from flint.hardware_models.spec import HardwareSpec
from flint.validate.calibrate import Calibration, fit_collectives, fit_compute, model_for
from flint.validate.compare import Validation, validate
from flint.validate.load import graph_from_trace, read_trace
from flint.validate.measured import MeasuredTrace, parse_steps
from flint.validate.samples import collective_error, samples_from_graph, samples_from_nccl


@dataclass
class TraceInput:
    trace: MeasuredTrace            # all steps
    graph: object = None            # WorkloadGraph, or None for NCCL-only Kineto traces
    nccl: list = field(default_factory=list)


def open_input(path, graph=None, hardware: str = "unknown", module=None,
               devices: int | None = None, xla_emitters: str | None = None) -> TraceInput:
    """A trace (or the per-process nsys-jax archives of one run, as a list) with the graph
    it is compared with: `graph`, or the one its HLO gives for `devices` devices.
    `xla_emitters`: the XLA fusion emitters that made the traced kernels
    (hardware_models.populations.XLA_EMITTERS; None: the graph's own, mlir unless stamped)."""
    paths = list(path) if isinstance(path, (list, tuple)) else [path]
    if len(paths) == 1:
        path = paths[0]
    if (graph is not None and graph.meta.get("source") == "torch" and len(paths) == 1
            and not Path(path).is_dir()):
        from flint.validate.jax_profiler import load_trace_events
        from flint.validate.torch_profile import is_torch_cpu_trace, torch_cpu_steps

        events = load_trace_events(Path(path))
        if is_torch_cpu_trace(events):
            return TraceInput(torch_cpu_steps(events, graph, str(path)), graph)
    trace = read_trace(paths, module)
    if trace.kind == "kineto":
        nccl = samples_from_nccl(path)
        if graph is None and not nccl:
            raise FlintError(f"{path}: a PyTorch trace joins to a graph from the torch front "
                             f"end; this one has no NCCL kernels with sizes to calibrate on")
        return TraceInput(trace, graph, nccl)
    if graph is None:
        graph = graph_from_trace(trace, hardware, devices)
    if xla_emitters is not None:
        if graph.meta.get("source") == "torch":
            raise FlintError(f"{path}: xla_emitters is for XLA programs; this graph is "
                             f"PyTorch's")
        from flint.passes.kernel_population import KernelPopulation

        graph = KernelPopulation("xla", xla_emitters=xla_emitters).run(graph)
    if any(s.kernels for s in trace.steps):
        from flint.validate.command_buffers import name_command_buffer_kernels

        name_command_buffer_kernels(trace, graph)
    elif graph.meta.get("source") != "torch" and not _ran_command_buffers(trace):
        graph = _launched_one_by_one(graph)
    return TraceInput(trace, graph)


def _ran_command_buffers(trace: MeasuredTrace) -> bool:
    """Whether an XLA trace shows command buffers: a thunk named after one (nsys-jax) or
    kernels tagged with one (the JAX profiler: MeasuredStep.kernels)."""
    from flint.validate.jax_profiler import COMMAND_BUFFER

    return any(s.kernels or any(COMMAND_BUFFER.match(op) for d in s.ops.values() for op in d)
               for s in trace.steps)


def _launched_one_by_one(graph):
    """The traced run had XLA's command buffers off: every thunk was launched on its own,
    so each kernel waits the GPU's launch gap (meta cuda_graphs: false)."""
    from dataclasses import replace

    return replace(graph, nodes=[replace(n, meta=dict(n.meta, cuda_graphs=False))
                                 for n in graph.nodes],
                   meta=dict(graph.meta, cuda_graphs=False))


def split_steps(trace: MeasuredTrace, fit: str | None, check: str | None):
    """(fit steps, check steps): as given, or the kept steps' first half / second half."""
    if fit or check:
        f = trace.select(parse_steps(fit)) if fit else None
        c = trace.select(parse_steps(check)) if check else None
        return f or c, c
    kept = trace.select()
    if len(kept.steps) < 2:
        return kept, None
    half = len(kept.steps) // 2
    return (trace.select([s.number for s in kept.steps[:half]]),
            trace.select([s.number for s in kept.steps[half:]]))


def run_validate(inp: TraceInput, spec: HardwareSpec, steps: str | None = None,
                 exclude=(), cost_model=None, hardware: str | None = None,
                 overrides=()) -> Validation:
    """`cost_model`: a third-party factory (hardware_models.pluggable), given `hardware`
    (default: the spec's name) and `overrides`; default: Flint's model of `spec`."""
    if inp.graph is None:
        raise FlintError(f"{inp.trace.path}: no graph to validate against (pass GRAPH)")
    if cost_model is None:
        model = model_for(spec, inp.graph)
    else:
        from flint.hardware_models.pluggable import cost_model_for

        model = cost_model_for(inp.graph, hardware or spec.name, overrides, cost_model)
    return validate(inp.graph, inp.trace.select(parse_steps(steps)), model, exclude)


@dataclass
class CalibrationReport:
    calibration: Calibration
    rows: list = field(default_factory=list)   # dicts: trace, set, steps, before, after


def run_calibrate(inputs: list[TraceInput], spec: HardwareSpec, fit: str | None = None,
                  check: str | None = None, exclude=()) -> CalibrationReport:
    cal = Calibration()
    compute, colls, splits = [], [], []
    for inp in inputs:
        if inp.graph is not None:
            fit_t, check_t = split_steps(inp.trace, fit, check)
            splits.append((inp, fit_t, check_t))
            c, k = samples_from_graph(inp.graph, fit_t, exclude)
            compute += c
            colls += k
        colls += inp.nccl
    if not compute and not colls:
        raise FlintError("nothing to calibrate on: no trace op joined to a graph")
    fit_compute(compute, spec, cal)
    fit_collectives(colls, spec, cal, ", ".join(Path(i.trace.path).name for i in inputs))
    _match_steps(cal, spec, splits, exclude)
    after = cal.apply(spec)
    report = CalibrationReport(cal)
    for inp, fit_t, check_t in splits:
        for label, t in (("fit", fit_t), ("check", check_t)):
            if t is None:
                continue
            b = validate(inp.graph, t, model_for(spec, inp.graph), exclude)
            a = validate(inp.graph, t, model_for(after, inp.graph), exclude)
            report.rows.append(_row(inp.trace.path, label, t, b, a))
    for inp in inputs:
        if inp.nccl:
            report.rows.append({"trace": inp.trace.path, "set": "fit (collectives)",
                                "steps": "fastest per size",
                                "before": {"collective_median_abs_error":
                                           collective_error(inp.nccl, spec)},
                                "after": {"collective_median_abs_error":
                                          collective_error(inp.nccl, after)}})
    return report


def _match_steps(cal: Calibration, spec: HardwareSpec, splits, exclude) -> None:
    """On a machine that is not its spec (effective rates were recorded), per-op fits leave
    what the ops do not show (time slicing of host threads, gaps): scale the effective
    rates so that the fit steps' predicted step time equals the measured one."""
    if not splits or not any(k.startswith("peak_") or k == "hbm_bandwidth"
                             for k in cal.hardware):
        return
    for _ in range(3):
        ratios = []
        for inp, fit_t, _check in splits:
            v = validate(inp.graph, fit_t, model_for(cal.apply(spec), inp.graph), exclude)
            ratios.append(v.measured_step_s / v.predicted_step_s)
        r = statistics.median(ratios)
        if abs(r - 1) < 0.01:
            break
        cal.hardware = {k: v / r for k, v in cal.hardware.items()}
    cal.notes.append(f"effective rates scaled to match the fit steps' time (last ratio {r:.3f})")


def _row(path, label, trace, before: Validation, after: Validation) -> dict:
    def summary(v: Validation) -> dict:
        errs = v.op_errors()
        return {"step_error": v.step_error,
                "op_median_abs_error": statistics.median(errs) if errs else None}
    return {"trace": path, "set": label, "steps": [s.number for s in trace.steps],
            "before": summary(before), "after": summary(after)}


def write_calibrated_spec(base: str, cal: Calibration, out: str, traces: list[str]) -> None:
    """The base spec's YAML with calibrated efficiencies (and effective link figures)."""
    import yaml

    from flint.hardware_models.spec import SPECS_DIR
    from flint.io import write_atomic

    path = Path(base) if Path(base).suffix in (".yaml", ".yml") else SPECS_DIR / f"{base}.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["name"] = Path(out).stem
    doc["efficiency"] = {**(doc.get("efficiency") or {}), **cal.efficiency}
    where = {"scale_up_bandwidth": ("interconnect", "scale_up", "bandwidth_per_direction"),
             "nic_bandwidth": ("interconnect", "scale_out", "bandwidth_per_direction"),
             "hbm_bandwidth": ("memory", "hbm_bandwidth")}
    where.update({f"peak_{d}": ("compute", "peak_flops", d)
                  for d in (doc.get("compute", {}).get("peak_flops") or {})})
    for name in sorted(cal.hardware):
        node = doc
        *parents, leaf = where[name]
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = {"value": cal.hardware_text(name), "source": "flint calibrate: effective figure measured "
                      f"in {', '.join(sorted(Path(t).name for t in traces))}"}
    doc["calibration"] = {"base": path.stem, "traces": sorted(Path(t).name for t in traces),
                          "notes": list(cal.notes), "points": dict(sorted(cal.points.items()))}
    write_atomic(out, yaml.safe_dump(doc, sort_keys=True, width=100))
