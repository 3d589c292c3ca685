"""Each pipeline device's sequence of (F|B, microbatch, chunk) tasks: GPipe (Huang et al.
2019), 1F1B (PipeDream-Flush; Narayanan et al. 2021) and interleaved 1F1B (Megatron-LM;
Narayanan et al., SC'21, section 2.2)."""
from __future__ import annotations

from flint.errors import FlintError

SCHEDULES = ("gpipe", "1f1b", "interleaved")


def device_order(schedule: str, stages: int, microbatches: int,
                 virtual: int = 1) -> list[list[tuple[str, int, int]]]:
    """Per device, its (F|B, microbatch, chunk) tasks in issue order; chunk c runs on
    device c % stages."""
    p, m, v = stages, microbatches, virtual
    if schedule not in SCHEDULES:
        raise FlintError(f"unknown pipeline schedule {schedule!r}; use {' | '.join(SCHEDULES)}")
    if p < 1 or m < 1 or v < 1:
        raise FlintError("pipeline stages, microbatches and virtual stages must be >= 1")
    if schedule != "interleaved" and v != 1:
        raise FlintError(f"virtual stages need the interleaved schedule, not {schedule}")
    orders = []
    for d in range(p):
        if schedule == "gpipe":
            orders.append([("F", k, d) for k in range(m)] + [("B", k, d) for k in range(m)])
            continue
        if schedule == "1f1b":
            fwd = [(k, d) for k in range(m)]
            bwd = list(fwd)
            warmup = min(p - d - 1, m)
        else:
            if m % p:
                raise FlintError(f"interleaved 1F1B needs microbatches ({m}) to be a "
                                 f"multiple of the pipeline stages ({p})")
            fwd = [_interleaved(i, p, v, d, True) for i in range(m * v)]
            bwd = [_interleaved(i, p, v, d, False) for i in range(m * v)]
            warmup = min((p - d - 1) * 2 + (v - 1) * p, m * v)
        order = [("F", k, c) for k, c in fwd[:warmup]]
        for i in range(len(fwd) - warmup):
            order.append(("F",) + fwd[warmup + i])
            order.append(("B",) + bwd[i])
        order += [("B",) + b for b in bwd[len(fwd) - warmup:]]
        orders.append(order)
    return orders


def _interleaved(i: int, p: int, v: int, d: int, forward: bool) -> tuple[int, int]:
    """The i-th (microbatch, chunk) a device runs in interleaved 1F1B: microbatches go in
    groups of p through each of the device's v chunks (reversed for the backward)."""
    in_group = i % (p * v)
    j = in_group // p
    if not forward:
        j = v - 1 - j
    return (i // (p * v)) * p + in_group % p, j * p + d
