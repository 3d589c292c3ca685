"""How a zoo model's step is parallelized, read from its mesh axis names, and the
ready-to-extract workload a zoo builder returns (shared by every zoo model: decoder, MLP).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from flint.errors import FlintError

DATA_AXES = ("data", "dp", "batch", "replica")
FSDP_AXES = ("fsdp", "zero")
TP_AXES = ("model", "tensor", "tp")
CONTEXT_AXES = ("context", "cp")
EXPERT_AXES = ("expert", "ep")   # expert parallelism (MoE models); also a batch axis


@dataclass(frozen=True)
class Parallelism:
    batch_axes: tuple[str, ...]
    fsdp_axes: tuple[str, ...]
    tp_axis: str | None
    sequence_parallel: bool = False
    context_axis: str | None = None
    expert_axis: str | None = None

    @classmethod
    def from_mesh(cls, mesh: tuple[tuple[str, int], ...], sequence_parallel: bool = False,
                  fsdp_over_data: bool = False) -> "Parallelism":
        names = [n for n, _ in mesh]
        known = DATA_AXES + FSDP_AXES + TP_AXES + CONTEXT_AXES + EXPERT_AXES
        unknown = [n for n in names if n not in known]
        if unknown:
            raise FlintError(f"zoo models do not know mesh axis {unknown[0]!r}; use "
                             f"{'/'.join(known)}")
        context = [n for n in names if n in CONTEXT_AXES]
        if len(context) > 1:
            raise FlintError(f"more than one context-parallel axis in mesh: {context}")
        tp = [n for n in names if n in TP_AXES]
        if len(tp) > 1:
            raise FlintError(f"more than one tensor-parallel axis in mesh: {tp}")
        fsdp = tuple(n for n in names if n in FSDP_AXES or (fsdp_over_data and n in DATA_AXES))
        expert = [n for n in names if n in EXPERT_AXES]
        if len(expert) > 1:
            raise FlintError(f"more than one expert-parallel axis in mesh: {expert}")
        batch = tuple(n for n in names if n in DATA_AXES + FSDP_AXES + EXPERT_AXES)
        if sequence_parallel and not tp:
            raise FlintError("sequence parallelism needs a tensor-parallel mesh axis")
        return cls(batch, fsdp, tp[0] if tp else None, sequence_parallel,
                   context[0] if context else None, expert[0] if expert else None)

    def axis(self, names: tuple[str, ...]):
        return None if not names else names[0] if len(names) == 1 else names


@dataclass
class ZooWorkload:
    """A ready-to-extract step: function, abstract arguments and their partition specs."""

    name: str
    step: object
    args: tuple
    in_specs: tuple
    out_specs: object = None
    donate_argnums: tuple = (0, 1)
    info: dict = field(default_factory=dict)
