"""TP communication overlap (passes.tp_comm_overlap): the sequence-parallel all-gathers and
reduce-scatters of a Megatron-style layer pipelined with their GEMMs, work conserved."""
from __future__ import annotations

import pytest

from flint.run import TrainingRun

LLAMA3 = {"base": "llama3-8b", "layers": 3, "seq": 2048, "vocab": 32000}


@pytest.fixture(scope="module")
def template():
    from flint import engine
    from flint.passes.expand_loops import ExpandLoops

    run = TrainingRun(model=LLAMA3, devices=8, tp=8, global_batch=1)
    graph, _ = engine._cache(None).get(engine.stage_program(run))
    return ExpandLoops().run(graph)


def test_overlap_keeps_the_work_and_hides_communication(template):
    from flint.hardware_models.estimate import estimate
    from flint.passes.tp_comm_overlap import TpCommOverlap

    out = TpCommOverlap().run(template)
    assert out.meta["tp_comm_overlap"] >= 12          # 4 per layer at least
    assert sum(n.flops for n in out.nodes) == pytest.approx(sum(n.flops for n in template.nodes))
    steps = [n for n in out.nodes if n.meta.get("tp_comm_overlap")]
    assert steps and all(n.collective.type == "collective-permute" for n in steps)
    chunks = [n for n in out.nodes if n.meta.get("gemm_split")]
    assert chunks and all(n.meta["gemm_split"] == 8 for n in chunks)
    a, b = estimate(template, "h100-sxm"), estimate(out, "h100-sxm")
    print(f"step {a.step_time_s * 1e3:.3f} -> {b.step_time_s * 1e3:.3f} ms, exposed "
          f"communication {a.exposed_communication_s * 1e3:.3f} -> "
          f"{b.exposed_communication_s * 1e3:.3f} ms")
    assert b.exposed_communication_s < a.exposed_communication_s
    assert b.step_time_s < a.step_time_s


def test_run_default_and_refusal():
    from flint.errors import FlintError

    assert TrainingRun(model=LLAMA3, devices=8, tp=8).tp_comm_overlap
    assert not TrainingRun(model=LLAMA3, devices=8, tp=8, framework="xla").tp_comm_overlap
    assert not TrainingRun(model=LLAMA3, devices=8).tp_comm_overlap
    with pytest.raises(FlintError, match="tp_comm_overlap: .* needs tp > 1 and sp"):
        TrainingRun(model=LLAMA3, devices=8, tp=8, sp=False, tp_comm_overlap=True)
