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

Memory, as Megatron-Core's distributed-optimizer guide counts it for bf16 parameters with
fp32 gradients: 6 + 12/d bytes per parameter (d: the data-parallel size) instead of 18.
The extracted step holds f32 parameters (4 B) and Adam's two f32 moments (8 B): the
parameter arguments stand for the fp32 main-gradient buffer (4 B), the gathered bf16
parameters are a buffer of their own kept for the whole step (2 B, an argument per
bucket: `params/<layer>/bf16`), and the moments become the rank's shard of
fp32 main parameters and moments: x 12/8 / d, with d the group of the buckets that
reduce those parameters, by their share of the parameters (a MoE model's experts reduce
over the expert-data-parallel group, its dense weights over the whole data-parallel
group; experts no bucket reduces keep their whole state).

Contract: input a loop-free graph; every all-reduce of a gradient once per step (task R
of `pipeline_stages.task_of`) over data-parallel axes only becomes a reduce-scatter of
the same input bytes; one all-gather per such bucket is added before all other nodes
(ids shift by their count) and feeds the first forward node of the bucket's layer;
optimizer nodes of that layer that stand for a template block (layer templates) have
their scale divided by the group size; the optimizer-state arguments shrink as above (meta["arguments"]).
Other nodes are unchanged. Raises FlintError on a graph with loops.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from flint.errors import FlintError
from flint.graph import Collective, Node, NodeKind, WorkloadGraph
from flint.passes.pipeline_stages import DATA_PARALLEL_AXES, task_of

PARAMETER_BYTES = 2      # parameters are gathered in the compute dtype (bf16)
# fp32 main parameters + two fp32 Adam moments (12 B) where the step held the moments (8 B)
STATE_RATIO = 12 / 8
MOMENT_BYTES = 8         # the step's two f32 Adam moments per parameter
_DTYPE_BYTES = {"f32": 4, "bf16": 2, "f16": 2, "f64": 8}


@dataclass(frozen=True)
class DistributedOptimizer:
    # ZeRO-2: the gradients are sharded too, so the fp32 gradient buffer (the parameter
    # arguments stand for it) holds only this rank's 1/d of what the buckets reduce
    shard_gradients: bool = False
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
                                "all-gather", "collective", [], outputs=[],
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
            if tasks[n.id] == "post" and "composite" in n.meta \
                    and n.meta.get("layer", "") in group_of:
                composite = n.meta["composite"]
                node.meta = dict(n.meta, composite=dict(
                    composite, scale=composite["scale"] / group_of[n.meta.get("layer", "")]))
            nodes.append(node)
        arguments = _sharded_state(graph, buckets, self.shard_gradients)
        # the bf16 parameters the all-gathers write: a buffer Megatron keeps for the whole
        # step (forward and backward read it), one per bucket, with the bucket's layer
        copies = [[f"params/{g.meta['layer']}/bf16" if g.meta.get("layer") else
                   "params/bf16", g.collective.bytes_out] for g in gathers]
        # the step's outputs that update those arguments in place shrink with them
        aliased = set(graph.meta.get("aliased_arguments", ()))
        shrunk = sum(old[1] - new[1] for k, (old, new) in
                     enumerate(zip(graph.meta.get("arguments", ()), arguments))
                     if k in aliased)
        meta = dict(graph.meta, distributed_optimizer=len(buckets),
                    arguments=arguments + copies)
        if "output_bytes" in meta:
            meta["output_bytes"] = max(float(meta["output_bytes"]) - shrunk, 0.0)
        out = replace(graph, nodes=nodes, meta=meta)
        out.check()
        return out


def _sharded_state(graph: WorkloadGraph, buckets: list[Node],
                   shard_gradients: bool = False) -> list:
    """meta["arguments"] with every optimizer-state argument at this rank's share. The
    moments (8 B per parameter) stand for the parameters; the buckets' gradients (bytes /
    dtype size) say which share of them is reduced over which group d (per step, not per
    layer: XLA may combine layers' reductions); that share becomes 12/d bytes per
    parameter, the rest (experts whose expert-data-parallel group is one rank) 12 bytes."""
    from flint.hardware_models.memory import argument_category

    state = sum(nbytes for name, nbytes in graph.meta.get("arguments", ())
                if argument_category(str(name)) == "optimizer_state")
    params = state / MOMENT_BYTES
    shares = []
    for n in buckets:
        c = n.collective
        reduced = c.bytes_in / _DTYPE_BYTES.get(c.dtype, 4)
        shares.append((reduced / params if params else 0.0,
                       graph.communicators[c.communicator].size))
    covered = sum(x for x, _ in shares)
    if covered > 1.0:                    # rounding, or more reduced than the moments say
        shares, covered = [(x / covered, d) for x, d in shares], 1.0
    sharded = sum(x / d for x, d in shares) + (1.0 - covered)   # share of a parameter
    factors = {"optimizer_state": STATE_RATIO * sharded,
               "parameters": sharded if shard_gradients else 1.0}
    return [[name, int(round(nbytes * factors.get(argument_category(str(name)), 1.0)))]
            for name, nbytes in graph.meta.get("arguments", ())]


def _gradient_all_reduce(graph: WorkloadGraph, node: Node, task: str) -> bool:
    c = node.collective
    if task != "R" or c is None or c.type != "all-reduce" or c.reduction not in (None, "add"):
        return False
    axes = graph.communicators[c.communicator].mesh_axes
    return bool(axes) and all(a in DATA_PARALLEL_AXES for a in axes)
