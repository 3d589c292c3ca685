"""Pipeline parallelism: stage split, schedules, SEND/RECV insertion, bubble accounting."""
from __future__ import annotations

import pytest

from flint.cluster import Cluster
from flint.errors import FlintError
from flint.graph import Node, NodeKind, WorkloadGraph
from flint.hardware_models.estimate import estimate
from flint.hlo.shapes import parse_shape
from flint.models.synthetic import uniform_layers
from flint.passes import parse_pipeline
from flint.passes.pipeline import PipelineParallel, apply_placement
from flint.passes.pipeline_stages import device_order, layer_index, task_of

def uniform_model(layers: int = 16) -> WorkloadGraph:
    """Identical layers, no embedding or head: the setting of the textbook bubble formula."""
    return uniform_layers(layers, Cluster(1, (("data", 1),), "h100-sxm"))


def bubble(stages, microbatches, schedule="1f1b", virtual=1):
    g = PipelineParallel(stages, microbatches, schedule, virtual).run(uniform_model())
    return estimate(g, "h100-sxm").pipeline["bubble_fraction"], g


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_bubble_matches_the_formula_for_balanced_stages(schedule):
    p, m = 8, 32
    measured, _ = bubble(p, m, schedule)
    assert measured == pytest.approx((p - 1) / (m + p - 1), rel=0.01)


def test_interleaving_divides_the_bubble_by_the_virtual_stages():
    p, m, v = 4, 8, 2
    one, _ = bubble(p, m, "1f1b")
    two, _ = bubble(p, m, "interleaved", v)
    # Megatron-LM (Narayanan et al., SC'21): bubble time (p-1)(tf+tb)/v
    assert two == pytest.approx(((p - 1) / v) / (m + (p - 1) / v), rel=0.02)
    assert two < one


@pytest.mark.parametrize("split", ["layers", "time"])
def test_uneven_layers_over_interleaved_chunks_keep_the_devices_even(split):
    """126 layers over 16 devices x 7 chunks (Llama-3.1-405B's depth at PP 16, VP 7) do
    not divide. Equal-time cuts put every longer chunk on the same device (twice the mean;
    a bubble of 0.8 of the ideal time); the layout kept gives every device 7 or 8 layers
    and a bubble within 3x the closed form (p-1)/(v m)."""
    from collections import defaultdict

    p, m, v = 16, 32, 7
    g = PipelineParallel(p, m, "interleaved", v, split, hardware="h100-sxm").run(
        uniform_model(126))
    work: dict = defaultdict(float)
    for n in g.nodes:
        work[n.device] += n.flops * n.repeat
    assert max(work.values()) / min(work.values()) == pytest.approx(8 / 7)
    assert estimate(g, "h100-sxm").pipeline["bubble_over_ideal"] < 3 * (p - 1) / (v * m)


def test_interleaved_layouts_agree_when_the_layers_divide():
    from flint.passes.pipeline_balance import interleaved_cuts

    assert interleaved_cuts([1.0] * 64, 32, 8) == list(range(2, 64, 2))


@pytest.mark.parametrize("schedule,p,m,v", [("gpipe", 4, 8, 1), ("1f1b", 4, 8, 1),
                                            ("interleaved", 2, 48, 2)])
def test_bubble_is_the_schedules_and_communication_wait_is_separate(schedule, p, m, v):
    g = PipelineParallel(p, m, schedule, v).run(uniform_model(4 * v))
    pipe = estimate(g, "h100-sxm").pipeline
    # closed form: bubble time over ideal time (p-1)/(v*m) (Narayanan et al., SC'21)
    assert pipe["bubble_over_ideal"] == pytest.approx((p - 1) / (v * m), abs=0.01)
    # the activations cross nodes over the NIC: that wait is not bubble
    assert sum(pipe["comm_wait_s"]) > 0
    assert pipe["comm_wait_fraction"] < 0.05


