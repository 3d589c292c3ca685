"""The hardware spec YAML's layout, declared once: every section, every key, what it holds.

A figure is `{value: "3.35 TB/s", source: "<public source>"}` (a bare value is accepted
too); its unit kind, range and whether it is required are declared here, and the same rule
checks a `--set` what-if of that figure. Anything not declared is an unknown key (reported
with the nearest known one), so a misspelt key never silently falls back to a default.

To add a key: add one line under its section in LAYOUT, e.g.
    "kernel_launch_latency": Figure("time"),                 # under "compute"
If the cost model reads it as a flat name (and --set may change it), also add it to
hardware_models/spec.py FIELDS and HardwareSpec.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Annotated, Any, Optional, Union

from pydantic import AfterValidator, ConfigDict, Field, create_model

from flint.cluster import MAX_DEVICES
from flint.errors import FlintError
from flint.hardware_models.units import parse_quantity
from flint.schema import Number, Str, Strict, validated

DTYPES = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8", "fp4")


@dataclass(frozen=True)
class Figure:
    """A quantity: its unit kind (units.KINDS), its range, and whether a spec needs it."""

    kind: str
    positive: bool = True        # > 0 (a division by it follows); else >= 0
    integer: bool = False        # a count of things
    required: bool = False
    maximum: float | None = None


TEXT = "text"                    # a free string (names, the fabric)
TEXT_FIGURE = "text figure"      # a string or {value: string, source: ...} (a torus shape)
MAPPING = "mapping"              # free-form mapping of its own (calibration results)

LAYOUT: dict[str, Any] = {
    "name": TEXT, "vendor": TEXT, "kind": TEXT, "model": TEXT,
    # the compile-only target (flint.frontends.targets) this spec's programs compile for:
    # a name, or {value: name, source: why} where it is another GPU's target (the reason
    # a prediction states)
    "compile_target": TEXT_FIGURE,
    "compute": {
        "peak_flops": {dtype: Figure("flops") for dtype in DTYPES},
        "clock": Figure("frequency"),
        # exponentials per clock per SM on the special-function units (MUFU.EX2)
        "exponentials_per_clock": Figure("count", integer=True, maximum=1024),
        "cores": Figure("count", integer=True, maximum=2**20),
        "matrix_unit": Figure("count", integer=True, maximum=4096),
        # kernel model (kernels.py): achievable shares of the peaks, and the floor
        "gemm_fraction": Figure("ratio", maximum=1),
        "attention_fraction": Figure("ratio", maximum=1),
        "attention_fraction_native": Figure("ratio", maximum=1),
        "vector_fraction": Figure("ratio", maximum=1),
        "kernel_floor": Figure("time"),
        "launch_gap": Figure("time"),
    },
    "memory": {
        "hbm_capacity": Figure("bytes", required=True),
        "hbm_bandwidth": Figure("bandwidth", required=True),
        "l2_cache": Figure("bytes", positive=False),
        "hbm_fraction": Figure("ratio", maximum=1),
    },
    "interconnect": {
        level: {"name": TEXT, "bandwidth_per_direction": Figure("bandwidth"),
                "latency": Figure("time", positive=False), "link": TEXT,
                # links per device into the scale-up fabric (NVLinks): NCCL's channels
                "links": Figure("count", integer=True, maximum=1024),
                # bus bandwidth the collective library sustains on large all-reduces, as
                # a share of bandwidth_per_direction (its published nccl/rccl-tests curve)
                "bus_efficiency": Figure("ratio", maximum=1),
                # in-switch reduction the scale-up fabric offers (NCCL's NVLS): "nvls"
                "switch_reduction": TEXT,
                # the one NCCL protocol the system's environment allows (NCCL_PROTO)
                "nccl_protocol": TEXT}
        for level in ("scale_up", "scale_out")
    },
    "system": {
        "name": TEXT, "fabric": TEXT, "torus": TEXT_FIGURE,
        "devices_per_node": Figure("count", integer=True, maximum=MAX_DEVICES),
        "scale_up_domain": Figure("count", integer=True, maximum=MAX_DEVICES),
        "leaf_group": Figure("count", positive=False, integer=True,   # 0 = whole fabric
                             maximum=MAX_DEVICES),
        "oversubscription": Figure("ratio", maximum=1000),
    },
    "efficiency": MAPPING,
    "calibration": MAPPING,
}
KINDS = ("gpu", "tpu", "cpu")


def figure_at(path: tuple[str, ...]) -> Figure:
    node: Any = LAYOUT
    for key in path:
        node = node[key]
    assert isinstance(node, Figure), path
    return node


def check_value(value: float, rule: Figure, field: str) -> float:
    """The range rule of a figure, for a value already in SI units."""
    if rule.integer and value != int(value):
        raise FlintError(f"{field}: {value:g} is not a whole number")
    if rule.positive and value <= 0:
        raise FlintError(f"{field}: must be more than zero")
    if rule.maximum is not None and value > rule.maximum:
        raise FlintError(f"{field}: {value:g} is more than {rule.maximum:g}")
    return int(value) if rule.integer else value


def parse_figure(text, rule: Figure, field: str) -> float:
    return check_value(parse_quantity(text, rule.kind, field), rule, field)


# --- the pydantic models, built from LAYOUT ------------------------------------------
class _Record(Strict):
    value: Union[Str, Number]
    source: Optional[Union[Str, Number]] = None


class _TextRecord(Strict):
    value: Str
    source: Optional[Str] = None


def _figure_type(rule: Figure, name: str):
    def check(v):
        if isinstance(v, _Record) and not str(v.source or "").strip():
            raise ValueError("has no source")
        text = v.value if isinstance(v, _Record) else v
        try:
            parse_figure(text, rule, name)
        except FlintError as e:
            raise ValueError(str(e).split(": ", 1)[-1]) from None
        return v

    return Annotated[Union[_Record, Str, Number], AfterValidator(check)]


@lru_cache(maxsize=1)
def spec_model():
    return _section_model("HardwareSpecYAML", LAYOUT)


def _section_model(name: str, layout: dict):
    fields = {}
    for key, what in layout.items():
        if isinstance(what, dict):
            sub = _section_model(f"{name}_{key}", what)
            fields[key] = (Optional[sub], None)
        elif isinstance(what, Figure):
            t = _figure_type(what, key)
            fields[key] = (t, ...) if what.required else (Optional[t], None)
        elif what == TEXT:
            fields[key] = (Optional[Union[Str, Number]], None)
        elif what == TEXT_FIGURE:
            fields[key] = (Optional[Union[_TextRecord, Str]], None)
        else:
            fields[key] = (Optional[dict], None)
    if name == "HardwareSpecYAML":
        fields["kind"] = (Optional[Annotated[Str, Field(pattern="^(" + "|".join(KINDS) + ")$")]],
                          None)
    return create_model(name, __config__=ConfigDict(extra="forbid", frozen=True), **fields)


def check_spec_doc(doc, where: str) -> None:
    """One FlintError line if the YAML document breaks the layout, a unit or a range."""
    if not isinstance(doc, dict):
        raise FlintError(f"{where}: a hardware spec must be a YAML mapping")
    validated(spec_model(), doc, where)
