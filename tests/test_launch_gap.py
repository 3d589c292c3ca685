"""The GPU's launch gap: kernels launched on their own start a gap after the stream's last
one ends (hardware_models.kernels.DEFAULT_LAUNCH_GAP_S); kernels replayed from a CUDA graph
(XLA's command buffers, the run's `cuda_graphs`) do not."""
from __future__ import annotations

import pytest

from flint.cluster import Cluster
from flint.hardware_models.cost_model import default_cost_model
from flint.hardware_models.kernels import DEFAULT_LAUNCH_GAP_S
from flint.hardware_models.populations import LAUNCH_S
from flint.hardware_models.schedule import launch_gaps, simulate
from flint.hardware_models.spec import load_spec
from flint.models.synthetic import uniform_layers
from flint.passes.kernel_population import KernelPopulation
from flint.validate.workflow import open_input, run_validate

GAP = DEFAULT_LAUNCH_GAP_S["gpu"]
KERNEL_S = 1e-3                # long kernels: the host launches run ahead of the GPU


def chain(framework: str, cuda_graphs=None, hardware: str = "h100-sxm"):
    g = uniform_layers(4, Cluster(1, (("data", 1),), hardware))
    return KernelPopulation(framework, cuda_graphs=cuda_graphs).run(g)


def step(g, hardware: str = "h100-sxm"):
    model = default_cost_model(g, hardware)
    kernels = [n for n in g.nodes if n.flops or n.bytes_read or n.bytes_written]
    return simulate(g, [KERNEL_S] * len(g.nodes), gaps=launch_gaps(g, model)), len(kernels)


def test_kernels_launched_one_by_one_wait_the_gap_and_graph_replays_do_not():
    eager, n = step(chain("torch-eager"))
    assert eager.step_time == pytest.approx(len(eager.graph.nodes) * KERNEL_S + LAUNCH_S
                                            + (n - 1) * GAP)
    graphed, _ = step(chain("torch-eager", cuda_graphs=True))    # no host launch, no gap
    assert graphed.step_time == pytest.approx(len(graphed.graph.nodes) * KERNEL_S)
    # XLA runs from command buffers unless the run turned them off
    xla, _ = step(chain("xla"))
    assert xla.step_time == pytest.approx(len(xla.graph.nodes) * KERNEL_S)
    off, _ = step(chain("xla", cuda_graphs=False))
    assert off.step_time == pytest.approx(len(off.graph.nodes) * KERNEL_S + (n - 1) * GAP)
    assert sum(off.launch_wait) == pytest.approx((n - 1) * GAP)


def test_a_node_of_several_kernels_waits_the_gap_between_them():
    g = chain("xla", cuda_graphs=False)
    three = g.nodes[1].id
    g.nodes[three].meta["kernels"] = 3
    tl, _ = step(g)
    assert tl.finish[three] - tl.start[three] == pytest.approx(KERNEL_S + 2 * GAP)


def test_tpus_have_no_gap():
    g = chain("xla", cuda_graphs=False, hardware="tpu-v5p")
    assert launch_gaps(g, default_cost_model(g, "tpu-v5p")) is None


def test_a_trace_without_command_buffers_is_priced_with_its_launch_gaps(maxtext_archive):
    """JAX-Toolbox's MaxText nsys-jax run launched every thunk on its own (no command buffer
    thunk in the trace): 947 kernels per step on its compute stream, the median gap
    between them 1.5-1.7 us (NVTX-projected)."""
    inp = open_input(str(maxtext_archive), hardware="h100-sxm", xla_emitters="legacy")
    assert inp.graph.meta["cuda_graphs"] is False
    v = run_validate(inp, load_spec("h100-sxm"), None, ["input_scatter_fusion"])
    assert "one by one" in v.launches
    assert 0.8e-3 < v.launch_wait_s < 1.5e-3
    assert v.to_json()["launches"] == v.launches


def test_a_run_says_whether_it_replays_cuda_graphs():
    from conftest import LLAMA6, prediction_text
    from flint.engine import predict
    from flint.errors import FlintError
    from flint.run import TrainingRun

    base = dict(model=LLAMA6, devices=2, tp=2, global_batch=4)
    eager = predict(TrainingRun(**base))           # megatron: launched from the host
    graphed = predict(TrainingRun(**base, cuda_graphs=True))
    assert graphed.step_time_s < eager.step_time_s
    assert "from CUDA graphs" in " ".join(prediction_text(graphed).split())
    assert TrainingRun(**base).cuda_graphs is False               # megatron's default
    assert TrainingRun(**base, framework="xla").cuda_graphs is True
    assert TrainingRun(**base, hardware="tpu-v5p", framework="xla").cuda_graphs is False
    with pytest.raises(FlintError, match="^cuda_graphs: tpu-v5p is not a GPU"):
        TrainingRun(**base, hardware="tpu-v5p", framework="xla", cuda_graphs=True)
    with pytest.raises(FlintError, match="cuda_graphs True"):
        TrainingRun(**base, launch_blocking=True, overlap_grad_reduce=False,
                    cuda_graphs=True)


def test_flint_predict_cuda_graphs_flag():
    """README: `flint predict --cuda-graphs`; a TPU refuses it in one line."""
    from conftest import run_cli

    args = ["predict", "--model", "tiny", "--seq-len", "64", "--devices", "2", "--tp", "2",
            "--global-batch", "4"]
    code, stdout, _ = run_cli(args + ["--cuda-graphs"])
    assert code == 0 and "from CUDA graphs" in " ".join(stdout.split())
    code, stdout, stderr = run_cli(args + ["--hardware", "tpu-v5p", "--framework", "xla",
                                           "--cuda-graphs"])
    assert code == 2 and not stdout and len(stderr.strip().splitlines()) == 1
    assert "cuda_graphs: tpu-v5p is not a GPU" in stderr


def test_a_chakra_consumer_is_given_the_launch_waits_in_the_durations():
    """ASTRA-sim starts a node once its inputs and stream are free: each node's duration
    in the export carries its wait for the launch, so a serial chain replays to the step."""
    from flint.hardware_models.estimate import durations_as_run, estimate, node_durations

    for g in (chain("torch-eager"), chain("xla", cuda_graphs=False), chain("xla")):
        flat, durations, model = node_durations(g, "h100-sxm")
        as_run = durations_as_run(flat, durations, model)
        assert sum(as_run) == pytest.approx(estimate(g, "h100-sxm").step_time_s)