def test_pipeline_graph_structure():
    p, m = 4, 6
    _, g = bubble(p, m)
    base = uniform_model()
    assert g.total_flops() == pytest.approx(m * base.total_flops())
    assert g.cluster.devices == p and g.cluster.mesh[0] == ("pipe", p)
    sends = [n for n in g.nodes if n.kind == NodeKind.SEND]
    recvs = [n for n in g.nodes if n.kind == NodeKind.RECV]
    # per microbatch: activations forward and gradients backward across 3 boundaries
    assert len(sends) == len(recvs) == m * 2 * (p - 1)
    for r in recvs:
        (s,) = r.inputs
        assert g.nodes[s].kind == NodeKind.SEND
        assert g.nodes[s].meta["device"] != r.meta["device"]
        assert g.nodes[s].collective.bytes_in == r.collective.bytes_in == 2 * 1024 * 1024
    for n in g.nodes:   # data never crosses devices except through SEND -> RECV
        for i in n.inputs:
            assert g.nodes[i].meta["device"] == n.meta["device"] or n.kind == NodeKind.RECV
    # device 0 runs the 1F1B order: p-1 warm-up forwards, then alternation
    seq = []
    for n in g.nodes:
        if n.meta["device"] == 0 and n.kind == NodeKind.COMPUTE:
            key = (n.meta["task"], n.meta["microbatch"])
            if not seq or seq[-1] != key:
                seq.append(key)
    assert seq == [(t, k) for t, k, _ in device_order("1f1b", p, m)[0]]
    g.check()


def test_schedules_and_memory():
    p, m = 4, 8
    _, gpipe = bubble(p, m, "gpipe")
    _, one = bubble(p, m, "1f1b")
    # GPipe keeps every microbatch's activations; 1F1B at most p on the first stage
    assert estimate(gpipe, "h100-sxm").memory_bytes > estimate(one, "h100-sxm").memory_bytes
    orders = device_order("interleaved", 4, 8, 2)
    assert all(len(o) == 2 * 8 * 2 for o in orders)
    assert {c for _, _, c in orders[1]} == {1, 5}


def test_errors_are_one_line():
    g = uniform_model(4)
    with pytest.raises(FlintError, match="too few"):
        PipelineParallel(8, 8).run(g)
    with pytest.raises(FlintError, match="multiple of the pipeline stages"):
        PipelineParallel(4, 6, "interleaved", 2).run(uniform_model())
    with pytest.raises(FlintError, match="unknown pipeline schedule"):
        PipelineParallel(2, 2, "zigzag").run(g)
    with pytest.raises(FlintError, match="forward and backward"):
        PipelineParallel(2, 2).run(WorkloadGraph(g.cluster, g.nodes[:4], [], [], {}))


def test_parse_pipeline_and_layer_names():
    (p,) = parse_pipeline("pipeline{stages=4,microbatches=8,schedule=gpipe}")
    assert (p.stages, p.microbatches, p.schedule) == (4, 8, "gpipe")
    assert layer_index("layer_12") == 12 and layer_index("model.layers.3.mlp") == 3
    assert layer_index("params['layers']['layer_7']['wq']") == 7
    assert layer_index("head") is None and layer_index("embed") is None


