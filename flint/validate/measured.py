"""What a profiler measured, in one shape for every trace format: steps x devices x ops.

A step is one execution of the compiled module (nsys-jax module ranges, JAX profiler
`run_id`s, PyTorch `ProfilerStep#N`). Within a step, each device's time per op name is the
sum over that op's executions (loop bodies run several times). Steps are numbered from 1 in
trace order; warm-up steps (autotuning, compilation) are dropped unless the user picks steps.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace

from flint.errors import FlintError


@dataclass
class MeasuredStep:
    number: int                                   # 1-based position in the trace
    duration_s: float                             # the slowest device's span
    ops: dict[str, dict[str, float]] = field(default_factory=dict)  # device -> op -> s
    # device -> (kernel name, s) in launch order, for kernels the trace does not name by
    # HLO op (XLA command buffers: flint.validate.command_buffers names them)
    kernels: dict[str, list[tuple[str, float]]] = field(default_factory=dict)

    def op_time(self, device: str, names) -> float:
        d = self.ops.get(device, {})
        return sum(d.get(n, 0.0) for n in names)


@dataclass
class MeasuredTrace:
    path: str
    kind: str                                     # nsys-jax | jax-profiler | kineto
    module: str                                   # XLA module / PyTorch program name
    steps: list[MeasuredStep]
    hlo: bytes | None = None                      # optimized HLO, when the trace ships it
    hardware: str = ""                            # what the trace says it ran on
    hardware_memory_bytes: float = 0.0            # that device's memory, when recorded

    def select(self, numbers=None) -> "MeasuredTrace":
        """Keep the given step numbers, or drop warm-up steps when none are given."""
        if numbers:
            chosen = [s for s in self.steps if s.number in set(numbers)]
            missing = sorted(set(numbers) - {s.number for s in chosen})
            if missing:
                raise FlintError(f"{self.path} has steps 1-{len(self.steps)}; "
                                 f"no step {', '.join(map(str, missing))}")
        else:
            chosen = drop_warmup(self.steps)
        return replace(self, steps=chosen)

    def step_time(self) -> float:
        return statistics.median(s.duration_s for s in self.steps)

    def op_times(self, reducer=statistics.median) -> dict[str, float]:
        """Per op: `reducer` over every (step, device) sample of its per-step time."""
        samples: dict[str, list[float]] = {}
        for s in self.steps:
            for ops in s.ops.values():
                for name, t in ops.items():
                    samples.setdefault(name, []).append(t)
        return {name: reducer(v) for name, v in sorted(samples.items())}


# A step this much slower than the typical one is a warm-up (compilation, autotuning).
WARMUP_SLOWER = 1.5


def drop_warmup(steps: list[MeasuredStep]) -> list[MeasuredStep]:
    """The first execution compiles/autotunes; later ones slower than 1.5x the median of
    the rest are warm-up too. One step alone is kept."""
    if len(steps) <= 1:
        return list(steps)
    rest = steps[1:]
    typical = statistics.median(s.duration_s for s in rest)
    while len(rest) > 1 and rest[0].duration_s > WARMUP_SLOWER * typical:
        rest = rest[1:]
    return rest


def parse_steps(text: str | None) -> list[int] | None:
    """`2-3`, `4,5`, `2-3,6` -> step numbers; None or "" -> automatic."""
    if not text:
        return None
    out: list[int] = []
    for part in str(text).split(","):
        lo, dash, hi = part.strip().partition("-")
        try:
            a, b = int(lo), int(hi) if dash else int(lo)
        except ValueError:
            raise FlintError(f"bad step range {part.strip()!r}: expected N or N-M") from None
        if a < 1 or b < a:
            raise FlintError(f"bad step range {part.strip()!r}: steps count from 1")
        out.extend(range(a, b + 1))
    return out
