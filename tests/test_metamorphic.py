"""Metamorphic relations over `flint.predict` (the engine every front door uses): runs of
the zoo `tiny` model, a small Llama-3-8B and a small Qwen3 MoE, with generated pipeline
depths, batch sizes, device counts, ZeRO flavours and hardware what-ifs.

No relation needs a true answer: each compares predictions with each other (a faster
resource is never slower, twice the micro-batches is affine in compute, the op-class
split adds up to the busy time, ...), so each would catch a wrong number whatever the
right number is. Examples only re-price three compiled programs (tests/metamorphic_cases.py)
and are derandomized (CI replays the same cases)."""
from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from metamorphic_cases import (FEW, METAMORPHIC, SLACK_SHIFT, binds, factors, faster,
                               resources, runs)

from flint.engine import predict
from flint.run import TrainingRun
from flint.hardware_models.spec import load_spec

def _busy(p) -> float:
    return p.compute_busy_s + p.estimate.communication_busy_s


@METAMORPHIC
@given(run=runs(), resource=resources, factor=factors)
def test_a_faster_resource_never_slows_the_step(run, resource, factor):
    # a latency the spec does not state is NCCL's own per protocol (hardware_models/
    # nccl.py), which a what-if replaces: compare two stated latencies
    stated = [faster(run.hardware, resource, 1.0)] if resource.endswith("latency") else []
    base = predict(run, what_if=stated)
    what_if = faster(run.hardware, resource, factor)
    fast = predict(run, what_if=[what_if])
    assert fast.step_time_s <= base.step_time_s * (1 + SLACK_SHIFT), (run.label(), what_if)
    # where the breakdown says the resource binds, it makes the step faster
    (effect,) = fast.facts["what_if_effects"]
    if factor >= 2 and binds(base, resource, effect):
        assert fast.step_time_s < base.step_time_s * 0.99, (run.label(), what_if)


@FEW
@given(run=runs(), factor=factors)
def test_more_memory_changes_the_verdict_not_the_step(run, factor):
    base = predict(run)
    spec = load_spec(run.hardware)
    bigger = predict(run, what_if=[f"hbm_capacity={spec.hbm_capacity * factor:.9g}B"])
    smaller = predict(run, what_if=[f"hbm_capacity={spec.hbm_capacity / factor:.9g}B"])
    assert bigger.step_time_s == base.step_time_s == smaller.step_time_s
    assert bigger.memory_bytes == base.memory_bytes == smaller.memory_bytes
    assert bigger.oom <= base.oom <= smaller.oom
    (effect,) = bigger.facts["what_if_effects"]
    assert effect["effect"] == "memory only", effect


@METAMORPHIC
@given(run=runs())
def test_op_class_times_add_up_to_the_busy_time(run):
    """The per-class split is of the same device and the same streams as the busy times:
    compute stream plus communication streams of the busiest device."""
    p = predict(run)
    assert sum(p.by_class_s.values()) == pytest.approx(_busy(p), rel=1e-9)
    assert all(v >= 0 for v in p.by_class_s.values())


def _masked_attention_share(p) -> float:
    """The causal mask's half of the attention flops as a share of the step's peak flops:
    model flops count the S x S product whole (PaLM, Megatron-LM), the kernels skip it."""
    from flint.models.decoder import model_flops

    run = p.run
    cfg = run.model_config()
    tokens = run.tokens_per_step
    # the attention term is linear in the sequence (at fixed tokens), the rest is not in it
    full = model_flops(cfg.with_(seq_len=2 * run.seq_len), tokens) - model_flops(cfg, tokens)
    peak = load_spec(run.hardware).peak("bf16")
    return full / 2 / run.devices / (p.step_time_s * peak)


@METAMORPHIC
@given(run=runs())
def test_mfu_is_at_most_hfu_and_hfu_at_most_one(run):
    """MFU <= HFU <= 1, model flops counted as the kernels run them: MFU follows the
    published convention (causal attention whole), so the relation that holds is
    MFU - (the mask's half) <= HFU; the report says why when MFU exceeds HFU."""
    p = predict(run)
    assert 0 < p.hfu <= 1 and 0 < p.mfu <= 1
    assert p.mfu - _masked_attention_share(p) <= p.hfu * (1 + 1e-9), (run.label(), p.mfu,
                                                                       p.hfu)


def _compute_per_device(p) -> list[float]:
    return p.pipeline.get("compute_busy_s") or [p.compute_busy_s]


