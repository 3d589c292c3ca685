"""Quantities with units: "3.35 TB/s", "400 Gb/s", "80 GiB", "2 us", "989 TFLOP/s".

Decimal prefixes are powers of 1000 (TB = 1e12 B), binary prefixes powers of 1024 (GiB);
a lower-case `b` means bits. A value without a unit, a negative value, or a unit of the
wrong kind (a bandwidth given in GB) is an error that names the field.
"""
from __future__ import annotations

import math
import re

from flint.errors import FlintError

_DECIMAL = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
_BINARY = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50}
_TIME = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_COUNT_WORDS = {"devices", "device", "SM", "SMs", "CU", "CUs", "TensorCore", "TensorCores",
                "cores", "core", "links", "link", "chips", "chip", "hosts", "host", "x", ""}
_NUMBER = re.compile(r"^\s*([-+]?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)\s*(.*?)\s*$")

KINDS = ("flops", "bandwidth", "bytes", "time", "frequency", "count", "ratio")


def parse_quantity(text, kind: str, field: str = "value") -> float:
    """Parse `text` as a quantity of `kind` into SI base units (FLOP/s, B/s, B, s, Hz)."""
    if isinstance(text, bool):
        raise FlintError(f"{field}: {text!r} is not a quantity")
    if isinstance(text, (int, float)):
        if kind in ("count", "ratio"):
            return _non_negative(float(text), field, str(text))
        raise FlintError(f"{field}: {text!r} has no unit (expected {_example(kind)})")
    m = _NUMBER.match(str(text))
    if not m:
        raise FlintError(f"{field}: {text!r} is not a number with a unit "
                         f"(expected {_example(kind)})")
    number, unit = float(m.group(1)), m.group(2)
    if unit == "" and kind not in ("count", "ratio"):
        raise FlintError(f"{field}: {text!r} has no unit (expected {_example(kind)})")
    scale = _scale(unit, kind)
    if scale is None:
        raise FlintError(f"{field}: unit {unit!r} in {text!r} is not a {kind} unit "
                         f"(expected {_example(kind)})")
    return _non_negative(number * scale, field, text)


def _non_negative(value: float, field: str, text) -> float:
    if not math.isfinite(value):
        raise FlintError(f"{field}: {text!r} is not a finite number")
    if value < 0:
        raise FlintError(f"{field}: {text!r} is negative")
    return value


def _scale(unit: str, kind: str) -> float | None:
    if kind in ("count", "ratio"):
        return 1.0 if unit in _COUNT_WORDS else None
    if kind == "time":
        return _TIME.get(unit)
    if kind == "frequency":
        m = re.fullmatch(r"([kMGT]?)Hz", unit)
        return _DECIMAL[m.group(1)] if m else None
    if kind == "flops":
        m = re.fullmatch(r"([kMGTPE]?)(FLOP|OP|FLOPS|OPS)/s", unit) or \
            re.fullmatch(r"([kMGTPE]?)(FLOPS|OPS)", unit)
        return _DECIMAL[m.group(1)] if m else None
    per_second = kind == "bandwidth"
    if per_second:
        if not unit.endswith("/s"):
            return None
        unit = unit[:-2]
    m = re.fullmatch(r"([kKMGTPE]?|[KMGTP]i)([Bb])", unit)
    if not m:
        return None
    prefix, b = m.groups()
    scale = _BINARY[prefix] if prefix.endswith("i") else _DECIMAL[prefix]
    return scale / 8.0 if b == "b" else scale


def _example(kind: str) -> str:
    return {"flops": "'989 TFLOP/s'", "bandwidth": "'3.35 TB/s' or '400 Gb/s'",
            "bytes": "'80 GB' or '80 GiB'", "time": "'2 us'", "frequency": "'1.98 GHz'",
            "count": "'8 devices'", "ratio": "'0.75'"}[kind]


def fmt_bytes(x: float) -> str:
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(x) >= scale:
            return f"{x / scale:.2f} {unit}"
    return f"{x:.0f} B"


def fmt_seconds(x: float) -> str:
    if x < 1e-3:
        return f"{x * 1e6:.1f} us"
    return f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.2f} s"
