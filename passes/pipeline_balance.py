"""Cutting a model's blocks into the chunks of an interleaved pipeline.

With v virtual stages per device, chunk c runs on device c % p, so a device's work is the
sum of its v chunks. When the blocks divide evenly every layout below is the same one.
When they do not (126 layers over 16 x 7 chunks), how the longer chunks are placed decides
the step: equal-time cuts put them on the same devices every round (a pipeline of
unequal stages, the busiest up to twice the mean: on Llama-3.1-405B, PP 16 x VP 7, a
bubble of 37% where the closed form (p-1)/(v m) gives 6%), while chunks of mixed lengths
inside one round stall every device after the long one. Frameworks lay such models out by
hand: Megatron-Core requires the layers to divide or takes an explicit
--pipeline-model-parallel-layout, and Llama 3 moved one layer off the first and the last
stage to make room for the embedding and the head (Dubey et al. 2024, section 3.3.2).
Here three candidate layouts are priced by a chunk-level simulation of the schedule and
the fastest is kept, as a user tuning the layout would. Layers that divide evenly keep
equal chunks (passes.pipeline_stages), as Megatron-Core lays them out.
"""
from __future__ import annotations

from flint.passes.pipeline_order import device_order


def interleaved_cuts(weights: list[float], chunks: int, stages: int) -> list[int]:
    """The index of the first block of chunks 1..chunks-1 (contiguous, each at least one
    block) for `weights` (a block's forward plus backward time, or 1 for a layer), chunk c
    on device c % stages: of three layouts (equal-time chunks; chunks alike within each
    round, every device's total near its share; that with single blocks moved off the
    busiest device), the one whose interleaved 1F1B schedule ends first over 4 x stages
    micro-batches (the steady state's first point, flint/steady_state.py: one layout for
    every micro-batch count of a run).
    Which wins depends on the schedule: a device that always runs the longer chunks is a
    steady slow stage, while chunks of mixed lengths within a round stall the devices after
    them, so it is simulated at chunk granularity (forward a third of a block's time)."""
    n = len(weights)
    if chunks > n:
        raise ValueError(f"{n} blocks cannot fill {chunks} chunks")
    prefix = [0.0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    greedy = _per_device_cuts(prefix, chunks, stages)
    layouts = [_equal_time_cuts(prefix, chunks), greedy, _even_out(greedy, prefix, stages)]
    return min(layouts, key=lambda cuts: schedule_span(cuts, prefix, stages, 4 * stages))


def _equal_time_cuts(prefix: list[float], chunks: int) -> list[int]:
    n = len(prefix) - 1
    cuts, lo = [], 0
    for k in range(1, chunks):
        goal = prefix[-1] * k / chunks
        options = range(lo + 1, n - (chunks - k) + 1)
        lo = min(options, key=lambda j: (abs(prefix[j] - goal), j))
        cuts.append(lo)
    return cuts


def schedule_span(cuts: list[int], prefix: list[float], stages: int,
                  microbatches: int) -> float:
    """The time interleaved 1F1B takes over chunks cut at `cuts` (forward a third of a
    chunk's weight, backward two thirds, no communication)."""
    edges = [0] + list(cuts) + [len(prefix) - 1]
    chunks = len(edges) - 1
    weight = [prefix[edges[c + 1]] - prefix[edges[c]] for c in range(chunks)]
    orders = device_order("interleaved", stages, microbatches, chunks // stages)
    done: dict = {}
    clock = [0.0] * stages
    pos = [0] * stages
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for d in range(stages):
            while pos[d] < len(orders[d]):
                kind, mb, c = orders[d][pos[d]]
                need = ([("F", mb, c - 1)] if kind == "F" and c else []) + (
                    [("B", mb, c + 1) if c + 1 < chunks else ("F", mb, c)]
                    if kind == "B" else [])
                if any(k not in done for k in need):
                    break
                start = max([clock[d]] + [done[k] for k in need])
                clock[d] = start + weight[c] * (1 / 3 if kind == "F" else 2 / 3)
                done[(kind, mb, c)] = clock[d]
                pos[d] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise ValueError("interleaved schedule deadlocked")
    return max(clock)


def _per_device_cuts(prefix: list[float], chunks: int, stages: int) -> list[int]:
    """Each chunk cut where its device's running total comes closest to its share."""
    n = len(prefix) - 1
    rounds = chunks // stages
    share = prefix[-1] / stages
    load = [0.0] * stages
    cuts, lo = [], 0
    for c in range(chunks - 1):
        device, rnd = c % stages, c // stages
        target = share * (rnd + 1) / rounds        # the device's total after this round
        left = chunks - c - 1                       # chunks still to come, a block each
        options = range(lo + 1, n - left + 1)
        best = min(options, key=lambda k: (abs(load[device] + prefix[k] - prefix[lo]
                                               - target), k))
        load[device] += prefix[best] - prefix[lo]
        cuts.append(best)
        lo = best
    return _even_out(cuts, prefix, stages)


def _even_out(cuts: list[int], prefix: list[float], stages: int) -> list[int]:
    """Move single blocks across chunk edges off the busiest device while the device that
    takes one stays below it (the greedy cut leaves what is left to the last chunks; the
    sum of squared device loads falls with every move, so this ends)."""
    cuts = list(cuts)
    n = len(prefix) - 1
    while True:
        edges = [0] + cuts + [n]
        load = [0.0] * stages
        for c in range(len(edges) - 1):
            load[c % stages] += prefix[edges[c + 1]] - prefix[edges[c]]
        top = max(range(stages), key=lambda d: (load[d], -d))
        moves = []
        for c in range(top, len(edges) - 1, stages):
            lo, hi = edges[c], edges[c + 1]
            if hi - lo < 2:
                continue
            if c > 0:                   # its first block to the chunk before
                w = prefix[lo + 1] - prefix[lo]
                moves.append((load[(c - 1) % stages] + w, c - 1, lo + 1))
            if c < len(edges) - 2:      # its last block to the chunk after
                w = prefix[hi] - prefix[hi - 1]
                moves.append((load[(c + 1) % stages] + w, c, hi - 1))
        moves = [m for m in moves if m[0] < load[top] - 1e-12 * max(load[top], 1.0)]
        if not moves:
            return cuts
        _, edge, to = min(moves)
        cuts[edge] = to
