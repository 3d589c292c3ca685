"""Hardware specs: one YAML per device in specs/, every figure with its public source.

`load_spec("h100-sxm", ["hbm_bandwidth=4.8TB/s", "nic_bandwidth=800Gb/s"])` reads the
figures into SI units (FLOP/s, B/s, B, s) and applies what-if overrides, checking units.
A path to a YAML file (e.g. a calibrated model) works in place of a name.

A spec may start from a shipped one: `based_on: h100-sxm` takes that spec's document and
replaces what this one states (a figure whole, a section key by key), so a system that is
another's GPU in other surroundings (GCP's A3 Mega: the DGX H100's GPU, its own NICs and
NCCL environment) states only where it differs, each with its own source.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path

from flint.errors import FlintError
from flint.hardware_models.spec_schema import (DTYPES, Figure, check_spec_doc, figure_at,
                                               parse_figure)

SPECS_DIR = Path(__file__).parent / "specs"
# Flat names for the figures that what-if overrides (and calibration) may set.
FIELDS = {
    "hbm_capacity": ("bytes", ("memory", "hbm_capacity")),
    "hbm_bandwidth": ("bandwidth", ("memory", "hbm_bandwidth")),
    "l2_cache": ("bytes", ("memory", "l2_cache")),
    "clock": ("frequency", ("compute", "clock")),
    "cores": ("count", ("compute", "cores")),
    "exponentials_per_clock": ("count", ("compute", "exponentials_per_clock")),
    "matrix_unit": ("count", ("compute", "matrix_unit")),   # TPU MXU edge (128 or 256)
    # Kernel-model figures (kernels.py): achievable shares of the peaks, and the floor.
    "gemm_fraction": ("ratio", ("compute", "gemm_fraction")),
    "attention_fraction": ("ratio", ("compute", "attention_fraction")),
    "attention_fraction_native": ("ratio", ("compute", "attention_fraction_native")),
    "vector_fraction": ("ratio", ("compute", "vector_fraction")),
    "kernel_floor": ("time", ("compute", "kernel_floor")),
    "launch_gap": ("time", ("compute", "launch_gap")),
    "hbm_fraction": ("ratio", ("memory", "hbm_fraction")),
    "scale_up_bandwidth": ("bandwidth", ("interconnect", "scale_up", "bandwidth_per_direction")),
    "scale_up_latency": ("time", ("interconnect", "scale_up", "latency")),
    "scale_up_links": ("count", ("interconnect", "scale_up", "links")),
    "scale_up_bus_efficiency": ("ratio", ("interconnect", "scale_up", "bus_efficiency")),
    "nic_bus_efficiency": ("ratio", ("interconnect", "scale_out", "bus_efficiency")),
    "nic_bandwidth": ("bandwidth", ("interconnect", "scale_out", "bandwidth_per_direction")),
    "nic_latency": ("time", ("interconnect", "scale_out", "latency")),
    "devices_per_node": ("count", ("system", "devices_per_node")),
    "scale_up_domain": ("count", ("system", "scale_up_domain")),
    "oversubscription": ("ratio", ("system", "oversubscription")),
    "leaf_group": ("count", ("system", "leaf_group")),
}
# Figures that are words, not quantities: the fabric's name and a TPU slice shape
# (`--set torus=4x4x8` picks the slice; the spec's `system.torus` is the largest one).
TEXT_FIELDS = ("fabric", "torus", "scale_up_link", "switch_reduction", "nccl_protocol")
SCALE_UP_LINKS = ("nvlink", "pci")
SWITCH_REDUCTIONS = ("none", "nvls")   # no reduction, or NVLink SHARP in the NVSwitch
# The NCCL protocol a system's environment allows (its NCCL_PROTO): "auto" lets NCCL's
# tuner pick among LL, LL128 and Simple. GCP's A3 / A3 Mega (GPUDirect-TCPX / TCPXO) run
# Simple only: the NCCL environment Google's recipes require sets NCCL_PROTO=Simple with
# NCCL_ALGO=Ring,Tree and NCCL_NVLS_ENABLE=0 (GoogleCloudPlatform cluster-toolkit
# a3-megagpu-8g examples, AI-Hypercomputer gpu-recipes a3mega templates; apple/axlearn's
# a3_mega launcher: "TCPX only supports Simple protocol"): LL and LL128 rely on the NIC
# writing flag-carrying 8- and 128-byte stores into GPU memory as they were sent, which a
# TCP receive path does not. NCCL_PROTO is process-wide: the choice holds inside a node too.
NCCL_PROTOCOLS = ("auto", "Simple", "LL128", "LL")
# Word figures of the interconnect: allowed values (the first is the default), and the
# level and key they are read from.
WORD_FIELDS = {"scale_up_link": SCALE_UP_LINKS, "switch_reduction": SWITCH_REDUCTIONS,
               "nccl_protocol": NCCL_PROTOCOLS}
WORD_KEYS = {"scale_up_link": ("scale_up", "link"),
             "switch_reduction": ("scale_up", "switch_reduction"),
             "nccl_protocol": ("scale_out", "nccl_protocol")}
# Latencies used when no public figure exists (documented modelling assumptions, replaced
# by calibration): NCCL's base latency per step is a few microseconds on NVLink and
# InfiniBand alike.
DEFAULT_LATENCY_S = {"scale_up_latency": 3e-6, "nic_latency": 8e-6}


@dataclass(frozen=True)
class HardwareSpec:
    name: str
    kind: str                        # gpu | tpu | cpu
    model: str
    peak_flops: dict                 # dtype -> FLOP/s (dense)
    hbm_capacity: float              # bytes
    hbm_bandwidth: float             # bytes/s
    l2_cache: float = 0.0
    clock: float = 0.0
    cores: int = 0                   # SMs (GPU), TensorCores (TPU), cores (CPU)
    exponentials_per_clock: int = 0  # per SM; 0 = kernels.SFU_EXP_PER_CLOCK_PER_SM
    matrix_unit: int = 0             # TPU systolic array edge; 0 = kernels.TPU_MXU
    gemm_fraction: float = 0.0       # 0 = not given: kernels.py documents the default
    attention_fraction: float = 0.0
    attention_fraction_native: float = 0.0
    vector_fraction: float = 0.0
    kernel_floor: float = 0.0
    launch_gap: float = 0.0          # 0 = not given: kernels.DEFAULT_LAUNCH_GAP_S
    hbm_fraction: float = 0.0
    scale_up_bandwidth: float = 0.0  # bytes/s per device, one direction
    scale_up_latency: float = DEFAULT_LATENCY_S["scale_up_latency"]
    scale_up_links: int = 0          # NVLinks per device; 0 = not given (interference.py)
    scale_up_bus_efficiency: float = 0.0   # 0 = not given: network.DEFAULT_BUS_EFFICIENCY
    nic_bus_efficiency: float = 0.0
    nic_bandwidth: float = 0.0       # bytes/s per device, one direction
    nic_latency: float = DEFAULT_LATENCY_S["nic_latency"]
    devices_per_node: int = 8
    scale_up_domain: int = 8
    oversubscription: float = 1.0
    leaf_group: int = 0              # devices per non-blocking leaf group; 0 = whole fabric
    fabric: str = "fat-tree"
    scale_up_link: str = "nvlink"    # nvlink | pci: which NCCL latency class the level has
    switch_reduction: str = "none"   # nvls: the scale-up switches reduce (NVLink SHARP)
    nccl_protocol: str = "auto"      # NCCL_PROTO the system's environment sets (auto: NCCL's)
    torus: str = ""                  # largest ICI slice, e.g. 16x16x24; "" if switched
    torus_slice: str = ""            # the slice a job uses (what-if); "" = most cubic fit
    # the compile-only target programs for this spec compile for ("" = none: a spec with
    # no XLA target of its own, e.g. MI300X; its graphs come from another target or a dump)
    compile_target: str = ""
    sources: dict = field(default_factory=dict)
    efficiency: dict = field(default_factory=dict)   # calibrated parameters, if any

    def peak(self, dtype: str) -> float:
        """Peak FLOP/s for an HLO dtype (bf16 GEMMs use bf16 tensor peak; f32 GEMMs TF32)."""
        key = {"bf16": "bf16", "f16": "fp16", "f32": "fp32", "f64": "fp64", "s8": "int8",
               "u8": "int8", "tf32": "tf32"}.get(
                   dtype, "fp8" if dtype.startswith("f8") else
                   "fp4" if dtype.startswith("f4") else dtype)
        # a GPU without TF32 (Volta) runs f32 GEMMs on its FP32 units, not its 16-bit
        # tensor cores; other missing dtypes take the 16-bit rate (fp8 upcast on Ampere,
        # bf16 as fp16 where there are no BF16 tensor cores, f32 on a TPU's bf16 passes)
        chain = ("tf32", "fp32") if key == "tf32" else ()
        for k in chain + (key, "bf16", "fp16", "fp32"):
            if k in self.peak_flops:
                return self.peak_flops[k]
        raise FlintError(f"hardware {self.name} has no peak FLOP/s for dtype {dtype!r}")


def spec_names() -> list[str]:
    return sorted(p.stem for p in SPECS_DIR.glob("*.yaml"))


def load_spec(name_or_path: str, overrides=()) -> HardwareSpec:
    path = Path(name_or_path)
    if not (path.suffix in (".yaml", ".yml") and path.is_file()):
        path = SPECS_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        raise FlintError(f"unknown hardware {name_or_path!r}; known: {', '.join(spec_names())}"
                         f" (or a path to a .yaml spec)")
    return apply_overrides(_parsed(str(path), path.stat().st_mtime_ns), overrides)


@lru_cache(maxsize=64)
def _parsed(path: str, mtime_ns: int) -> HardwareSpec:
    """A spec file read and checked once per version of the file (sweeps and plans load
    the same spec thousands of times); the spec is frozen, so sharing it is safe."""
    doc = _document(path)
    check_spec_doc(doc, path)
    return spec_from_doc(doc, path)


def _document(path: str, chain: tuple = ()) -> dict:
    """The spec file's YAML, on top of the shipped spec it is `based_on` (if any)."""
    import yaml

    try:
        from flint.io import read_text

        doc = yaml.safe_load(read_text(path, limit=2**20))
    except (yaml.YAMLError, RecursionError) as e:
        first = (str(e) or "nested too deeply").splitlines()[0]
        raise FlintError(f"{path}: not valid YAML: {first}") from None
    if not (isinstance(doc, dict) and "based_on" in doc):
        return doc
    base = doc["based_on"]
    if not isinstance(base, str) or base not in spec_names():
        raise FlintError(f"{path}: based_on {base!r} is not a shipped spec (known: "
                         f"{', '.join(spec_names())})")
    if base in chain:
        raise FlintError(f"{path}: based_on {base!r} goes round in a circle "
                         f"({' -> '.join(chain + (base,))})")
    own = {k: v for k, v in doc.items() if k != "based_on"}
    return _merged(_document(str(SPECS_DIR / f"{base}.yaml"), chain + (base,)), own)


