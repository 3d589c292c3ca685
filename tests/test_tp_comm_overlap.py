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


def test_a_gather_read_through_an_fp8_cast_and_its_layout_copy_is_pipelined():
    """XLA writes an FP8 cast of the gathered input and its transposed copy as two fusions
    (Transformer Engine makes both copies of the local shard before gathering): the GEMM
    behind the copy is chunked with the cast and the copy, the ring steps carry FP8 bytes,
    the amax runs on the local shard, and the work is conserved."""
    from flint.cluster import Cluster
    from flint.graph import Collective, Communicator, Node, NodeKind, WorkloadGraph
    from flint.passes.tp_comm_overlap import TpCommOverlap

    def node(i, name, op_class, inputs, outputs, **kw):
        return Node(i, name, NodeKind.COMPUTE, "fusion", op_class, inputs, outputs=outputs,
                    meta={"phase": kw.pop("phase", "forward")}, **kw)

    ag = Collective("all-gather", 0, 2 * 256 * 64 * 2, 2 * 1024 * 64 * 2, "bf16", None, True)
    nodes = [
        node(0, "norm", "elementwise", [], ["bf16[2,256,64]"], bytes_read=65536),
        Node(1, "all-gather", NodeKind.COLLECTIVE, "all-gather", "collective", [0],
             outputs=["bf16[2,1024,64]"], collective=ag, meta={"phase": "forward"}),
        node(2, "amax", "reduction", [1], ["f32[]"], bytes_read=262144),
        node(3, "cast", "elementwise", [1, 2], ["f8e4m3fn[1024,2,64]"], bytes_read=262144),
        node(4, "copy", "data_movement", [3], ["f8e4m3fn[2,1024,64]"], bytes_read=131072),
        node(5, "qkv", "gemm", [4], ["bf16[2048,192]"], flops=2 * 2048 * 64 * 192),
        node(6, "dgrad", "gemm", [5], ["bf16[2048,64]"], flops=2 * 2048 * 64 * 192,
             phase="backward"),
    ]
    comm = Communicator(0, "groups", "{{0,1,2,3}}", 4, 4, 1, ("model",))
    graph = WorkloadGraph(Cluster(4, (("model", 4),), "h100-sxm", devices_per_host=4),
                          nodes, [comm], [], {})
    out = TpCommOverlap().run(graph)
    names = [n.name for n in out.nodes]
    assert [f"{x}.chunk{j}" in names for x in ("cast", "copy", "qkv") for j in range(4)] \
        == [True] * 12
    steps = [n for n in out.nodes if n.meta.get("tp_comm_overlap")]
    assert len(steps) == 3 and {n.collective.bytes_in for n in steps} == {1024 * 2 * 64 // 4}
    amax = next(n for n in out.nodes if n.name == "amax")
    assert out.nodes[amax.inputs[0]].name == "norm" and amax.bytes_read == 262144 / 4
    assert sum(n.flops for n in out.nodes) == sum(n.flops for n in nodes)
    qkv = [n for n in out.nodes if n.name.startswith("qkv.chunk")]
    assert all(out.nodes[i].name.startswith("copy.chunk") for n in qkv for i in n.inputs)
