"""Two Megatron-Core + Transformer Engine behaviours the extracted step does not show as
they run: the distributed optimizer's parameter gathers prefetched in forward order
(passes.distributed_optimizer gather=prefetch) and FP8 amaxes reduced over the
tensor-parallel group at most (passes.amax_scope)."""
from __future__ import annotations

import os

import pytest

from conftest import LLAMA6, prediction_text
from flint.errors import FlintError
from flint.graph import Collective, Communicator, Node, NodeKind, WorkloadGraph
from flint.run import TrainingRun


def _gathers(p):
    tl = p.estimate.timeline
    return tl, [i for i, n in enumerate(tl.graph.nodes)
                if n.meta.get("distributed_optimizer") == "param-gather"]


def _first_layer_forward(tl) -> int:
    return next(i for i, n in enumerate(tl.graph.nodes) if n.name.startswith("fwd.layer_0"))


def test_megatron_prefetches_parameter_gathers_in_forward_order():
    """Megatron-Core (overlap_param_gather): the gathers run one after another in the
    order the forward uses them, the first layer starts before the last gather is done,
    and only the first micro-batch waits for them. Without the overlap (DeepSpeed's step,
    Megatron without overlap_grad_reduce) every gather is done before the first layer."""
    from flint.engine import predict

    base = dict(model=LLAMA6, devices=16, zero=1, global_batch=64)
    p = predict(TrainingRun(**base), timeline=True)
    tl, gathers = _gathers(p)
    layers = [tl.graph.nodes[i].meta["gathers_for"] for i in sorted(gathers,
                                                                     key=lambda i: tl.start[i])]
    order = [int(x.split("_")[1]) for x in layers if x.startswith("layer_")]
    assert order == sorted(order) and set(order) == set(range(LLAMA6["layers"]))
    assert all(tl.graph.nodes[i].meta.get("microbatch", 0) == 0 for i in gathers)
    first = _first_layer_forward(tl)
    assert tl.start[first] < max(tl.finish[i] for i in gathers)
    assert "one bucket ahead" in prediction_text(p)

    held = predict(TrainingRun(**base, overlap_grad_reduce=False), timeline=True)
    tl, gathers = _gathers(held)
    assert tl.start[_first_layer_forward(tl)] >= max(tl.finish[i] for i in gathers) - 1e-12
    assert "all at the start of the step" in prediction_text(held)
    assert held.step_time_s > p.step_time_s


def test_prefetch_is_megatrons_reduce_scatter_sync_only():
    from flint.passes.distributed_optimizer import DistributedOptimizer

    with pytest.raises(FlintError, match="gather prefetch is Megatron-Core's"):
        DistributedOptimizer(sync="all-reduce", gather="prefetch")
    with pytest.raises(FlintError, match="gather 'soon' is not"):
        DistributedOptimizer(gather="soon")


def _amax_graph() -> WorkloadGraph:
    """A local amax, its all-reduce (max, f32[]) over `axes`, and the cast reading it."""
    from flint.cluster import Cluster

    comms = [Communicator(0, "groups", "{{0,1,2,3}}", 4, 4, 1, ("data", "model")),
             Communicator(1, "groups", "{{0,1},{2,3}}", 4, 2, 2, ("model",)),
             Communicator(2, "groups", "{{0,2},{1,3}}", 4, 2, 2, ("data",))]
    nodes = [Node(0, "amax", NodeKind.COMPUTE, "reduce", "reduction", [],
                  bytes_read=4e6, bytes_written=4, outputs=["f32[]"]),
             Node(1, "amax.tp", NodeKind.COLLECTIVE, "all-reduce", "collective", [0],
                  outputs=["f32[]"], collective=Collective("all-reduce", 0, 4, 4, "f32",
                                                           "maximum", True)),
             Node(2, "amax.dp", NodeKind.COLLECTIVE, "all-reduce", "collective", [0],
                  outputs=["f32[]"], collective=Collective("all-reduce", 2, 4, 4, "f32",
                                                           "maximum", True)),
             Node(3, "cast", NodeKind.COMPUTE, "fusion", "elementwise", [1, 2],
                  bytes_read=4e6, bytes_written=2e6, outputs=["f8e4m3fn[1000000]"]),
             Node(4, "grads", NodeKind.COLLECTIVE, "all-reduce", "collective", [3],
                  outputs=["f32[]"], collective=Collective("all-reduce", 2, 4, 4, "f32",
                                                           "add", True))]
    return WorkloadGraph(Cluster(4, (("data", 2), ("model", 2)), "h100-sxm"), nodes, comms, [],
                         {})