def test_placement_inserts_transfers_and_splits_memory():
    g = uniform_model(8)
    devices = [min(int(n.meta["layer"].split("_")[1]) // 2, 3) for n in g.nodes]
    placed = apply_placement(g, devices, 4)
    e = estimate(placed, "h100-sxm")
    assert len(e.memory["per_device_bytes"]) == 4
    assert sum(n.kind == NodeKind.SEND for n in placed.nodes) == 6
    # no microbatches: the devices run one after another, so the step is the serial time
    serial = estimate(g, "h100-sxm").step_time_s
    assert e.step_time_s == pytest.approx(serial, rel=0.01)
    with pytest.raises(FlintError, match="outside"):
        apply_placement(g, [5] * len(g.nodes), 4)


def test_real_graph_pipeline(tiny_unrolled):
    """The tiny zoo model's real step (unrolled): stages by layer, the optimizer once."""
    g = tiny_unrolled
    tasks = task_of(g)
    assert {"F", "B", "post"} <= set(tasks)
    pg = PipelineParallel(2, 4, "1f1b").run(g)
    per_mb = sum(g.nodes[i].flops for i, t in enumerate(tasks) if t in "FB")
    once = sum(g.nodes[i].flops for i, t in enumerate(tasks) if t not in "FB")
    assert pg.total_flops() == pytest.approx(4 * per_mb + once)
    e = estimate(pg, "h100-sxm")
    assert 0 < e.pipeline["bubble_fraction"] < 1
    assert e.mfu is not None and e.mfu > 0
    # no stage sends another a large value it could make itself (weight casts, zero
    # buffers; XLA's shared RoPE tables, a few KiB, still travel)
    for n in pg.nodes:
        if n.kind == NodeKind.SEND and n.collective.bytes_in > 2**16:
            assert g.nodes[pg.nodes[n.inputs[0]].meta["template"]].inputs


@pytest.fixture(scope="module")
def tiny_unrolled():
    """The tiny zoo model's step, 2 layers unrolled, data-parallel over 2 devices."""
    from flint.template_cache import extract_program

    return extract_program({"framework": "jax", "model": "tiny", "devices": 2,
                            "mesh": [["data", 2]], "batch_per_replica": 2, "remat": "none",
                            "sequence_parallel": False, "scan": False, "seq_len": 0,
                            "layers": 0, "hardware": "h100-sxm"})


def test_data_parallel_gradients_are_reduced_once_per_step(tiny_unrolled):
    """Gradient accumulation over microbatches, one data-parallel reduction per parameter
    per step, inside the last microbatch's backward (Megatron-LM, XLA)."""
    g = tiny_unrolled
    tasks = task_of(g)
    reductions = [n for n, t in zip(g.nodes, tasks) if t == "R" and n.collective is not None]
    assert reductions and all(n.collective.type in ("all-reduce", "reduce-scatter")
                              for n in reductions)
    # the template reduces every parameter's gradient once (XLA combines them into a few
    # all-reduces, some in bf16; the loss rides along): elements reduced = parameters
    params = sum(b for name, b in g.meta["arguments"] if name.startswith("params")) // 4
    reduced = sum(parse_shape(s).num_elements for n in reductions for s in n.outputs)
    assert params <= reduced <= params + 8
    m = 4
    pg = PipelineParallel(2, m, "1f1b").run(g)
    piped = [n for n in pg.nodes if n.meta.get("task") == "R" and n.collective is not None]
    assert sorted(n.meta["template"] for n in piped) == sorted(n.id for n in reductions)
    assert {n.meta["microbatch"] for n in piped} == {m - 1}
    per_mb_collectives = [n for n in pg.nodes if n.collective is not None
                          and n.meta.get("task") == "B"]
    assert all(n.meta["template"] not in {r.id for r in reductions} for n in per_mb_collectives)
    # each reduction starts after its gradient's last-microbatch producer: inside the last
    # backward, overlapping it, not after the pipeline has drained
    e = estimate(pg, "h100-sxm")
    last_b = max(f for n, f in zip(pg.nodes, e.timeline.finish)
                 if n.meta.get("task") == "B" and n.meta["device"] == 0)
    first_r = min(s for n, s in zip(pg.nodes, e.timeline.start)
                  if n in piped and n.meta["device"] == 0)
    assert first_r < last_b




def test_stage_boundaries_use_the_link_they_cross():
    """2 devices per stage, 8 per host: stages 0-3 share host 0, stage 4 is on host 1."""
    base = uniform_model(8)
    base.cluster = Cluster(2, (("model", 2),), "h100-sxm")
    g = PipelineParallel(8, 8, "1f1b").run(base)
    e = estimate(g, "h100-sxm")
    durations = {}
    for n, s, f in zip(g.nodes, e.timeline.start, e.timeline.finish):
        if n.kind == NodeKind.SEND and n.meta["task"] == "p2p":
            (user,) = [u for u in g.users[n.id]]
            durations[(n.meta["device"], g.nodes[user].meta["device"])] = f - s
    nvlink, nic = durations[(0, 1)], durations[(3, 4)]
    assert durations[(2, 3)] == pytest.approx(nvlink) and nic > 2 * nvlink


def test_layer_template_rebuilds_the_whole_model(tiny_unrolled):
    """Two extracted layers stand for four: the step, its flops-free layer nodes priced
    from the template, within a few percent of the 4-layer extraction, pipelined alike."""
    from flint.passes.layer_template import LayerTemplate
    from flint.template_cache import extract_program

    four = extract_program({"framework": "jax", "model": "tiny", "devices": 2,
                            "mesh": [["data", 2]], "batch_per_replica": 2, "remat": "none",
                            "sequence_parallel": False, "scan": False, "seq_len": 0,
                            "layers": 4, "hardware": "h100-sxm"})
    (template,) = parse_pipeline("layer-template{layers=4,bucket_bytes=30MiB}")
    layered = template.run(tiny_unrolled)
    assert "template" in layered.meta["layer_template"]
    assert sum(n.name.startswith("fwd.layer_") for n in layered.nodes) == 4
    params = {name for name, _ in four.meta["arguments"]}
    assert {name for name, _ in layered.meta["arguments"]} == params
    full, templ = estimate(four, "h100-sxm"), estimate(layered, "h100-sxm")
    assert templ.step_time_s == pytest.approx(full.step_time_s, rel=0.1)
    a = estimate(PipelineParallel(2, 4).run(four), "h100-sxm").step_time_s
    b = estimate(PipelineParallel(2, 4).run(layered), "h100-sxm").step_time_s
    assert b == pytest.approx(a, rel=0.15)
    with pytest.raises(FlintError, match="at least 2"):
        LayerTemplate(4).run(uniform_model(1))


def test_reductions_held_to_the_flush_wait_for_their_own_stage():
    """overlap_grad_reduce=False (DeepSpeed's PipelineEngine reduces after the flush): each
    stage's gradient reductions start after that stage's own last backward, and holding
    them adds no transfer between stages (they wait by a control edge, not by data from
    the embedding's stage)."""
    from flint.engine import predict
    from flint.run import TrainingRun

    def run(overlap):
        r = TrainingRun(model="llama3-8b", seq_len=1024, devices=16, tp=2, pp=4,
                        micro_batch=1, global_batch=16, hardware="h100-sxm",
                        overlap_grad_reduce=overlap)
        return predict(r, timeline=True)

    held, overlapped = run(False), run(True)
    for p in (held, overlapped):
        tl = p.estimate.timeline
        assert sum(n.kind in (NodeKind.SEND, NodeKind.RECV) for n in tl.graph.nodes) == sum(
            n.kind in (NodeKind.SEND, NodeKind.RECV)
            for n in overlapped.estimate.timeline.graph.nodes)
    tl = held.estimate.timeline
    g = tl.graph
    for dev in range(4):
        last_b = max(f for i, f in enumerate(tl.finish) if tl.device[i] == dev
                     and g.nodes[i].meta.get("task") == "B" and g.nodes[i].collective is None)
        grads = [tl.start[i] for i, n in enumerate(g.nodes) if tl.device[i] == dev
                 and n.meta.get("after_backward")]
        assert grads and min(grads) >= last_b - 1e-9
    tl = overlapped.estimate.timeline
    g = tl.graph
    last_b = max(f for i, f in enumerate(tl.finish) if tl.device[i] == 0
                 and g.nodes[i].meta.get("task") == "B" and g.nodes[i].collective is None)
    assert min(tl.start[i] for i, n in enumerate(g.nodes) if tl.device[i] == 0
               and n.meta.get("task") == "R" and n.collective is not None) < last_b


def test_work_on_reduced_gradients_waits_for_the_optimizer_outside_xla():
    """The cast and scaling of a reduced gradient bucket run with the optimizer step for
    Megatron (and PyTorch's DDP/FSDP2), so the in-order compute stream never waits for a
    data-parallel reduction mid-backward; XLA keeps them where its schedule put them.
    Across hosts (4 GPUs per host: DP crosses the network) the deferral is faster."""
    from flint.engine import _cache, _retargeted, layered_graph, stage_program
    from flint.passes.kernel_population import KernelPopulation
    from flint.passes.layer_template import LayerTemplate
    from flint.run import TrainingRun

    llama6 = {"base": "llama3-8b", "layers": 6, "seq": 2048, "vocab": 32000}
    for framework in ("megatron", "xla"):
        run = TrainingRun(model=llama6, devices=32, tp=2, pp=2, global_batch=64,
                          devices_per_host=4, framework=framework, zero=0)
        g, _ = layered_graph(run, _cache(None))
        red = [n for n in g.nodes if n.name.startswith("red.")]
        assert red and {n.meta["phase"] for n in red} == (
            {"optimizer"} if framework == "megatron" else {"backward"})
    stage = KernelPopulation("megatron").run(_retargeted(run, _cache(None).get(
        stage_program(run))[0]))
    step = {defer: estimate(PipelineParallel(2, 4).run(LayerTemplate(
        6, defer_reduced_work=defer).run(stage)), "h100-sxm", ["devices_per_node=4",
                                                            "scale_up_domain=4"]).step_time_s
        for defer in (True, False)}
    assert step[True] < step[False]
