"""What the metamorphic tests (tests/test_metamorphic*.py) generate: training runs of three
model families and hardware what-ifs, drawn so that every example re-prices one of a few
compiled stage programs (compiles are the expensive part; pricing is what the relations
exercise).

The families, each one stage program for every example drawn from it:
- zoo `tiny` (2 layers, seq 64), tensor parallel 2: the program tests/test_sweep.py and
  tests/test_engine.py compile too;
- a 6-layer Llama-3-8B (seq 2048, vocab 32k), tensor parallel 4: tests/test_engine.py's;
- a 2-layer Qwen3-30B-A3B shaped MoE (8 experts, top-2), expert parallel 4.
A stage program's data axis compiles with two replicas and is re-targeted to the run's
(flint.stage.COMPILED_DATA), so device count, pipeline depth, micro-batch count, ZeRO
flavour, schedule, routing and what-ifs vary freely without a compile.
"""
from __future__ import annotations

import os

from hypothesis import HealthCheck, settings, strategies as st

from flint.hardware_models.spec import load_spec
from flint.run import TrainingRun

# Deterministic and bounded: CI replays the same examples every run. A longer search
# (FLINT_METAMORPHIC_EXAMPLES=200) is for looking for new failures, not for CI.
EXAMPLES = int(os.environ.get("FLINT_METAMORPHIC_EXAMPLES", "12"))
METAMORPHIC = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                       database=None, print_blob=False,
                       suppress_health_check=[HealthCheck.too_slow,
                                              HealthCheck.function_scoped_fixture])
FEW = settings(METAMORPHIC, max_examples=max(EXAMPLES // 3, 4))

LLAMA6 = {"base": "llama3-8b", "layers": 6, "seq": 2048, "vocab": 32000}
QWEN_MOE = {"base": "qwen3-30b-a3b", "layers": 2, "seq": 256, "hidden": 256, "heads": 4,
            "kv_heads": 2, "experts": 8, "top_k": 2, "moe_ffn": 128, "vocab": 4096}
FAMILIES = ("tiny", "llama", "moe")


@st.composite
def runs(draw, family: str | None = None, pipelined: bool | None = None) -> TrainingRun:
    """A run of one family (drawn unless given) on its family's one stage program."""
    family = family or draw(st.sampled_from(FAMILIES))
    pp_choices = {"tiny": (1, 2), "llama": (1, 2, 3), "moe": (1, 2)}[family]
    if pipelined is not None:
        pp_choices = tuple(p for p in pp_choices if (p > 1) == pipelined)
    pp = draw(st.sampled_from(pp_choices))
    replicas = draw(st.sampled_from((1, 2, 4)))          # data-parallel pairs
    m = draw(st.integers(1, 4))                          # micro-batches per step
    zero = draw(st.sampled_from((0, 1)))
    common = dict(pp=pp, zero=zero,
                  pipeline_split=draw(st.sampled_from(("time", "layers"))),
                  overlap_grad_reduce=draw(st.booleans()))
    if pp > 1:
        common["schedule"] = draw(st.sampled_from(("1f1b", "gpipe")))
    if family == "tiny":
        dp = 2 * replicas
        return TrainingRun(model="tiny", seq_len=64, devices=2 * dp * pp, tp=2,
                           global_batch=dp * m, **common)
    if family == "llama":
        dp = 2 * replicas
        return TrainingRun(model=LLAMA6, devices=4 * dp * pp, tp=4, global_batch=dp * m,
                           **common)
    dp = 8 * replicas            # expert parallel 4 inside, two data-parallel replicas
    routing = draw(st.sampled_from(("balanced", "zipf:1.2")))
    return TrainingRun(model=QWEN_MOE, devices=dp * pp, ep=4, global_batch=dp * m,
                       routing=routing, **common)


# Resources whose growth (or, for latencies, shrinking) is "faster or bigger": the what-if
# figure for `factor` x the spec's own figure.
RESOURCES = ("peak_bf16", "hbm_bandwidth", "scale_up_bandwidth", "nic_bandwidth",
             "scale_up_latency", "nic_latency")
_UNIT = {"peak_bf16": "FLOP/s", "hbm_bandwidth": "B/s", "scale_up_bandwidth": "B/s",
         "nic_bandwidth": "B/s", "scale_up_latency": "s", "nic_latency": "s",
         "hbm_capacity": "B"}


def faster(hardware: str, resource: str, factor: float) -> str:
    """The what-if that makes `resource` of `hardware` `factor` x better."""
    spec = load_spec(hardware)
    value = spec.peak_flops["bf16"] if resource == "peak_bf16" else getattr(spec, resource)
    value = value / factor if resource.endswith("latency") else value * factor
    return f"{resource}={value:.9g}{_UNIT[resource]}"


factors = st.sampled_from((1.25, 2.0, 4.0))
resources = st.sampled_from(RESOURCES)


def binds(breakdown, resource: str, effect: dict) -> bool:
    """Whether the breakdown of a prediction (or an estimate) says `resource` binds its
    step: the kernels it prices hold a third of the step, the faster resource makes them
    (as the what-if's effect says) at least 10% faster, so they were limited by it and not
    by the kernel floor, and the GPU is not waiting for the host to launch them."""
    by = breakdown.by_class_s
    held = {"peak_bf16": by.get("gemm", 0.0),
            "hbm_bandwidth": sum(by.get(k, 0.0) for k in (
                "elementwise", "reduction", "data_movement"))}.get(resource, 0.0)
    step = breakdown.step_time_s
    return (held > step / 3 and (effect.get("repriced_time_ratio") or 1.0) < 0.9
            and by.get("host_launch", 0.0) < 0.1 * step)


# A faster resource can price a pipelined step a little slower: block prices are slices of
# one layer-template timeline, and slack one block gains (its kernels end sooner) can
# reappear as another block's wait for its collectives or for the host's kernel launches,
# on another pipeline stage (hardware_models/composite.py, "Known limit"). Bounded by this
# share of the step: the largest seen, over 300 generated runs, is 0.022% (tiny and the
# MoE, 2-layer templates, pipeline depth 2).
SLACK_SHIFT = 1e-3
