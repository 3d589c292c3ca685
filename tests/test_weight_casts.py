"""Transformer Engine's FP8 weight casts, once per step: Megatron-Core casts each weight in
a step's first micro-batch and reuses it (passes.layer_gathers.weight_casts,
LayerTemplate cast_once), whatever place XLA's schedule gave the cast in the twin's
program; XLA and PyTorch runs cast where their programs do."""
from __future__ import annotations

from conftest import LLAMA6
from flint.graph import Node, NodeKind, WorkloadGraph
from flint.framework_rules import weight_casts_held_for_step
from flint.run import TrainingRun


def _node(i, name, inputs, outputs, operands=(), phase="forward"):
    return Node(i, name, NodeKind.COMPUTE, "fusion", "elementwise", list(inputs),
                outputs=list(outputs), operands=list(operands), meta={"phase": phase})


def test_weight_casts_are_fp8_casts_of_weights_not_of_activations():
    """A cast to FP8 that reads a weight and only a scalar from micro-batch data (XLA fused
    the weight's scale with an activation's) is a weight cast, and so is a parameter-only
    piece of its scale that feeds nothing else; a cast of activations is not, nor is a
    parameter-only value that other work reads."""
    from flint.passes.layer_gathers import weight_casts

    nodes = [
        _node(0, "embed", [], ["bf16[2,8,16]"], ["s32[2,8]", "bf16[64,16]"]),
        _node(1, "act_amax", [0], ["f32[]"]),
        _node(2, "w_amax", [], ["f32[]"], ["f32[16,16]"]),
        _node(3, "scales", [1, 2], ["f32[]", "f32[]"]),             # both scales, fused
        _node(4, "w_piece", [], ["f32[1]"], ["f32[4]"]),
        _node(5, "w_cast", [3, 4], ["f8e4m3fn[16,16]"], ["f32[]", "f32[16,16]", "f32[1]"]),
        _node(6, "x_cast", [0, 3], ["f8e4m3fn[2,8,16]"], ["bf16[2,8,16]", "f32[]"]),
        _node(7, "gemm", [5, 6], ["bf16[2,8,16]"]),
        _node(8, "dgrad", [7], ["bf16[2,8,16]"], phase="backward"),
    ]
    graph = WorkloadGraph(None, nodes, [], [], {})
    tasks = ["F"] * 8 + ["B"]
    assert weight_casts(graph, tasks) == [4, 5]
    assert weight_casts(graph, ["pre"] * 8 + ["B"]) == []     # before the layers already


def test_megatron_fp8_casts_weights_once_per_step(monkeypatch):
    """Megatron-Core FP8 (Transformer Engine) prices no weight cast in a micro-batch's
    layer blocks, says so, and is faster than casting in every micro-batch; XLA,
    PyTorch, bf16 and FSDP runs keep the program's casts."""
    from flint import engine
    from flint.hardware_models.composite import template_of
    from flint.passes.layer_gathers import weight_casts

    run = TrainingRun(model=LLAMA6, devices=8, tp=2, precision="fp8", global_batch=32)
    assert weight_casts_held_for_step(run) and run.microbatches > 1
    assert not weight_casts_held_for_step(TrainingRun(model=LLAMA6, devices=8, tp=2))
    assert not weight_casts_held_for_step(TrainingRun(model=LLAMA6, devices=8, zero=3,
                                                      precision="fp8"))
    assert not weight_casts_held_for_step(TrainingRun(model=LLAMA6, devices=8,
                                                      precision="fp8", framework="xla"))
    once = engine.predict(run)
    assert "first micro-batch" in once.facts["fp8_weight_casts"]
    graph, _ = engine.layered_graph(run, engine._cache(None))
    template = template_of(graph)
    tasks = [n.meta["block"][0] if n.meta["block"][:2] in ("F:", "B:") else "pre"
             for n in template.nodes]
    assert weight_casts(template, tasks) == []
    monkeypatch.setattr(engine, "weight_casts_held_for_step", lambda r: False)
    engine._LAYERED.clear()
    engine._PIPELINED.clear()
    every = engine.predict(run)
    assert every.step_time_s > once.step_time_s
    engine._LAYERED.clear()
    engine._PIPELINED.clear()