def _merged(base: dict, own: dict) -> dict:
    """`own` over `base`: a section merges key by key; a figure ({value, source}) or any
    other value replaces the base's whole."""
    out = dict(base)
    for key, value in own.items():
        below = out.get(key)
        if (isinstance(value, dict) and isinstance(below, dict) and "value" not in value
                and "value" not in below):
            out[key] = _merged(below, value)
        else:
            out[key] = value
    return out


def spec_from_doc(doc: dict, where: str) -> HardwareSpec:
    sources: dict = {}

    def figure(path: tuple, kind: str, name: str, required: bool):
        node = doc
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if node is None:
            if required:
                raise FlintError(f"{where}: missing {'.'.join(path)}")
            return None
        if isinstance(node, dict):
            if "source" not in node or not str(node.get("source", "")).strip():
                raise FlintError(f"{where}: {'.'.join(path)} has no source")
            sources[name] = node["source"]
            node = node.get("value")
        return parse_figure(node, figure_at(path), f"{where}: {'.'.join(path)}")

    peaks = {}
    for dtype, _ in ((doc.get("compute") or {}).get("peak_flops") or {}).items():
        if dtype not in DTYPES:
            raise FlintError(f"{where}: unknown dtype {dtype!r} in peak_flops "
                             f"(known: {', '.join(DTYPES)})")
        peaks[dtype] = figure(("compute", "peak_flops", dtype), "flops", f"peak_{dtype}", True)
    if not peaks:
        raise FlintError(f"{where}: compute.peak_flops lists no dtype")
    values = {}
    for name, (kind, path) in FIELDS.items():
        required = name in ("hbm_capacity", "hbm_bandwidth")
        v = figure(path, kind, name, required)
        if v is not None:
            values[name] = v
    system = doc.get("system") or {}
    spec = HardwareSpec(name=str(doc.get("name", Path(where).stem)), kind=str(doc.get("kind", "gpu")),
                        model=str(doc.get("model", "")), peak_flops=peaks,
                        fabric=str(system.get("fabric", "fat-tree")),
                        scale_up_link=_level_word(doc, where, "scale_up_link"),
                        switch_reduction=_level_word(doc, where, "switch_reduction"),
                        nccl_protocol=_level_word(doc, where, "nccl_protocol"),
                        torus=str((system.get("torus") or {}).get("value", "")
                                  if isinstance(system.get("torus"), dict) else
                                  system.get("torus", "")),
                        compile_target=_compile_target(doc, sources),
                        sources=sources, efficiency=dict(doc.get("efficiency") or {}), **values)
    if not (spec.scale_up_bandwidth or spec.nic_bandwidth):
        raise FlintError(f"{where}: no link bandwidth: give interconnect.scale_up or "
                         f"interconnect.scale_out bandwidth_per_direction")
    if spec.devices_per_node < 1 or spec.scale_up_domain < 1:
        raise FlintError(f"{where}: devices_per_node and scale_up_domain must be >= 1")
    return spec


