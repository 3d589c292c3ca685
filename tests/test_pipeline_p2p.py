"""How a pipeline stage's sends and receives run beside its compute (passes.pipeline
P2P_MODES, TrainingRun.pipeline_p2p) and the boundary sent as tensor-parallel slices
(scatter_gather, TrainingRun.pipeline_scatter_gather)."""
from __future__ import annotations

import pytest

from conftest import LLAMA6, prediction_text
from flint.cluster import Cluster
from flint.errors import FlintError
from flint.graph import Communicator, NodeKind
from flint.hardware_models.estimate import estimate
from flint.models.synthetic import uniform_layers
from flint.passes.pipeline import PipelineParallel
from flint.run import TrainingRun

# every stage a host of 8 tensor-parallel ranks, so each boundary crosses the NIC, made
# slow enough that transfers show beside the layers' compute
SLOW_NIC = ["nic_bandwidth=2Gb/s"]


def tp8_model(tp_comm: bool = True):
    g = uniform_layers(16, Cluster(8, (("model", 8),), "h100-sxm"))
    if tp_comm:
        g.communicators.append(Communicator(len(g.communicators), "groups",
                                            "{{0,1,2,3,4,5,6,7}}", 8, 8, 1, ("model",)))
    return g


def piped(p2p="posted-ahead", slices=1, stages=4, microbatches=8):
    g = PipelineParallel(stages, microbatches, "1f1b", p2p=p2p,
                         scatter_gather=slices).run(tp8_model())
    g.check()
    return g, estimate(g, "h100-sxm", SLOW_NIC)


def test_blocking_stages_wait_for_their_sends_and_posted_ones_do_not():
    for mode in ("posted-ahead", "blocking", "blocking-serial"):
        g, e = piped(mode)
        t = e.timeline
        sends = [n for n in g.nodes if n.kind == NodeKind.SEND]
        awaited = {c for n in g.nodes if n.kind == NodeKind.COMPUTE for c in n.control
                   if g.nodes[c].kind == NodeKind.SEND}
        if mode == "posted-ahead":
            assert not awaited
            continue
        # every send its stage computes after is awaited by the stage's next step ...
        last_compute = {}
        for n in g.nodes:
            if n.kind == NodeKind.COMPUTE and n.meta.get("task") in ("F", "B"):
                last_compute[n.meta["device"]] = n.id
        later = {s.id for s in sends if last_compute[s.meta["device"]] > s.id}
        assert later and awaited == later
        for n in g.nodes:           # ... which starts only once they have finished
            for c in n.control:
                if c in awaited and n.kind == NodeKind.COMPUTE:
                    assert g.nodes[c].meta["device"] == n.meta["device"]
                    assert t.start[n.id] >= t.finish[c] - 1e-12


def test_serial_transfers_take_turns_and_cost_the_most():
    steps = {mode: piped(mode)[1].step_time_s
             for mode in ("posted-ahead", "blocking", "blocking-serial")}
    assert steps["posted-ahead"] <= steps["blocking"] < steps["blocking-serial"]
    g, e = piped("blocking-serial")
    t = e.timeline
    for dev in range(4):            # one transfer at a time on each stage
        spans = sorted((t.start[n.id], t.finish[n.id]) for n in g.nodes
                       if n.kind == NodeKind.SEND and n.meta["device"] == dev
                       or n.kind == NodeKind.RECV and n.meta["device"] == dev)
        assert {t.stream[n.id] for n in g.nodes if n.kind in (NodeKind.SEND, NodeKind.RECV)
                and n.meta["device"] == dev} == {"p2p"}
        assert all(b[0] >= a[1] - 1e-12 for a, b in zip(spans, spans[1:]))


