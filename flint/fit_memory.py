"""The least recompute that fits a run in memory, as the frameworks' recipes choose it.

A published table that lists no activation recompute still ran in the memory it had: the
NeMo / Megatron-Bridge recipes set Megatron's block recompute (`recompute_granularity=full,
recompute_method=block, recompute_num_layers=N`) to the few layers per pipeline chunk that
make the model fit (shared/tables/published.md: "Llama3-8B H100 FP8-CS:
recompute_granularity=full, method=block, num_layers=5"). `least_recompute(run)` answers
the same question with Flint's memory verdict: the run as given when it fits, else remat
full over the fewest layers per chunk that fit (flint.run.TrainingRun.recompute_layers),
else remat full over every layer (which may still not fit: its prediction says so).
"""
from __future__ import annotations

import math
from dataclasses import replace

from flint.run import TrainingRun


def least_recompute(run: TrainingRun, what_if=(), cache=None) -> TrainingRun:
    """`run` if it fits, else the same run with the least block recompute that fits."""
    from flint.engine import predict

    def memory(r: TrainingRun):
        p = predict(r, what_if=what_if, cache=cache)
        return p.memory_bytes, p.memory_capacity_bytes, p.oom

    if run.remat == "full" and not run.recompute_layers:
        return run                          # every layer recomputed already
    if not memory(run)[2]:
        return run
    full = replace(run, remat="full", recompute_layers=0)
    held, capacity, oom = memory(full)
    if oom:
        return full
    kept = memory(replace(run, remat="none", recompute_layers=0))[0]
    per_chunk = run.layers_per_chunk
    # the block's memory is affine in the layers it recomputes (flint.engine prices it so)
    share = (kept - capacity) / (kept - held) if kept > held else 1.0
    for k in range(max(1, math.ceil(share * per_chunk - 1e-9)), math.ceil(per_chunk)):
        block = replace(run, remat="full", recompute_layers=k)
        if not memory(block)[2]:
            return block
    return full