@METAMORPHIC
@given(run=runs(), doubling=st.sampled_from((1, 2)))
def test_twice_the_batch_at_one_micro_batch_size_is_affine_in_compute(run, doubling):
    """Gradient accumulation: each micro-batch adds the same work to a device and the
    once-per-step work (reduction, optimizer) does not grow, so on every device
    compute(4B) - compute(2B) is twice compute(2B) - compute(B); the step reports the
    busiest device's; the step at most doubles and the tokens double."""
    b = run.global_batch * doubling
    one, two, four = (predict(run.replace(global_batch=b * k)) for k in (1, 2, 4))
    for c1, c2, c4 in zip(*map(_compute_per_device, (one, two, four))):
        assert c2 - c1 > 0
        # (to 1% of the added compute: compute that overlaps communication runs stretched,
        # schedule.py, and a pipeline's warm-up overlaps its collectives differently from
        # its steady state)
        assert c4 - c2 == pytest.approx(2 * (c2 - c1), rel=1e-2), run.label()
    for p in (one, two, four):
        assert p.compute_busy_s == max(_compute_per_device(p))
    assert one.step_time_s < two.step_time_s <= 2 * one.step_time_s * (1 + 1e-9)
    assert two.tokens_per_s >= one.tokens_per_s * (1 - 1e-9)
    assert two.facts["tokens_per_step"] == 2 * one.facts["tokens_per_step"]


@FEW
@given(replicas=st.sampled_from((1, 2)), pp=st.sampled_from((1, 2)),
       m=st.integers(1, 3))
def test_memory_grows_with_the_micro_batch_and_shrinks_with_sharding(replicas, pp, m):
    """Per-device memory: twice the sequences per micro-batch (same global batch) holds
    more activations; more data-parallel ranks shard ZeRO's optimizer state thinner, a
    higher ZeRO stage shards more, and tensor parallelism shards weights and activations.
    (tiny at micro-batch 2 is one more compiled program; the rest only re-price.)"""
    dp = 4 * replicas
    run = TrainingRun(model="tiny", seq_len=64, devices=2 * dp * pp, tp=2, pp=pp,
                      global_batch=2 * dp * m)
    mem = lambda r: predict(r).memory_bytes  # noqa: E731
    assert mem(run.replace(micro_batch=2)) > mem(run)
    wider = run.replace(devices=2 * run.devices, global_batch=2 * run.global_batch)
    assert mem(wider) <= mem(run)
    assert mem(run.replace(zero=2)) <= mem(run) <= mem(run.replace(zero=0))
    assert mem(run) <= mem(run.replace(tp=1, sp=False, tp_comm_overlap=False))


@FEW
@given(run=runs(), resource=resources, factor=factors,
       label=st.sampled_from(("my-cluster", "a100-lookalike")))
def test_cli_library_and_sweep_give_one_number(run, resource, factor, label, tmp_path_factory):
    """One run, one what-if: `flint predict --json` (a run file), flint.predict, `flint
    sweep` and the run on a renamed copy of its spec give the same step, MFU and memory."""
    import json
    import os
    import shutil

    import yaml

    from conftest import run_cli
    from flint.engine import stage_program
    from flint.hardware_models.spec import SPECS_DIR
    from flint.sweep import run_sweep
    from flint.sweep_space import SearchSpace
    from flint.template_cache import TemplateCache

    tmp = tmp_path_factory.mktemp("doors")
    what_if = faster(run.hardware, resource, factor)
    lib = predict(run, what_if=[what_if])
    (tmp / "run.yaml").write_text(run.to_yaml())
    code, out, err = run_cli(["predict", tmp / "run.yaml", "--set", what_if, "--json"])
    assert code == 0, err
    cli = json.loads(out)
    # the sweep's directory starts with the session's compiled program (no second compile)
    program = TemplateCache(os.environ["FLINT_CACHE"]).path(stage_program(run))
    (tmp / "sweep" / "templates").mkdir(parents=True)
    shutil.copy(program, tmp / "sweep" / "templates" / program.name)
    key, _, value = what_if.partition("=")
    (row,) = run_sweep(SearchSpace.from_dict({**run.to_json(), "what_if": [{key: value}]}),
                       tmp / "sweep")
    doc = yaml.safe_load((SPECS_DIR / f"{run.hardware}.yaml").read_text())
    (tmp / f"{label}.yaml").write_text(yaml.safe_dump({**doc, "name": label}))
    renamed = predict(run.replace(hardware=str(tmp / f"{label}.yaml")), what_if=[what_if])
    assert not row["extracted"] and not renamed.extracted
    assert lib.step_time_s == cli["step_time_s"] == row["step_time_s"] == renamed.step_time_s
    assert lib.mfu == cli["mfu"] == row["mfu"] == renamed.mfu
    assert lib.memory_bytes == cli["memory_bytes"] == renamed.memory_bytes
    assert cli["facts"]["what_if_effects"] == lib.facts["what_if_effects"]