def test_scatter_gather_sends_slices_and_gathers_them_over_tensor_parallelism():
    whole, e_whole = piped("blocking")
    split, e_split = piped("blocking", slices=8)
    size = {n.collective.bytes_in for n in whole.nodes if n.kind == NodeKind.SEND}
    (full,) = size
    assert {n.collective.bytes_in for n in split.nodes if n.kind == NodeKind.SEND} == {full // 8}
    gathers = [n for n in split.nodes if n.op == "all-gather"]
    recvs = [n for n in split.nodes if n.kind == NodeKind.RECV]
    assert len(gathers) == len(recvs) > 0
    tp = next(c.id for c in split.communicators if c.mesh_axes == ("model",))
    for gather in gathers:
        (recv,) = gather.inputs
        assert split.nodes[recv].kind == NodeKind.RECV
        assert gather.meta["device"] == split.nodes[recv].meta["device"]
        c = gather.collective
        assert (c.communicator, c.bytes_in, c.bytes_out) == (tp, full // 8, full)
        # whoever used the received tensor now reads the gathered one
        assert all(split.nodes[u].kind != NodeKind.COMPUTE for u in split.users[recv]
                   if u != gather.id)
    # an eighth of the bytes over the slow NIC, the gathers over NVLink
    assert e_split.step_time_s < e_whole.step_time_s


def test_pipeline_p2p_options_are_checked():
    with pytest.raises(FlintError, match="unknown p2p 'eager'"):
        PipelineParallel(2, 2, p2p="eager")
    with pytest.raises(FlintError, match="scatter_gather must be >= 1"):
        PipelineParallel(2, 2, scatter_gather=0)
    with pytest.raises(FlintError, match="tensor-parallel communicator of 8 ranks"):
        PipelineParallel(4, 4, scatter_gather=8).run(tp8_model(tp_comm=False))


def test_runs_take_their_frameworks_p2p_and_say_so():
    """megatron's non-interleaved schedules block, its interleaved one posts ahead, the
    torch frameworks post ahead; a changed schedule derives it again."""
    run = TrainingRun(model=LLAMA6, devices=4, pp=2, global_batch=8)
    assert run.pipeline_p2p == "blocking" and not run.pipeline_scatter_gather
    assert run.replace(vp=3, global_batch=12).pipeline_p2p == "posted-ahead"
    assert TrainingRun(model=LLAMA6, devices=4, pp=2, schedule="gpipe",
                       global_batch=8).pipeline_p2p == "blocking"
    assert TrainingRun(model=LLAMA6, devices=4, pp=2, global_batch=8,
                       framework="xla").pipeline_p2p == "posted-ahead"
    kept = run.replace(pipeline_p2p="posted-ahead").replace(vp=3, global_batch=12)
    assert kept.pipeline_p2p == "posted-ahead"
    with pytest.raises(FlintError, match="pipeline_p2p"):
        TrainingRun(model=LLAMA6, devices=4, pp=2, global_batch=8, pipeline_p2p="eager")


def test_engine_prices_each_mode_and_the_sliced_boundary():
    """The engine passes the run's choice to the pipeline pass: TP2 without sequence
    parallelism, two stages on two hosts of a slow fabric."""
    from flint.engine import predict

    base = dict(model=LLAMA6, devices=4, tp=2, sp=False, pp=2, global_batch=8,
                devices_per_host=2)
    step, sent = {}, {}
    for mode in ("posted-ahead", "blocking-serial"):
        for sliced in (False, True):
            p = predict(TrainingRun(**base, pipeline_p2p=mode,
                                    pipeline_scatter_gather=sliced), what_if=SLOW_NIC)
            step[(mode, sliced)] = p.step_time_s
            sent[(mode, sliced)] = p.collectives_s["send"]
            text = " ".join(prediction_text(p).split())
            assert ("DeepSpeed's PipelineEngine" in text) == (mode == "blocking-serial")
            assert ("the boundary as 2 TP slices, all-gathered" in text) == sliced
            # one data-parallel rank: the boundary's gathers are the only all-gathers
            assert ("all-gather" in p.collectives_s) == sliced
    assert step[("blocking-serial", False)] > step[("posted-ahead", False)]
    assert step[("blocking-serial", True)] < step[("blocking-serial", False)]
    for mode in ("posted-ahead", "blocking-serial"):     # half the bytes, half the time
        assert sent[(mode, True)] == pytest.approx(sent[(mode, False)] / 2, rel=0.01)
    # with sequence parallelism each rank already sends its slice: the report says so
    p = predict(TrainingRun(**dict(base, sp=True), pipeline_scatter_gather=True))
    assert "scatter/gather has nothing to slice (SP already sends 1/tp)" in " ".join(
        prediction_text(p).split())
