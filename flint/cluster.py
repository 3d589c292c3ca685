"""The virtual cluster a graph was extracted for: device count, named mesh, hosts.

Ranks are logical device indices: the row-major position of a device in the named mesh,
which is also the SPMD partition id XLA uses in replica groups (jit assigns partition p to
`mesh.devices.flat[p]`).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from flint.errors import FlintError

_AXIS = re.compile(r"^[A-Za-z_]\w*$")
# The largest cluster Flint builds: 2^17 devices, beyond today's largest training clusters
# (~100k GPUs). Compile-only device objects and per-rank outputs grow with the count, so a
# typo such as --devices 1000000000 is refused here instead of exhausting memory.
MAX_DEVICES = 2**17


def check_device_count(devices, what: str = "--devices") -> int:
    if isinstance(devices, bool) or not isinstance(devices, int):
        raise FlintError(f"{what} must be an integer, not {devices!r}")
    if devices < 1:
        raise FlintError(f"{what} must be at least 1, not {devices}")
    if devices > MAX_DEVICES:
        raise FlintError(f"{what} {devices} exceeds Flint's ceiling of {MAX_DEVICES} devices")
    return devices


@dataclass(frozen=True)
class Cluster:
    devices: int
    mesh: tuple[tuple[str, int], ...]
    hardware: str = "unknown"
    platform: str = "gpu"
    devices_per_host: int = 8

    def __post_init__(self):
        validate_mesh(self.mesh, self.devices)
        if self.devices_per_host < 1:
            raise FlintError(f"devices per host must be >= 1, got {self.devices_per_host}")

    @property
    def axis_names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.mesh)

    @property
    def axis_sizes(self) -> dict[str, int]:
        return dict(self.mesh)

    @property
    def hosts(self) -> int:
        return math.ceil(self.devices / self.devices_per_host)

    def coords(self, rank: int) -> dict[str, int]:
        """Mesh coordinates of a rank."""
        idx = np.unravel_index(rank, [s for _, s in self.mesh])
        return {n: int(i) for (n, _), i in zip(self.mesh, idx)}

    def host_of(self, rank: int) -> int:
        return rank // self.devices_per_host

    def to_json(self) -> dict:
        return {"devices": self.devices, "mesh": [[n, s] for n, s in self.mesh],
                "hardware": self.hardware, "platform": self.platform,
                "devices_per_host": self.devices_per_host}

    @classmethod
    def from_json(cls, d: dict) -> "Cluster":
        return cls(int(d["devices"]), tuple((str(n), int(s)) for n, s in d["mesh"]),
                   d.get("hardware", "unknown"), d.get("platform", "gpu"),
                   int(d.get("devices_per_host", 8)))


def validate_mesh(mesh: tuple[tuple[str, int], ...], devices: int) -> None:
    check_device_count(devices, "device count")
    names = [n for n, _ in mesh]
    if len(set(names)) != len(names):
        raise FlintError(f"mesh axis names repeat: {names}")
    for name, size in mesh:
        if not _AXIS.match(name):
            raise FlintError(f"mesh axis name {name!r} is not an identifier")
        if size < 1:
            raise FlintError(f"mesh axis {name!r} has size {size}; sizes must be >= 1")
    product = math.prod(s for _, s in mesh)
    if product != devices:
        shape = "x".join(f"{n}={s}" for n, s in mesh)
        raise FlintError(f"mesh {shape} has {product} devices but --devices is {devices}")


def parse_mesh(text: str | dict | None, devices: int) -> tuple[tuple[str, int], ...]:
    """Parse `data=512,model=8` (or a dict); `-1` for one axis means "the rest"."""
    if text is None or text == "" or text == {}:
        return (("data", devices),)
    if isinstance(text, dict):
        items = [(str(k), str(v)) for k, v in text.items()]
    else:
        items = []
        for part in str(text).split(","):
            name, eq, size = part.strip().partition("=")
            if not eq:
                raise FlintError(f"bad mesh axis {part.strip()!r}: expected NAME=SIZE")
            items.append((name.strip(), size.strip()))
    sizes = []
    for name, size in items:
        try:
            sizes.append(int(size))
        except ValueError:
            raise FlintError(f"mesh axis {name!r} has non-integer size {size!r}") from None
    if sizes.count(-1) > 1:
        raise FlintError("at most one mesh axis may have size -1")
    if -1 in sizes:
        rest = math.prod(s for s in sizes if s != -1)
        if rest < 1 or devices % rest:
            raise FlintError(f"mesh axes {items} do not divide {devices} devices")
        sizes[sizes.index(-1)] = devices // rest
    mesh = tuple((n, s) for (n, _), s in zip(items, sizes))
    validate_mesh(mesh, devices)
    return mesh


def prime_factors(n: int) -> list[int]:
    """Prime factors in ascending order, with repeats (12 -> [2, 2, 3]); [] for 1. Mesh axes
    split into them to name groups that run along part of an axis."""
    out, p = [], 2
    while p * p <= n:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out + ([n] if n > 1 else [])
