"""Fit the cost model's figures to measured traces, and write a calibrated spec.

Every fitted parameter is a physical figure of the kernel and network models, so that it can
be carried to other hardware by a stated rule:
- `kernel_floor` (seconds): the shortest kernels' time, just under the 10th percentile of
  kernel times;
- `gemm_fraction`, `attention_fraction`(+`_native`), `hbm_fraction`, `vector_fraction`: the
  achievable share of the peak per op class, chosen on a grid to minimise the mean absolute
  log error of that class's ops (time is inversely proportional to the share);
- `bus_scale_up` / `bus_scale_out`: the bus efficiency of a network level, from the fastest
  instance of each collective (kernel times include waiting for peers; the fastest is the
  transfer). A level measured far below its link rate (< 25%) is not an efficiency but a
  different machine (a PCIe box under an NVLink spec): that is written as the level's
  effective bandwidth, a hardware figure, which does not transfer to other hardware.
Transfer rule (`Calibration.apply(other_spec, with_hardware=False)`): what a calibration
learns is how this software stack does relative to the public figures of the traced GPU;
each fitted figure is carried as its ratio to the traced spec's own figure, times the other
spec's figure (capped at 1 for shares of a peak). Effective hardware figures do not carry.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace

from flint.graph import TENSOR_CLASSES
from flint.hardware_models import kernels
from flint.hardware_models.compute import RooflineCompute
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
    reference: dict = field(default_factory=dict)    # the traced spec's own figure per key

    def hardware_text(self, name: str) -> str:
        """A hardware figure with its unit, as a spec YAML or `--set` writes it."""
        v = self.hardware[name]
        return f"{v / 1e9:.6g} GFLOP/s" if name.startswith("peak_") else f"{v / 1e9:.6g} GB/s"

    def apply(self, spec: HardwareSpec, with_hardware: bool = True) -> HardwareSpec:
        """The calibrated spec. `with_hardware=False` is for other hardware: efficiencies
        (how well software uses a machine) carry over; figures of the traced machine
        (effective links and peaks) do not."""
        if with_hardware:
            base = _with_figures(spec, self.hardware)
            return replace(base, efficiency={**spec.efficiency, **self.efficiency})
        return replace(spec, efficiency={**spec.efficiency, **self.carried_to(spec)})

    def carried_to(self, spec: HardwareSpec) -> dict:
        """The fitted figures carried to `spec` by the transfer rule (module docstring)."""
        out = {}
        for key, value in self.efficiency.items():
            ref = self.reference.get(key)
            if not ref or not isinstance(value, (int, float)):
                continue
            target = reference_figure(spec, key) * float(value) / ref
            out[key] = min(target, 1.0) if key != "kernel_floor" else target
        return out


def reference_figure(spec: HardwareSpec, key: str) -> float:
    """The uncalibrated figure of `spec` that a fitted `key` replaces."""
    if key.startswith("bus_"):
        return float(DEFAULT_BUS_EFFICIENCY[key[4:]])
    return kernels.figure(spec, key)


def _fit_share(compute_s: list[float], other_s: list[float], measured: list[float],
               floor: float, default: float, extra_s: list[float] | None = None) -> float:
    """The share of peak minimising the mean |log(predicted / measured)| of
    t = floor + extra + max(compute_s x default / share, other_s) over a bounded grid (extra:
    each op's DRAM round trip, RooflineCompute.memory_latency): the absolute log error is
    the per-op error users read, is robust to stray points, and a bounded grid cannot run
    off to non-physical shares."""
    import numpy as np

    c, o, t = np.asarray(compute_s), np.asarray(other_s), np.asarray(measured)
    e = np.asarray(extra_s if extra_s is not None else [0.0] * len(compute_s))
    shares = np.geomspace(IMPLAUSIBLE_COMPUTE, 1.0, 120)[:, None]
    pred = floor + e[None, :] + np.maximum(c[None, :] * default / shares, o[None, :])
    loss = np.abs(np.log(pred / t)).mean(axis=1)
    return float(shares[int(np.argmin(loss)), 0])


def fit_compute(samples: list[ComputeSample], spec: HardwareSpec, cal: Calibration) -> None:
    roof = RooflineCompute(spec)
    default_floor = roof.launch_overhead()
    if len(samples) >= MIN_POINTS:
        spec = _effective_machine(samples, spec, roof, cal)
        roof = RooflineCompute(spec, {k: v for k, v in cal.efficiency.items()})
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
            cal.notes.append("too few compute ops to fit: compute figures unchanged")
        return
    times = sorted(s.seconds for s in kept)
    floor = min(times[max(0, int(0.1 * len(times)) - 1)] * 0.9, 4 * default_floor)
    cal.efficiency["kernel_floor"] = float(f"{floor:.4g}")
    cal.reference["kernel_floor"] = reference_figure(spec, "kernel_floor")
    groups: dict[str, list[tuple[float, float, float, float]]] = {}
    stream = spec.hbm_bandwidth * roof.figure("hbm_fraction")
    for s in kept:
        t_flops, t_bytes = roof.bound(s.node)
        if s.node.op_class in TENSOR_CLASSES and t_flops >= t_bytes:
            key, c, o = kernels.CLASS_FIGURE[s.node.op_class], t_flops, t_bytes
        elif t_bytes >= t_flops:
            if roof.memory_bandwidth(s.node) < stream:
                continue     # bound per SM by its code (populations.py), not by the stream
            key, c, o = "hbm_fraction", t_bytes, t_flops
        else:
            key, c, o = "vector_fraction", t_flops, t_bytes
        if c > 0:
            groups.setdefault(key, []).append((c, o, s.seconds, roof.memory_latency(s.node)))
    for key, pts in sorted(groups.items()):
        cal.points[key] = len(pts)
        if len(pts) < MIN_POINTS or key in cal.efficiency:   # set with the machine figures
            continue
        default = roof.figure(key)
        share = _fit_share([p[0] for p in pts], [p[1] for p in pts], [p[2] for p in pts],
                           floor, default, [p[3] for p in pts])
        cal.efficiency[key] = float(f"{share:.4g}")
        cal.reference[key] = reference_figure(spec, key)
        if key == "attention_fraction":     # one fit for both kernel families seen here
            cal.efficiency["attention_fraction_native"] = cal.efficiency[key]
            cal.reference["attention_fraction_native"] = reference_figure(
                spec, "attention_fraction_native")


def _effective_machine(samples, spec: HardwareSpec, roof, cal: Calibration) -> HardwareSpec:
    """When ops run far slower than any efficiency explains (8 virtual devices sharing two
    host cores under a dual-socket spec), the machine is not the spec. Its peak FLOP/s
    (from tensor ops) and memory bandwidth (from memory-bound ops) become the rates those
    ops achieved in total (so their summed time, hence the step, is matched), recorded as
    hardware figures of this machine with efficiency 1 against them."""
    launch = roof.launch_overhead()
    gemm_share = roof.figure("gemm_fraction")
    hbm_share = roof.figure("hbm_fraction")
    tensor_work, tensor_t, bytes_moved, memory_t = 0.0, 0.0, 0.0, 0.0
    tensor_pred, memory_pred = 0.0, 0.0
    for s in samples:
        t_flops, t_bytes = roof.bound(s.node)
        busy = max(s.seconds - launch, 0.0)
        if s.node.op_class in TENSOR_CLASSES and t_flops > 0:
            tensor_work += s.node.flops / spec.peak(_dtype(s.node, spec))   # s at peak
            tensor_t, tensor_pred = tensor_t + busy, tensor_pred + t_flops * gemm_share
        elif t_bytes >= t_flops and t_bytes > 0:
            bytes_moved += s.node.bytes_read + s.node.bytes_written
            memory_t, memory_pred = memory_t + busy, memory_pred + t_bytes * hbm_share
    figures = {}
    slow_tensor = tensor_pred > 0 and tensor_t * IMPLAUSIBLE_COMPUTE > tensor_pred
    slow_memory = memory_pred > 0 and memory_t * IMPLAUSIBLE_COMPUTE > memory_pred
    if slow_tensor:
        factor = tensor_t / tensor_work          # achieved = peak / factor
        figures.update({f"peak_{d}": v / factor for d, v in spec.peak_flops.items()})
        for key in ("gemm_fraction", "attention_fraction", "attention_fraction_native"):
            cal.efficiency[key] = 1.0
    if slow_memory:
        figures["hbm_bandwidth"] = bytes_moved / memory_t
        cal.efficiency["hbm_fraction"] = 1.0
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
    from flint.hardware_models.compute import tensor_dtype

    return tensor_dtype(node, spec.kind)


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
            cal.reference[f"bus_{level}"] = reference_figure(spec, f"bus_{level}")
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
