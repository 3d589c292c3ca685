"""Fit the cost model's efficiencies to measured traces, and write a calibrated spec.

Compute: under the roofline with eff(w) = max x w / (w + half), one execution takes
t = (w + half) / (peak x max) + launch in the work w (FLOP for GEMM / conv / attention,
bytes for memory-bound ops, vector FLOP otherwise). Per class, (max, half) minimise the
mean absolute log error over a bounded grid; the launch floor is just under the
10th percentile of kernel times.
Collectives: per network level, the bus efficiency that makes the bandwidth term match
the fastest measured instance (kernel times include waiting for peers; the fastest is the
transfer). A level measured far below its link rate (< 25%) is not an efficiency but a
different machine (a PCIe box under an NVLink spec): that is written as the level's
effective bandwidth, a hardware figure, which does not transfer to other hardware.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace

from flint.hardware_models.compute import TENSOR_CLASSES, RooflineCompute
from flint.hardware_models.cost_model import DefaultCostModel
from flint.hardware_models.network import DEFAULT_BUS_EFFICIENCY, NetworkModel
from flint.hardware_models.spec import HardwareSpec

MIN_POINTS = 3
GROSS_OUTLIER = 20.0          # measured/predicted beyond this (either way) is not fitted
IMPLAUSIBLE_BUS = 0.25        # below this share of the link rate: a different machine
IMPLAUSIBLE_COMPUTE = 0.05    # lowest efficiency fitted; a machine slower than that overall
                              # gets effective peak figures instead (see fit_compute)


@dataclass
class ComputeSample:
    node: object
    seconds: float            # one execution, measured


@dataclass
class CollectiveSample:
    node: object
    comm: object
    cluster: object           # the Cluster the communicator's ranks live in
    seconds: float            # one execution, fastest measured


@dataclass
class Calibration:
    efficiency: dict = field(default_factory=dict)   # goes under `efficiency:` in the spec
    hardware: dict = field(default_factory=dict)     # NAME -> SI value (B/s, FLOP/s)
    notes: list = field(default_factory=list)
    points: dict = field(default_factory=dict)       # class -> samples used

    def hardware_text(self, name: str) -> str:
        """A hardware figure with its unit, as a spec YAML or `--set` writes it."""
        v = self.hardware[name]
        return f"{v / 1e9:.6g} GFLOP/s" if name.startswith("peak_") else f"{v / 1e9:.6g} GB/s"

    def apply(self, spec: HardwareSpec, with_hardware: bool = True) -> HardwareSpec:
        """The calibrated spec. `with_hardware=False` is for other hardware: efficiencies
        (how well software uses a machine) carry over; figures of the traced machine
        (effective links and peaks) do not."""
        base = _with_figures(spec, self.hardware) if with_hardware else spec
        return replace(base, efficiency={**spec.efficiency, **self.efficiency})


def _fit_curve(xs: list[float], ts: list[float], launch: float) -> tuple[float, float]:
    """(max, half in seconds-at-peak) minimising the mean |log(predicted / measured)| of
    t = (x + half) / max + launch over a bounded grid. The absolute log error is the
    per-op error users read, is robust to stray points, and a bounded grid cannot run off
    to non-physical efficiencies."""
    import numpy as np

    x, t = np.asarray(xs), np.asarray(ts)
    w = np.full(len(t), 1.0 / len(t))
    maxes = np.geomspace(IMPLAUSIBLE_COMPUTE, 1.0, 60)[:, None, None]
    halves = np.concatenate([[0.0], np.geomspace(1e-8, 1e-2, 60)])[None, :, None]
    pred = (x[None, None, :] + halves) / maxes + launch
    loss = (w * np.abs(np.log(pred / t))).sum(axis=2)
    i, j = np.unravel_index(int(np.argmin(loss)), loss.shape)
    return float(maxes[i, 0, 0]), float(halves[0, j, 0])


def fit_compute(samples: list[ComputeSample], spec: HardwareSpec, cal: Calibration) -> None:
    roof = RooflineCompute(spec)
    default_launch = roof.launch_overhead()
    if len(samples) >= MIN_POINTS:
        spec = _effective_machine(samples, spec, roof, cal)
        roof = RooflineCompute(spec)
    kept = []
    for s in samples:
        pred = roof.time(s.node)
        if s.seconds > 0 and 1 / GROSS_OUTLIER < s.seconds / pred < GROSS_OUTLIER:
            kept.append(s)
    if len(kept) < len(samples):
        cal.notes.append(f"{len(samples) - len(kept)} compute op(s) off by more than "
                         f"{GROSS_OUTLIER:g}x were not fitted (outliers)")
    if len(kept) < MIN_POINTS:
        if samples:
            cal.notes.append("too few compute ops to fit: compute efficiencies unchanged")
        return
    times = sorted(s.seconds for s in kept)
    launch = times[max(0, int(0.1 * len(times)) - 1)] * 0.9
    launch = min(launch, 4 * default_launch)
    cal.efficiency["launch"] = launch
    groups: dict[str, list[tuple[float, float]]] = {}
    for s in kept:
        n = s.node
        if n.op_class in TENSOR_CLASSES:
            key, x = n.op_class, n.flops / spec.peak(_dtype(n, spec))
        else:
            t_flops, t_bytes = roof.bound(n)
            if t_bytes >= t_flops:
                key, x = "memory", (n.bytes_read + n.bytes_written) / spec.hbm_bandwidth
            else:
                key, x = "vector", (n.flops + 4.0 * n.transcendentals) / spec.peak("f32")
        if x > 0:
            groups.setdefault(key, []).append((x, s.seconds))
    for key, pts in sorted(groups.items()):
        cal.points[key] = len(pts)
        if len(pts) < MIN_POINTS or key in cal.efficiency:   # set with the machine figures
            continue
        max_eff, half_s = _fit_curve([p[0] for p in pts], [p[1] for p in pts], launch)
        ref = spec.hbm_bandwidth if key == "memory" else (
            spec.peak("f32") if key == "vector" else spec.peak("bf16"))
        cal.efficiency[key] = {"max": float(f"{max_eff:.4g}"), "half": float(f"{half_s * ref:.4g}")}


def _effective_machine(samples, spec: HardwareSpec, roof, cal: Calibration) -> HardwareSpec:
    """When ops run far slower than any efficiency explains (8 virtual devices sharing two
    host cores under a dual-socket spec), the machine is not the spec. Its peak FLOP/s
    (from tensor ops) and memory bandwidth (from memory-bound ops) become the rates those
    ops achieved in total (so their summed time, hence the step, is matched), recorded as
    hardware figures of this machine with efficiency 1 against them."""
    launch = roof.launch_overhead()
    tensor_work, tensor_t, bytes_moved, memory_t = 0.0, 0.0, 0.0, 0.0
    tensor_pred, memory_pred = 0.0, 0.0
    for s in samples:
        t_flops, t_bytes = roof.bound(s.node)
        busy = max(s.seconds - launch, 0.0)
        if s.node.op_class in TENSOR_CLASSES and t_flops > 0:
            tensor_work += s.node.flops / spec.peak(_dtype(s.node, spec))   # s at peak
            tensor_t, tensor_pred = tensor_t + busy, tensor_pred + t_flops
        elif t_bytes >= t_flops and t_bytes > 0:
            bytes_moved += s.node.bytes_read + s.node.bytes_written
            memory_t, memory_pred = memory_t + busy, memory_pred + t_bytes
    figures = {}
    slow_tensor = tensor_pred > 0 and tensor_t * IMPLAUSIBLE_COMPUTE > tensor_pred
    slow_memory = memory_pred > 0 and memory_t * IMPLAUSIBLE_COMPUTE > memory_pred
    if slow_tensor:
        factor = tensor_t / tensor_work          # achieved = peak / factor
        figures.update({f"peak_{d}": v / factor for d, v in spec.peak_flops.items()})
        for key in TENSOR_CLASSES:
            cal.efficiency[key] = {"max": 1.0, "half": 0.0}
    if slow_memory:
        figures["hbm_bandwidth"] = bytes_moved / memory_t
        cal.efficiency["memory"] = {"max": 1.0, "half": 0.0}
    if not figures:
        return spec
    cal.hardware.update(figures)
    cal.notes.append(f"ops ran over {1 / IMPLAUSIBLE_COMPUTE:g}x slower than the spec predicts: "
                     f"the traced machine is not the spec (shared or fewer cores?); the rates "
                     f"achieved ({', '.join(sorted(figures))}) are recorded as figures of this "
                     f"machine, which do not transfer")
    return _with_figures(spec, figures)


def _with_figures(spec: HardwareSpec, figures: dict) -> HardwareSpec:
    """`spec` with SI-valued figures (`peak_<dtype>` or a field name) replaced."""
    peaks = dict(spec.peak_flops)
    fields = {}
    for name, value in figures.items():
        if name.startswith("peak_"):
            peaks[name[5:]] = value
        else:
            fields[name] = value
    return replace(spec, peak_flops=peaks, **fields)


def _dtype(node, spec: HardwareSpec) -> str:
    from flint.hardware_models.compute import _tensor_dtype

    return _tensor_dtype(node, spec.kind)


def fit_collectives(samples: list[CollectiveSample], spec: HardwareSpec,
                    cal: Calibration, source: str = "") -> None:
    by_level: dict[str, list[float]] = {}
    for s in samples:
        net = NetworkModel(spec, s.cluster)
        pred = net.time(s.node, s.comm)
        no_latency = NetworkModel(replace(spec, scale_up_latency=0.0, nic_latency=0.0),
                                  s.cluster).time(s.node, s.comm)
        latency = pred - no_latency
        level = "scale_up" if net.placement(s.comm).domains == 1 else "scale_out"
        eff_now = net.bus_efficiency(level)
        transfer = s.seconds - latency
        if no_latency <= 0 or transfer <= 0:
            continue
        by_level.setdefault(level, []).append(no_latency * eff_now / transfer)
    for level, effs in sorted(by_level.items()):
        cal.points[f"bus_{level}"] = len(effs)
        eff = statistics.median(effs)
        if eff >= IMPLAUSIBLE_BUS:
            cal.efficiency[f"bus_{level}"] = round(min(eff, 1.0), 4)
            continue
        field_name = "scale_up_bandwidth" if level == "scale_up" else "nic_bandwidth"
        link = getattr(spec, field_name)
        effective = link * eff / DEFAULT_BUS_EFFICIENCY[level]
        cal.hardware[field_name] = effective
        cal.notes.append(
            f"{level} collectives ran at {100 * eff:.1f}% of the spec's {link / 1e9:g} GB/s "
            f"link{' in ' + source if source else ''}: the traced machine's link differs from "
            f"the spec (e.g. PCIe instead of NVLink); recorded as effective bandwidth "
            f"{effective / 1e9:.4g} GB/s, a hardware figure that does not transfer")


def model_for(spec: HardwareSpec, graph) -> DefaultCostModel:
    return DefaultCostModel(spec, RooflineCompute(spec), NetworkModel(spec, graph.cluster))