def _compile_target(doc: dict, sources: dict) -> str:
    """The spec's compile target; where it is {value, source} (another GPU's target), the
    source says why and is kept with the spec's sources."""
    target = doc.get("compile_target") or ""
    if isinstance(target, dict):
        sources["compile_target"] = str(target.get("source", ""))
        target = target.get("value") or ""
    return str(target)


def _level_word(doc: dict, where: str, key: str) -> str:
    """A word figure of an interconnect level (`link`, `switch_reduction`,
    `nccl_protocol`), checked."""
    allowed = WORD_FIELDS[key]
    level, word = WORD_KEYS[key]
    node = (doc.get("interconnect") or {}).get(level) or {}
    value = str(node.get(word, allowed[0])) if isinstance(node, dict) else allowed[0]
    if value not in allowed:
        raise FlintError(f"{where}: interconnect.{level}.{word} {value!r} is not "
                         f"one of {', '.join(allowed)}")
    return value


def apply_overrides(spec: HardwareSpec, overrides) -> HardwareSpec:
    """`["hbm_bandwidth=4.8TB/s", "peak_bf16=2PFLOP/s", "devices_per_node=72"]`."""
    changes: dict = {}
    peaks = dict(spec.peak_flops)
    for item in overrides or ():
        key, eq, value = str(item).partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not value:
            raise FlintError(f"--set {item!r}: expected NAME=VALUE with a unit")
        if key.startswith("peak_"):
            dtype = key[5:]
            if dtype not in DTYPES:
                raise FlintError(f"--set {key}: unknown dtype {dtype!r} "
                                 f"(known: {', '.join(DTYPES)})")
            peaks[dtype] = parse_figure(value, Figure("flops"), f"--set {key}")
        elif key in FIELDS:
            changes[key] = parse_figure(value, figure_at(FIELDS[key][1]), f"--set {key}")
        elif key == "fabric":
            changes[key] = value
        elif key in WORD_FIELDS:
            if value not in WORD_FIELDS[key]:
                raise FlintError(f"--set {key}: {value!r} is not one of "
                                 f"{', '.join(WORD_FIELDS[key])}")
            changes[key] = value
        elif key == "torus":
            changes["torus_slice"] = "x".join(map(str, parse_torus_shape(value)))
        else:
            from flint.schema import did_you_mean

            known = sorted(FIELDS) + [f"peak_{d}" for d in DTYPES] + list(TEXT_FIELDS)
            hint = did_you_mean(key, known) or f" (known: {', '.join(known)})"
            raise FlintError(f"--set {key}: unknown hardware figure{hint}")
    if not changes and peaks == spec.peak_flops:
        return spec
    sources = dict(spec.sources)
    for key in list(changes) + [f"peak_{d}" for d in peaks if peaks[d] != spec.peak_flops.get(d)]:
        sources[key] = "what-if override"
    return replace(spec, peak_flops=peaks, sources=sources, **changes)


def parse_torus_shape(text: str) -> tuple[int, ...]:
    """A torus shape like 4x4x8 (a spec's `torus`, `torus_slice` and `--set torus`)."""
    try:
        dims = tuple(int(x) for x in str(text).lower().split("x"))
    except ValueError:
        raise FlintError(f"torus shape {text!r} is not like 4x4x8") from None
    if not dims or min(dims) < 1:
        raise FlintError(f"torus shape {text!r} is not like 4x4x8")
    return dims
