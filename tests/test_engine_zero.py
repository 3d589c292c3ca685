"""The engine's data-parallel sharding flavours: ZeRO stages, shard groups and sync modes,
gradient-reduction dtype, and how FSDP's gathered parameters live (FSDP2 resharding, FSDP
under a pipeline)."""
from __future__ import annotations

import json

import pytest

from conftest import LLAMA6, prediction_text, run_cli
from flint.errors import FlintError
from flint.run import TrainingRun


def test_zero_stages_shard_what_they_say():
    """ZeRO-1 shards the optimizer state, ZeRO-2 the gradients too (reduce-scattered after
    every micro-batch, so with gradient accumulation it moves more), ZeRO-3 everything."""
    from flint.engine import predict

    mem, steps = {}, {}
    for zero in (0, 1, 2, 3):
        p = predict(TrainingRun(model=LLAMA6, devices=16, zero=zero, global_batch=64))
        mem[zero], steps[zero] = p.memory_bytes, p.step_time_s
        args = p.memory["arguments_bytes"]
        print(f"zero {zero}: {p.memory_bytes / 2**30:.2f} GiB ({args}), "
              f"{p.step_time_s * 1e3:.2f} ms")
    assert mem[0] > mem[1] > mem[2] > mem[3]
    assert steps[2] > steps[1]          # 4 reduce-scatters instead of one


def test_zero1_shard_groups_and_internevo_sync_move_what_they_say():
    """The optimizer's shard group (hsdp with zero 1) and InternEvo's sync (gradients
    all-reduced, owners broadcasting) each change the step's collectives and memory; the
    impossible combinations are one line."""
    from flint.engine import predict

    base = dict(model=LLAMA6, devices=16, zero=1, global_batch=16)
    plain, grouped = predict(TrainingRun(**base)), predict(TrainingRun(**base, hsdp=4))
    bcast = predict(TrainingRun(**base, zero_sync="broadcast"))
    assert set(plain.collectives_s) == {"reduce-scatter", "all-gather"}
    assert set(grouped.collectives_s) == {"reduce-scatter", "all-reduce", "all-gather"}
    assert set(bcast.collectives_s) == {"all-reduce", "collective-broadcast"}
    assert grouped.memory["arguments_bytes"]["optimizer_state"] == pytest.approx(
        4 * plain.memory["arguments_bytes"]["optimizer_state"], rel=1e-3)
    assert "parameters broadcast by their owners" in prediction_text(bcast)
    # DeepSpeed's BF16_Optimizer: the whole gradients all-reduced, parameters gathered
    gathered = predict(TrainingRun(**base, zero_sync="all-reduce"))
    assert set(gathered.collectives_s) == {"all-reduce", "all-gather"}
    assert gathered.collectives_s["all-reduce"] > plain.collectives_s["reduce-scatter"]
    assert gathered.memory["arguments_bytes"]["optimizer_state"] == pytest.approx(
        plain.memory["arguments_bytes"]["optimizer_state"], rel=1e-3)
    assert "parameters all-gathered" in prediction_text(gathered)
    with pytest.raises(FlintError, match="zero_sync: all-reduce is DeepSpeed"):
        TrainingRun(**dict(base, zero=2), zero_sync="all-reduce")
    with pytest.raises(FlintError, match="zero_sync: broadcast is InternEvo's ZeRO-1"):
        TrainingRun(**dict(base, zero=2), zero_sync="broadcast")
    with pytest.raises(FlintError, match="hsdp: a shard group"):
        TrainingRun(**dict(base, zero=0), hsdp=4)
    with pytest.raises(FlintError, match="zero_sync"):
        TrainingRun.from_json(dict(base, zero_sync="gather"))


def test_bf16_gradient_reduction_halves_the_reduce_scatter_and_the_gradient_buffer():
    """grad_reduce_dtype bf16 (Megatron-Core grad_reduce_in_fp32=False): the distributed
    optimizer's reduce-scatter moves bf16, half the bytes, and the main-gradient buffer is
    2 bytes per parameter instead of 4; where Flint cannot price it, one line."""
    from flint.engine import predict

    base = dict(model=LLAMA6, devices=16, zero=1, global_batch=16)
    fp32, bf16 = predict(TrainingRun(**base)), predict(TrainingRun(**base,
                                                                   grad_reduce_dtype="bf16"))
    # per parameter: the main gradients (4 or 2 B) and the bf16 parameters the sync writes
    grads = [p.memory["arguments_bytes"]["parameters"] for p in (fp32, bf16)]
    assert grads[1] / grads[0] == pytest.approx((2 + 2) / (4 + 2), rel=5e-3)
    assert bf16.memory_bytes < fp32.memory_bytes
    assert bf16.collectives_s["reduce-scatter"] < 0.75 * fp32.collectives_s["reduce-scatter"]
    assert bf16.collectives_s["all-gather"] == pytest.approx(fp32.collectives_s["all-gather"])
    assert bf16.step_time_s <= fp32.step_time_s
    # DeepSpeed's BF16_Optimizer sends bf16 but accumulates into an fp32 buffer
    copy = dict(base, global_batch=32, grad_accumulation="fp32-copy")
    kept = [predict(TrainingRun(**copy, grad_reduce_dtype=d)) for d in ("fp32", "bf16")]
    assert kept[1].memory["arguments_bytes"]["parameters"] == pytest.approx(
        kept[0].memory["arguments_bytes"]["parameters"], rel=1e-6)
    assert kept[1].collectives_s["reduce-scatter"] < kept[0].collectives_s["reduce-scatter"]
    for wrong, said in ((dict(zero=3), "zero 3, megatron"),
                        (dict(framework="torch-eager"), "zero 1, torch-eager")):
        with pytest.raises(FlintError, match=f"grad_reduce_dtype: bf16 .*{said}"):
            TrainingRun(**dict(base, **wrong), grad_reduce_dtype="bf16")
    with pytest.raises(FlintError, match="grad_reduce_dtype"):
        TrainingRun.from_json(dict(base, grad_reduce_dtype="fp16"))


