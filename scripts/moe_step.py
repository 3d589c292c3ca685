"""One MoE training step under several routing distributions (shared by moe_skew.py and
published_moe.py): each is the run with another `routing`, priced by the engine.

    from moe_step import routed_rows
    from flint.run import TrainingRun
    run = TrainingRun(model="deepseek-v3", seq_len=4096, devices=256, pp=4, vp=4, ep=64,
                      global_batch=4096, precision="mxfp8", hardware="gb200-nvl72")
    rows = routed_rows(run, ["balanced", "zipf:1.0"])

How a MoE run is priced (flint.engine, the same for every configuration): one pipeline
stage's 2-layer template of the model's MoE layers on the mesh (data, expert, context,
model) is compiled once; leading dense layers (DeepSeek-V3's first 3) are priced as MoE
layers (for DeepSeek-V3 the active FFN work is the same, 8 x 2048 routed + 2048 shared =
18432 = the dense FFN, so only their all-to-alls and router are extra); passes/
moe_routing.py re-prices the template for the run's routing distribution; the layer
template, the distributed optimizer (dense parameters over data x expert, experts over
data), Megatron-Core/Transformer Engine kernels and the time-balanced pipeline follow.
"""
from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def routed_rows(run, distributions, cache=None) -> list[dict]:
    """One row per routing distribution: step time and the MoE report (no wall times: the
    rows are written as deterministic files)."""
    from flint.engine import predict
    from flint.models.decoder import model_flops

    cfg = run.model_config()
    rows = []
    for dist in distributions:
        p = predict(run.replace(routing=dist), cache=cache)
        report = p.moe_routing
        step = p.step_time_s
        rows.append({"run": run.to_json(), "distribution": dist, "step_s": step,
                     "tokens_s_gpu": p.tokens_per_s_per_device,
                     "model_tflops_gpu": model_flops(cfg, run.tokens_per_step) / step
                     / run.devices / 1e12,
                     "memory_gib": p.memory_bytes / 2**30, "oom": p.oom,
                     "straggler_factor": report["straggler_factor"],
                     "max_over_mean_expert": report["max_over_mean_expert"],
                     "a2a_balanced_bytes_per_rank": report["all_to_all_balanced_bytes_per_rank"],
                     "a2a_straggler_bytes_per_rank":
                         report["all_to_all_straggler_bytes_per_rank"],
                     "dropped_token_share": report["dropped_token_share"]})
    return rows
