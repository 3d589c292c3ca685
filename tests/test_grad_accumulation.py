"""Gradient accumulation as frameworks do it (passes/grad_accumulation.py): in the GEMM
(nothing added), PyTorch's AccumulateGrad, DeepSpeed BF16_Optimizer's fp32 copy."""
from __future__ import annotations

import pytest

from conftest import run_cli
from flint.errors import FlintError
from flint.run import TrainingRun

LLAMA6 = {"base": "llama3-8b", "layers": 6, "seq": 2048, "vocab": 32000}
# 4 devices, tp 2 pp 2 -> dp 1; 4 micro-batches of 1 sequence
BASE = dict(model=LLAMA6, seq_len=2048, devices=4, tp=2, pp=2, micro_batch=1,
            global_batch=4, remat="full")


def _layered(run):
    from flint.engine import _cache, layered_graph

    graph, _ = layered_graph(run, _cache(None))
    return graph


def test_defaults_follow_the_framework_and_bad_modes_are_one_line():
    assert TrainingRun(**BASE).grad_accumulation == "in-gemm"
    assert TrainingRun(**dict(BASE, framework="xla")).grad_accumulation == "in-gemm"
    with pytest.raises(FlintError, match="grad_accumulation"):
        TrainingRun.from_json(dict(BASE, grad_accumulation="fp64"))
    torch = dict(BASE, tp=1, pp=1, zero=3, framework="torch-eager", remat="none")
    assert TrainingRun(**torch).grad_accumulation == "autograd"
    for mode, whose in (("in-gemm", "Megatron's gradient-accumulation fusion"),
                        ("fp32-copy", "DeepSpeed's BF16 optimizer")):
        with pytest.raises(FlintError, match=f"grad_accumulation: torch-eager .* {whose}"):
            TrainingRun(**torch, grad_accumulation=mode)


def test_fp32_copy_adds_a_cast_and_an_add_per_block_with_the_layer_parameters():
    """Every block's backward is followed by its cast (2 -> 4 bytes per parameter) and its
    add (4 + 4 -> 4) at (m-1)/m; the layer's parameter count is the model's over tp."""
    run = TrainingRun(**BASE, grad_accumulation="fp32-copy")
    g = _layered(run)
    acc = [n for n in g.nodes if n.name.startswith("grad_acc.")]
    layers = run.model_config().n_layers
    casts = [n for n in acc if n.name.startswith("grad_acc.to_fp32.layer_")]
    adds = [n for n in acc if n.name.startswith("grad_acc.accumulate.layer_")]
    assert len(casts) == len(adds) == layers
    cfg = run.model_config()
    d, kv = cfg.d_model, cfg.n_kv_heads * cfg.d_model // cfg.n_heads
    per_layer = (d * d * 2 + 2 * d * kv + 3 * d * cfg.d_ff) / run.tp   # + norms (replicated)
    elems = casts[0].bytes_read / 2
    assert elems == pytest.approx(per_layer, rel=0.01)
    assert casts[0].bytes_written == pytest.approx(4 * elems)
    m = run.microbatches
    assert adds[0].bytes_read == pytest.approx(8 * elems * (m - 1) / m)
    assert adds[0].bytes_written == pytest.approx(4 * elems * (m - 1) / m)
    # it follows its block's backward, and what read the block's gradients reads the sum
    users = g.users
    for n in casts:
        block = g.nodes[n.inputs[0]]
        assert block.name == "bwd." + n.meta["layer"]
        acc_last = next(a for a in adds if a.meta["layer"] == n.meta["layer"])
        for r in (g.nodes[u] for u in users[block.id]):
            assert r.name.startswith(("bwd.", "grad_acc.")) or acc_last.id in r.control
    assert g.meta["grad_accumulation"] == "fp32-copy"


