"""Blocking kernel launches (CUDA_LAUNCH_BLOCKING=1, TrainingRun.launch_blocking): each
host-launched kernel waits for its launch's round trip, and a run that says something
overlaps cannot have them."""
from __future__ import annotations

from dataclasses import replace

import pytest

from conftest import LLAMA6, prediction_text
from flint.cluster import Cluster
from flint.errors import FlintError
from flint.hardware_models.populations import BLOCKING_LAUNCH_S, LAUNCH_S
from flint.hardware_models.schedule import simulate
from flint.models.synthetic import uniform_layers
from flint.passes.kernel_population import KernelPopulation
from flint.run import TrainingRun


def eager_chain(blocking: bool, layers: int = 4):
    g = uniform_layers(layers, Cluster(1, (("data", 1),), "h100-sxm"))
    return KernelPopulation("torch-eager", launch_blocking=blocking).run(g)


def test_each_blocking_launch_waits_its_round_trip_and_async_ones_run_ahead():
    kernel_s = 1e-3                       # long kernels: an asynchronous host runs ahead
    for blocking in (False, True):
        g = eager_chain(blocking)
        assert all(bool(n.meta.get("launch_blocking")) == blocking for n in g.nodes)
        tl = simulate(g, [kernel_s] * len(g.nodes))
        n = len(g.nodes)
        if blocking:
            assert tl.step_time == pytest.approx(n * (kernel_s + BLOCKING_LAUNCH_S))
            assert all(w == pytest.approx(BLOCKING_LAUNCH_S) for w in tl.launch_wait)
        else:                             # only the first launch shows
            assert tl.step_time == pytest.approx(n * kernel_s + LAUNCH_S)


def test_xla_launches_command_buffers_not_kernels():
    with pytest.raises(FlintError, match="launch_blocking is for frameworks"):
        KernelPopulation("xla", launch_blocking=True)


def test_a_run_that_says_something_overlaps_cannot_block_its_launches():
    base = dict(model=LLAMA6, devices=4, tp=2, pp=2, global_batch=8)
    with pytest.raises(FlintError, match="cannot apply with overlap_grad_reduce True"):
        TrainingRun(**base, launch_blocking=True)
    with pytest.raises(FlintError, match="tp_comm_overlap True"):
        TrainingRun(**base, launch_blocking=True, overlap_grad_reduce=False,
                    tp_comm_overlap=True)
    with pytest.raises(FlintError, match="with pipeline_p2p blocking$"):
        TrainingRun(**base, launch_blocking=True, overlap_grad_reduce=False,
                    pipeline_p2p="blocking")
    with pytest.raises(FlintError, match="XLA launches"):
        TrainingRun(**base, launch_blocking=True, overlap_grad_reduce=False, framework="xla")
    with pytest.raises(FlintError, match="zero 3"):
        TrainingRun(model=LLAMA6, devices=4, zero=3, framework="torch-eager",
                    launch_blocking=True, overlap_grad_reduce=False)
    run = TrainingRun(**base, launch_blocking=True, overlap_grad_reduce=False)
    # what it derives: the sends one at a time, no TP overlap; without it, megatron's own
    assert (run.pipeline_p2p, run.tp_comm_overlap) == ("blocking-serial", False)
    back = run.replace(launch_blocking=False, overlap_grad_reduce=True)
    assert (back.pipeline_p2p, back.tp_comm_overlap) == ("blocking", True)


def test_the_engine_prices_blocking_launches_and_the_report_says_so():
    from flint.engine import predict

    base = dict(model=LLAMA6, devices=2, tp=2, global_batch=4, overlap_grad_reduce=False)
    free = predict(TrainingRun(**base))
    held = predict(TrainingRun(**base, launch_blocking=True))
    # every kernel of the step waits a round trip: at least one per layer and micro-batch
    kernels = 6 * TrainingRun(**base).microbatches
    assert held.step_time_s - free.step_time_s > kernels * BLOCKING_LAUNCH_S
    assert held.by_class_s["host_launch"] > free.by_class_s.get("host_launch", 0.0)
    assert "blocking (CUDA_LAUNCH_BLOCKING=1)" in " ".join(prediction_text(held).split())
    assert "CUDA_LAUNCH_BLOCKING" not in prediction_text(free)


def test_composite_nodes_are_priced_by_their_template_not_blocked_again():
    g = eager_chain(True)
    composite = replace(g.nodes[0], meta=dict(g.nodes[0].meta, composite={"block": "F:layer"}))
    g = replace(g, nodes=[composite] + g.nodes[1:])
    tl = simulate(g, [1e-3] * len(g.nodes))
    assert tl.launch_wait[0] == 0.0


def test_the_cli_flag_reaches_the_run_and_a_clash_is_one_line(tmp_path):
    from conftest import run_cli

    argv = ["predict", "--model", "llama3-8b", "--seq-len", "2048", "--devices", "2",
            "--tp", "2", "--launch-blocking"]
    code, out, err = run_cli(argv)
    assert code == 2 and not out
    assert err.strip().count("\n") == 0 and "set overlap_grad_reduce false" in err
    code, out, err = run_cli(argv + ["--no-overlap-grad-reduce", "--save-run",
                                     tmp_path / "run.yaml"])
    assert code == 0, err
    assert "launch_blocking: true" in (tmp_path / "run.yaml").read_text()
    assert "blocking (CUDA_LAUNCH_BLOCKING=1)" in " ".join(out.split())
