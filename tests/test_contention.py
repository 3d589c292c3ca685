"""Collectives slowed by the compute beside them (hardware_models/contention.py): HBM
serves a kernel's loads and NCCL's without priority, so a collective beside a
memory-bound kernel moves at its demand's share; beside a GEMM it keeps its speed."""
from __future__ import annotations

import pytest

from flint.cluster import Cluster
from flint.graph import Collective, Communicator, Node, NodeKind, WorkloadGraph
from flint.hardware_models.contention import contended
from flint.hardware_models.estimate import estimate


def _step(kind: str) -> WorkloadGraph:
    """An all-gather issued first, one kernel of `kind` beside it, and its consumer."""
    cluster = Cluster(8, (("fsdp", 8),), "h100-sxm")
    comms = [Communicator(0, "groups", "[1,8]<=[8]", 8, 8, 1, ("fsdp",))]
    ag = Node(0, "all-gather-start", NodeKind.COLLECTIVE, "all-gather", "collective",
              collective=Collective("all-gather", 0, 64 << 20, 512 << 20, "bf16", None, True))
    if kind == "stream":
        work = Node(1, "add", NodeKind.COMPUTE, "add", "elementwise", bytes_read=4e9,
                    bytes_written=2e9)
    else:
        work = Node(1, "dot", NodeKind.COMPUTE, "dot", "gemm", flops=2.0 * 8192 ** 3,
                    operands=["bf16[8192,8192]"], outputs=["bf16[8192,8192]"])
    use = Node(2, "use", NodeKind.COMPUTE, "copy", "elementwise", inputs=[0, 1],
               bytes_read=1e3, bytes_written=1e3)
    return WorkloadGraph(cluster, [ag, work, use], comms, [], {})


def test_a_collective_beside_a_memory_bound_kernel_is_lengthened_by_its_share():
    ag, work = 1.0, 3.0            # the kernel covers the collective's whole length
    slow = {}

    def comm_slowdown(comm, node):
        slow[node.name] = 1.25 if node.op_class == "elementwise" else 1.0
        return slow[node.name]

    g = _step("stream")
    tl = contended(g, [ag, work, 0.1], None, comm_slowdown)
    assert tl.finish[0] - tl.start[0] == pytest.approx(ag * 1.25)
    assert tl.finish[2] == pytest.approx(work + 0.1)      # still hidden behind the kernel
    # the same collective beside a GEMM keeps its length
    tl = contended(_step("gemm"), [ag, work, 0.1], None, comm_slowdown)
    assert tl.finish[0] - tl.start[0] == pytest.approx(ag)
    # exposed: a short kernel overlaps a fifth of it, which costs a quarter of that
    tl = contended(g, [ag, 0.2, 0.1], None, comm_slowdown)
    assert tl.finish[0] == pytest.approx(ag + 0.2 * 0.25)
    assert tl.finish[2] == pytest.approx(ag + 0.05 + 0.1)


def test_the_cost_model_lengthens_a_collective_beside_a_streaming_kernel():
    """Through the default cost model: the all-gather beside a memory-bound kernel runs by
    the cost model's comm_slowdown (> 1), beside a GEMM as priced alone."""
    from flint.hardware_models.cost_model import default_cost_model

    for kind, slower in (("stream", True), ("gemm", False)):
        g = _step(kind)
        est = estimate(g, "h100-sxm")
        tl = est.timeline
        model = default_cost_model(g, "h100-sxm")
        alone = model.node_time(g.nodes[0], g)
        ran = tl.finish[0] - tl.start[0]
        overlap = min(tl.finish[0], tl.finish[1]) - max(tl.start[0], tl.start[1])
        assert overlap > 0
        if slower:
            f = model.comm_slowdown(g.nodes[0], g.nodes[1])
            assert f > 1.1
            assert ran == pytest.approx(alone * f, rel=1e-6)   # the kernel covers it all
        else:
            assert ran == pytest.approx(alone, rel=1e-9)