def test_accumulation_costs_its_bytes_and_nothing_without_micro_batches():
    """The step grows by at least the accumulation's bytes at the spec's HBM bandwidth on
    the busiest stage, and autograd's adds vanish with one micro-batch (AccumulateGrad
    assigns the first gradient)."""
    from flint.engine import predict
    from flint.hardware_models.spec import load_spec

    fused = predict(TrainingRun(**BASE))
    copy = predict(TrainingRun(**BASE, grad_accumulation="fp32-copy"))
    auto = predict(TrainingRun(**BASE, grad_accumulation="autograd"))
    g = _layered(TrainingRun(**BASE, grad_accumulation="fp32-copy"))
    moved = sum(n.bytes_read + n.bytes_written for n in g.nodes
                if n.name.startswith("grad_acc.") and n.meta["layer"] != "embed")
    hbm = load_spec("h100-sxm").hbm_bandwidth
    m = TrainingRun(**BASE).microbatches
    # the last stage runs half the layers (and the head): at least half the bytes, m times
    assert copy.step_time_s - fused.step_time_s >= 0.4 * moved * m / hbm
    assert fused.step_time_s < auto.step_time_s < copy.step_time_s
    assert copy.facts["grad_accumulation"] == "fp32-copy"
    one = dict(BASE, global_batch=1)
    g1 = _layered(TrainingRun(**one, grad_accumulation="autograd"))
    assert not any(n.name.startswith("grad_acc.") for n in g1.nodes)
    with pytest.raises(FlintError, match="unknown gradient accumulation"):
        from flint.passes.grad_accumulation import GradAccumulation

        GradAccumulation("fp64")


def test_cli_flag_and_report_row():
    argv = ["predict", "--model", "tiny", "--seq-len", "64", "--devices", "4",
            "--global-batch", "16", "--grad-accumulation", "fp32-copy"]
    code, stdout, stderr = run_cli(argv)
    assert code == 0, stderr
    assert "gradient accumulation" in stdout and "DeepSpeed BF16 optimizer" in stdout
    code, stdout, stderr = run_cli(argv[:-1] + ["fp64"])
    assert code == 2 and len(stderr.strip().splitlines()) == 1


def test_tied_copy_and_sharded_buffers():
    """A tied embedding's copy on the head's stage accumulates too (DeepSpeed's
    TiedLayerSpec); a ZeRO-2 buffer sharded over k ranks accumulates 1/k of the bytes."""
    from flint.engine import _cache, layered_graph
    from flint.passes.grad_accumulation import GradAccumulation

    run = TrainingRun(**BASE)
    g, _ = layered_graph(run, _cache(None))

    def acc_bytes(graph, label):
        return sum(n.bytes_read for n in graph.nodes
                   if n.name.startswith("grad_acc.") and n.meta["layer"] == label)

    plain = GradAccumulation("fp32-copy", microbatches=4).run(g)
    tied = GradAccumulation("fp32-copy", microbatches=4, tied_copy=True).run(g)
    halves = GradAccumulation("fp32-copy", microbatches=4, shards=2).run(g)
    assert acc_bytes(tied, "head") == pytest.approx(acc_bytes(plain, "head")
                                                    + acc_bytes(plain, "embed"))
    assert acc_bytes(halves, "layer_1") == pytest.approx(acc_bytes(plain, "layer_1") / 2)
    assert GradAccumulation("in-gemm").run(g) is g


def test_a_one_layer_model_is_refused_not_left_unpriced():
    from flint.engine import predict

    one = {"base": "llama3-8b", "layers": 1, "seq": 256, "vocab": 32000}
    run = TrainingRun(model=one, devices=1, global_batch=4, grad_accumulation="autograd")
    with pytest.raises(FlintError, match="needs a layer-templated step"):
        predict(run)


# --- when the gradients are reduced, and PyTorch's own accumulation ------------------
TORCH = dict(model=LLAMA6, seq_len=2048, devices=4, micro_batch=1, global_batch=16,
             remat="none", framework="torch-eager")


def test_grad_sync_defaults_follow_the_framework_and_impossible_ones_are_refused():
    """PyTorch DDP and FSDP2 reduce in every backward unless told not to (no_sync,
    set_requires_gradient_sync(False)); Megatron's schedules and XLA's step once; ZeRO-2
    must reduce every micro-batch."""
    assert TrainingRun(**TORCH, zero=0).grad_sync == "every-microbatch"
    assert TrainingRun(**TORCH, zero=3).grad_sync == "every-microbatch"
    assert TrainingRun(**BASE).grad_sync == "last-microbatch"
    assert TrainingRun(**dict(BASE, framework="xla")).grad_sync == "last-microbatch"
    assert TrainingRun(**dict(BASE, zero=2)).grad_sync == "every-microbatch"
    assert TrainingRun(**TORCH, zero=0, grad_sync="last-microbatch").grad_sync == \
        "last-microbatch"
    with pytest.raises(FlintError, match="grad_sync: zero 2 shards the gradient buffer"):
        TrainingRun(**dict(BASE, zero=2), grad_sync="last-microbatch")
    with pytest.raises(FlintError, match="grad_sync: last-microbatch under FSDP2 without "
                                         "a pipeline"):
        TrainingRun(**TORCH, zero=3, grad_sync="last-microbatch")
    with pytest.raises(FlintError, match="grad_sync"):
        TrainingRun.from_json(dict(BASE, grad_sync="sometimes"))