def test_amax_reductions_narrow_to_the_tensor_parallel_group():
    """An amax over data and model keeps the model part; one over data only becomes the
    local amax, which its reader then reads; a sum over data is no amax and stays."""
    from flint.passes.amax_scope import AmaxScope

    out = AmaxScope("model").run(_amax_graph())
    names = [n.name for n in out.nodes]
    assert names == ["amax", "amax.tp", "cast", "grads"]
    tp = out.nodes[1]
    assert out.communicators[tp.collective.communicator].mesh_axes == ("model",)
    assert out.nodes[2].inputs == [0, 1]       # the local amax and the TP-reduced one
    assert out.nodes[3].collective.communicator == 2
    assert out.meta["amax_reductions_removed"] == 1
    # an XLA program's own reductions are not touched where the run says so: keep both
    assert AmaxScope("data,model").run(_amax_graph()).nodes[2].name == "amax.dp"
    with pytest.raises(FlintError, match="keep names no mesh axis"):
        AmaxScope(" , ")


def test_megatron_fp8_amaxes_do_not_cross_data_or_context_ranks():
    """On a Megatron FP8 run the step keeps no amax all-reduce over the data-parallel or
    context-parallel ranks (Transformer Engine scales each shard on its own): the layer
    gets faster; an XLA run keeps its program's reductions."""
    from flint.engine import layered_graph, predict
    from flint.hardware_models.composite import template_of
    from flint.passes.amax_scope import is_amax_reduction
    from flint.template_cache import TemplateCache

    cache = TemplateCache(os.environ["FLINT_CACHE"])

    def amax_axes(run):
        graph, _ = layered_graph(run, cache)
        t = template_of(graph)
        return {t.communicators[n.collective.communicator].mesh_axes
                for n in t.nodes if is_amax_reduction(n)}

    base = dict(model=LLAMA6, devices=16, cp=2, tp=2, precision="fp8", global_batch=16)
    megatron = amax_axes(TrainingRun(**base))
    assert "tensor-parallel group where the tensor is gathered" in prediction_text(
        predict(TrainingRun(**base)))
    assert megatron and all(set(a) <= {"model"} for a in megatron)
    xla = amax_axes(TrainingRun(**base, framework="xla"))
    assert any({"data", "context"} & set(a) for a in xla)


def test_interleaved_schedule_gathers_a_chunk_at_once_ahead_of_its_forward():
    """Megatron's interleaved schedule aligns the gathers across stages: a device's first
    two model chunks gather at the start of the step, each chunk's buckets at once in
    the gradients' order (last layer first), so the second chunk's are done before its
    first forward."""
    from flint.engine import predict

    run = TrainingRun(model=dict(LLAMA6, layers=8), devices=16, pp=2, vp=2, zero=1,
                      global_batch=32)
    tl, gathers = _gathers(predict(run, timeline=True))
    g = tl.graph
    mine = sorted((i for i in gathers if tl.device[i] == 0), key=lambda i: tl.start[i])
    chunks = [g.nodes[i].meta["chunk"] for i in mine]
    assert chunks == sorted(chunks) and len(set(chunks)) == 2
    first = [int(g.nodes[i].meta["gathers_for"].split("_")[1]) for i in mine
             if g.nodes[i].meta["chunk"] == chunks[0]
             and g.nodes[i].meta["gathers_for"].startswith("layer_")]
    assert first == sorted(first, reverse=True)
    second = [i for i in mine if g.nodes[i].meta["chunk"] == chunks[-1]]
    forward = min(tl.start[i] for i, n in enumerate(g.nodes) if tl.device[i] == 0
                  and n.meta.get("chunk") == chunks[-1] and n.name.startswith("fwd."))
    assert max(tl.finish[i] for i in second) <= forward
