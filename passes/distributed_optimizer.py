"""Megatron's distributed optimizer (ZeRO-1) on a step whose gradients are all-reduced.

With `--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather`
(Megatron-LM; the default of NeMo/Megatron-Bridge recipes and of NVIDIA's MLPerf
submissions), each data-parallel rank owns 1/DP of the optimizer state:

- the once-per-step gradient all-reduce becomes a reduce-scatter (each rank receives the
  summed gradient of its shard), still overlapped with the last microbatch's backward;
- the rank updates only its shard (the optimizer's work divides by DP);
- the updated parameters are all-gathered in the compute dtype (bf16), bucket by bucket,
  overlapped with the next step's forward: here, an all-gather per reduced bucket at the
  start of the step that the bucket's first forward use waits for.

Contract: input a loop-free graph; every all-reduce of a gradient once per step (task R
of `pipeline_stages.task_of`) over data-parallel axes only becomes a reduce-scatter of
the same input bytes; one all-gather per such bucket is added before all other nodes
(ids shift by their count) and feeds the first forward node of the bucket's layer;
optimizer nodes of that layer carrying recorded times (layer templates) are divided by
the group size. Other nodes are unchanged. Raises FlintError on a graph with loops.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from flint.errors import FlintError
from flint.graph import Collective, Node, NodeKind, WorkloadGraph
from flint.passes.pipeline_stages import DATA_PARALLEL_AXES, task_of

PARAMETER_BYTES = 2      # parameters are gathered in the compute dtype (bf16)
_DTYPE_BYTES = {"f32": 4, "bf16": 2, "f16": 2, "f64": 8}


@dataclass(frozen=True)
class DistributedOptimizer:
    name: ClassVar[str] = "distributed-optimizer"

    def run(self, graph: WorkloadGraph) -> WorkloadGraph:
        if graph.loops:
            raise FlintError("distributed-optimizer needs a loop-free graph "
                             "(run expand-loops first)")
        tasks = task_of(graph)
        buckets = [n for n in graph.nodes if _gradient_all_reduce(graph, n, tasks[n.id])]
        if not buckets:
            return graph
        first_forward: dict[str, int] = {}
        for n in graph.nodes:
            if tasks[n.id] == "F":
                first_forward.setdefault(n.meta.get("layer", ""), n.id)
        k = len(buckets)
        gathers, feeds = [], {}
        for j, n in enumerate(buckets):
            c = n.collective
            group = graph.communicators[c.communicator].size
            params = c.bytes_in * PARAMETER_BYTES // _DTYPE_BYTES.get(c.dtype, 4)
            gathers.append(Node(j, f"param-all-gather.{n.name}", NodeKind.COLLECTIVE,
                                "all-gather", "collective", [], outputs=[f"bf16[{params // 2}]"],
                                collective=Collective("all-gather", c.communicator,
                                                      params // group, params, "bf16",
                                                      None, True),
                                meta={"layer": n.meta.get("layer", ""),
                                      "distributed_optimizer": "param-gather"}))
            target = first_forward.get(n.meta.get("layer", ""))
            if target is not None:
                feeds.setdefault(target, []).append(j)
        group_of = {n.meta.get("layer", ""): graph.communicators[n.collective.communicator].size
                    for n in buckets}
        reduced = {n.id for n in buckets}
        nodes = list(gathers)
        for n in graph.nodes:
            node = replace(n, id=n.id + k, inputs=[i + k for i in n.inputs] + feeds.get(n.id, []),
                           control=[i + k for i in n.control])
            if n.id in reduced:
                group = graph.communicators[n.collective.communicator].size
                node.op = "reduce-scatter"
                node.collective = replace(n.collective, type="reduce-scatter",
                                          bytes_out=n.collective.bytes_in // group)
                node.meta = dict(n.meta, distributed_optimizer="grad-reduce-scatter")
            elif n.collective is not None and n.collective.window is not None:
                lo, hi = n.collective.window
                node.collective = replace(n.collective, window=(lo + k, hi + k))
            if tasks[n.id] == "post" and "recorded_s" in n.meta \
                    and n.meta.get("layer", "") in group_of:
                node.meta = dict(n.meta, recorded_s=n.meta["recorded_s"]
                                 / group_of[n.meta.get("layer", "")])
            nodes.append(node)
        out = replace(graph, nodes=nodes,
                      meta=dict(graph.meta, distributed_optimizer=len(buckets)))
        out.check()
        return out


def _gradient_all_reduce(graph: WorkloadGraph, node: Node, task: str) -> bool:
    c = node.collective
    if task != "R" or c is None or c.type != "all-reduce" or c.reduction not in (None, "add"):
        return False
    axes = graph.communicators[c.communicator].mesh_axes
    return bool(axes) and all(a in DATA_PARALLEL_AXES for a in axes)