def test_torch_pipelines_reduce_once_and_fsdp2_keeps_its_gathers_by_default():
    """torch.distributed.pipelining reduces a stage's gradients in the last micro-batch's
    backward only (DDP's no_sync, FSDP2's set_requires_gradient_sync(False) before it), and
    torchtitan keeps FSDP2's gathered parameters under a pipeline (reshard_after_forward
    False); resharding after the forward there is refused, not priced as something else."""
    from flint.framework_rules import gathers_held_for_step, unsharded_gradient_accumulation

    staged = dict(TORCH, pp=2)
    fsdp, ddp = TrainingRun(**staged, zero=3), TrainingRun(**staged, zero=0)
    assert (fsdp.grad_sync, fsdp.reshard_after_forward) == ("last-microbatch", False)
    assert (ddp.grad_sync, ddp.reshard_after_forward) == ("last-microbatch", True)
    assert gathers_held_for_step(fsdp) and unsharded_gradient_accumulation(fsdp)
    assert not unsharded_gradient_accumulation(ddp)
    flat = TrainingRun(**TORCH, zero=3)
    assert (flat.grad_sync, flat.reshard_after_forward) == ("every-microbatch", True)
    assert not gathers_held_for_step(flat)
    assert fsdp.replace(pp=1).grad_sync == "every-microbatch"
    with pytest.raises(FlintError, match="reshard_after_forward: under a pipeline"):
        TrainingRun(**staged, zero=3, reshard_after_forward=True)
    code, _, stderr = run_cli(["predict", "--model", "tiny", "--seq-len", "64", "--devices",
                               "4", "--pp", "2", "--global-batch", "8", "--framework",
                               "torch-eager", "--zero", "3", "--reshard-after-forward"])
    assert code == 2 and len(stderr.strip().splitlines()) == 1
    assert "reshard_after_forward" in stderr


def test_fsdp2_under_a_pipeline_sums_whole_gradients_in_fp32_and_reduces_them_once():
    """With its gradient sync off FSDP2 adds each micro-batch's bf16 gradient into the
    unsharded fp32 sum (2 + 4 bytes read, 4 written per element of the whole parameter, at
    (m - 1)/m), holds the sums for the step (4 bytes per parameter of the stage, an argument
    of its own) and reduce-scatters and gathers once: the same collective seconds for 2 and
    8 micro-batches."""
    from flint.engine import predict

    def run(gbs):
        return TrainingRun(**dict(TORCH, pp=2, global_batch=gbs), zero=3)

    few, many = run(4), run(16)
    assert (few.dp, few.microbatches, many.microbatches) == (2, 2, 8)
    g = _layered(many)
    adds = [n for n in g.nodes if n.name.startswith("grad_acc.accumulate.layer_")]
    cfg = many.model_config()
    d, kv = cfg.d_model, cfg.n_kv_heads * cfg.d_model // cfg.n_heads
    per_layer = d * d * 2 + 2 * d * kv + 3 * d * cfg.d_ff           # + two norms
    share = (8 - 1) / 8
    assert adds[0].bytes_written == pytest.approx(4 * per_layer * share, rel=0.01)
    assert adds[0].bytes_read == pytest.approx(6 * per_layer * share, rel=0.01)
    sums = {name: b for name, b in g.meta["arguments"] if name.endswith(".grad_accumulator")}
    assert sums["layer_0.grad_accumulator"] == pytest.approx(4 * per_layer, rel=0.01)
    p_few, p_many = predict(few), predict(many)
    # the mean over the two stages' devices: every layer's, the embedding's and the head's
    whole = per_layer * cfg.n_layers + 2 * cfg.vocab * d
    assert p_many.memory["arguments_bytes"]["gradients"] == pytest.approx(
        4 * whole / 2, rel=0.01)
    for kind in ("reduce-scatter", "all-gather"):
        assert p_many.collectives_s[kind] == pytest.approx(p_few.collectives_s[kind],
                                                           rel=0.06)
    assert p_many.facts["grad_sync"] == "last-microbatch"
    assert "fp32 sum" in p_many.facts["gradient_sums"]
    assert "gradient_sums" not in predict(TrainingRun(**TORCH, zero=3)).facts