def test_cli_grad_reduce_dtype_flag():
    args = ["predict", "--model", "llama3-8b", "--seq-len", "4096", "--devices", "16",
            "--tp", "8", "--json"]
    code, out, err = run_cli(args + ["--grad-reduce-dtype", "bf16"])
    assert code == 0, err
    assert json.loads(out)["run"]["grad_reduce_dtype"] == "bf16"
    code, out, err = run_cli(args + ["--grad-reduce-dtype", "fp16"])
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "grad_reduce_dtype" in err and "Traceback" not in err


def test_fsdp2_reshard_after_forward_gathers_once():
    """FSDP2 with reshard_after_forward=False (ZeRO-2 style) gathers each unit's
    parameters once per micro-batch instead of twice; XLA's FSDP cannot be told."""
    from flint import engine

    counts = {}
    for keep in (True, False):
        run = TrainingRun(model={"base": "llama3-8b", "layers": 3, "seq": 256, "vocab": 32000},
                          devices=8, zero=3, framework="torch-compile",
                          reshard_after_forward=keep)
        graph, _ = engine._cache(None).get(engine.stage_program(run))
        counts[keep] = sum(n.collective is not None and n.collective.type == "all-gather"
                           for n in graph.nodes)
    # 3 layers gathered for forward and backward, the root once (FSDP2 keeps it), or
    # every unit once
    assert (counts[True], counts[False]) == (3 * 2 + 1, 3 + 1)
    with pytest.raises(FlintError, match="reshard_after_forward: megatron runs XLA"):
        TrainingRun(model=LLAMA6, devices=8, zero=3, reshard_after_forward=False)


def test_fsdp_under_a_pipeline_gathers_parameters_once_per_step(monkeypatch):
    """ZeRO-3 with pipeline stages (framework megatron) gathers each layer's parameters once
    per step and holds them through the micro-batches, as torch.distributed.pipelining with
    FSDP2 and torchtitan do: the gathers cost the same at 2 and 8 micro-batches, the step
    is faster than gathering in every micro-batch, and the held parameters cost memory."""
    from flint import engine

    def run(gbs):
        return TrainingRun(model=LLAMA6, devices=16, pp=2, zero=3, global_batch=gbs)

    held = {g: engine.predict(run(g)) for g in (16, 64)}
    assert held[16].collectives_s["all-gather"] > 0
    assert held[64].collectives_s["all-gather"] == pytest.approx(
        held[16].collectives_s["all-gather"], rel=1e-9)
    assert "once per step" in held[64].facts["parameter_gathers"]
    assert "parameter gathers" in prediction_text(held[64])
    monkeypatch.setattr(engine, "gathers_held_for_step", lambda r: False)
    engine._LAYERED.clear()
    engine._PIPELINED.clear()
    every = engine.predict(run(64))
    assert "all-gather" not in every.collectives_s         # inside each micro-batch's blocks
    assert "parameter_gathers" not in every.facts
    assert every.step_time_s > held[64].step_time_s
    assert held[64].memory_bytes > every.memory_bytes
    engine._LAYERED.clear()
    engine._PIPELINED.clear()


def test_only_fsdp_under_a_megatron_or_torch_pipeline_holds_its_gathers():
    """XLA's pipelined FSDP (MaxText's default, pipeline_fsdp_ag_once=False) and FSDP
    without stages gather in every micro-batch, as their programs do."""
    from flint.engine import gathers_held_for_step

    base = dict(model=LLAMA6, devices=16, global_batch=64)
    assert gathers_held_for_step(TrainingRun(**base, pp=2, zero=3))
    assert gathers_held_for_step(TrainingRun(**base, pp=2, zero=3, framework="torch-eager"))
    assert not gathers_held_for_step(TrainingRun(**base, pp=2, zero=3, framework="xla"))
    assert not gathers_held_for_step(TrainingRun(**base, zero=3))
    assert not gathers_held_for_step(TrainingRun(**base, pp=2, zero=1))


def test_fsdp2_frees_gathered_weights_between_forward_and_backward():
    """FSDP2 with reshard_after_forward frees a layer's gathered weights after its forward
    and gathers them again for its backward: they are no activation kept for the backward
    (the traced copy-out into FSDP2's buffer reads like one); SHARD_GRAD_OP style keeps
    every layer's gathered weights until its backward."""
    from flint.engine import predict

    base = dict(model=LLAMA6, devices=8, zero=3, framework="torch-eager", global_batch=8,
                remat="full")
    freed, kept = (predict(TrainingRun(**base, reshard_after_forward=k)) for k in (True, False))
    d, ffn = 4096, 14336                     # llama3-8b: 32 query and 8 key/value heads
    layer_bytes = 2 * (d * (d + 2 * d // 4 + d) + 3 * d * ffn)
    assert kept.memory_bytes - freed.memory_bytes > 0.8 * 6 * layer_bytes
    # the activations themselves are still kept: without recompute, far more
    stored = predict(TrainingRun(**dict(base, remat="none")))
    assert stored.memory_bytes - freed.memory_bytes > 6 * 8 * (2048 * d * 2)