def test_torch_ddp_reduces_every_micro_batch_and_accumulates_in_f32():
    """DDP without no_sync all-reduces each micro-batch's (accumulated) gradients: m times
    the bytes of one reduction; under no_sync once. Either way AccumulateGrad adds every
    micro-batch after the first into the f32 .grad of the autocast weights: 4 + 4 bytes
    read, 4 written per parameter, at (m - 1)/m per micro-batch."""
    from flint.engine import predict

    every = TrainingRun(**TORCH, zero=0)
    last = TrainingRun(**TORCH, zero=0, grad_sync="last-microbatch")
    m = every.microbatches
    assert m == 4
    p_every, p_last = predict(every), predict(last)
    # m reductions of the same bytes; as they ran, each is lengthened by the memory-bound
    # kernels beside it (contention.py), which differ between the two schedules
    assert p_every.collectives_s["all-reduce"] == pytest.approx(
        m * p_last.collectives_s["all-reduce"], rel=0.06)
    assert p_every.step_time_s >= p_last.step_time_s
    g = _layered(every)
    adds = [n for n in g.nodes if n.name.startswith("grad_acc.accumulate.layer_")]
    assert len(adds) == every.model_config().n_layers
    cfg = every.model_config()
    d, kv = cfg.d_model, cfg.n_kv_heads * cfg.d_model // cfg.n_heads
    per_layer = d * d * 2 + 2 * d * kv + 3 * d * cfg.d_ff           # + two norms
    share = (m - 1) / m
    assert adds[0].bytes_written == pytest.approx(4 * per_layer * share, rel=0.01)
    assert adds[0].bytes_read == pytest.approx(8 * per_layer * share, rel=0.01)
    assert p_every.facts["grad_sync"] == "every-microbatch"


def test_torch_fsdp_accumulates_its_shard_and_reduce_scatters_every_micro_batch():
    """FSDP2 reduce-scatters each micro-batch's gradients and adds the shard into the
    sharded f32 .grad: the adds are 1/dp of DDP's; the reduce-scatters m times one."""
    from flint.engine import predict

    fsdp = TrainingRun(**TORCH, zero=3)
    ddp = TrainingRun(**TORCH, zero=0)
    per_rank = {run.zero: sum(n.bytes_written for n in _layered(run).nodes
                              if n.name.startswith("grad_acc.accumulate.layer_"))
                for run in (fsdp, ddp)}
    assert per_rank[3] == pytest.approx(per_rank[0] / fsdp.dp, rel=0.01)
    one = predict(TrainingRun(**dict(TORCH, global_batch=4), zero=3))
    # as they ran: each lengthened by the kernels beside it (contention.py)
    assert predict(fsdp).collectives_s["reduce-scatter"] == pytest.approx(
        fsdp.microbatches * one.collectives_s["reduce-scatter"], rel=0.06)


def test_grad_sync_cli_flag_and_report_row():
    argv = ["predict", "--model", "tiny", "--seq-len", "64", "--devices", "4",
            "--global-batch", "16", "--framework", "torch-eager", "--zero", "0"]
    code, stdout, stderr = run_cli(argv)
    assert code == 0, stderr
    assert "gradient reduction" in stdout and "every micro-batch" in stdout
    code, stdout, stderr = run_cli(argv + ["--grad-sync", "last-microbatch"])
    assert code == 0, stderr
    assert "last micro-batch's backward only" in stdout
    code, stdout, stderr = run_cli(argv + ["--grad-sync", "sometimes"])
    assert code == 2 and len(stderr.strip().splitlines()) == 1 and "grad_sync" in stderr


def test_replace_re_derives_framework_defaults_unless_set_otherwise():
    """run.replace(zero=2) or a change of framework takes the new framework's defaults;
    a value set to something else than the default stays."""
    run = TrainingRun(**BASE)
    assert run.replace(zero=2).grad_sync == "every-microbatch"
    torch = TrainingRun(**TORCH, zero=0)
    assert torch.replace(framework="megatron", zero=1).grad_accumulation == "in-gemm"
    kept = TrainingRun(**BASE, grad_accumulation="fp32-copy", grad_sync="every-microbatch")
    assert (kept.replace(tp=1).grad_accumulation, kept.replace(tp=1).grad_sync) == (
        "fp32-copy", "every-microbatch")
    # sp and TP overlap were derived from tp 2: tp 1 derives them again (no SP, no overlap)
    assert (kept.replace(tp=1).sp, kept.replace(tp=1).tp_comm_overlap) == (False, False)
