"""Megatron's distributed optimizer (ZeRO-1) on a step whose gradients are all-reduced.

With `--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather`
(Megatron-LM; the default of NeMo/Megatron-Bridge recipes and of NVIDIA's MLPerf
submissions), each data-parallel rank owns 1/DP of the optimizer state:

- the once-per-step gradient all-reduce becomes a reduce-scatter (each rank receives the
  summed gradient of its shard), still overlapped with the last microbatch's backward;
- the rank updates only its shard (the optimizer's work divides by DP);
- the updated parameters are all-gathered in the compute dtype (bf16), bucket by bucket,
  overlapped with the next step's forward: an all-gather per reduced bucket that the
  bucket's first forward use waits for, issued one bucket ahead in forward order
  (gather "prefetch", `_prefetch_chain`), or all at the start of the step (gather
  "step": DeepSpeed's optimizer step gathers them before the next forward).

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

Gradients reduced in bf16 (option `grad_dtype`): Megatron-Core's
DistributedDataParallelConfig(grad_reduce_in_fp32=False) makes the main-gradient buffer
the parameters' dtype, so the wgrad GEMMs accumulate into bf16 and the buckets are
reduce-scattered in bf16: half the bytes on the wire and 4 + 12/d bytes per parameter.
Megatron-LM's own arguments force fp32 for bf16 runs (arguments.py: "bfloat16 requires
gradient accumulation and all-reduce to be done in fp32"); NVIDIA's performance recipes
turn it off (Megatron-Bridge perf_recipes/_common.py `_perf_precision`: "Always sets
grad_reduce_in_fp32=False"; NeMo 2.0 scripts/performance/helpers.py
`set_precision_configs`). Every gradient bucket is reduced in `grad_dtype` (the
extracted step's reductions are bf16 or f32 per weight, `_in_grad_dtype`), and the
parameter arguments (standing for the main-gradient buffer) are 4 or 2 bytes each.
DeepSpeed's engine communicates gradients in the model's dtype when bf16 is enabled
(engine.py `communication_data_type`), InternEvo reduces them in the model's dtype: bf16.

Two other layouts of the same sharded optimizer (options `group` and `sync`):

- `group` g < d: the state is sharded over groups of g data-parallel ranks and replicated
  across the d/g groups (Megatron-Core's --num-distributed-optimizer-instances d/g,
  InternEvo's zero1=g): each bucket is reduce-scattered inside its group, the shard
  all-reduced across the groups, and the parameters all-gathered inside the group; the
  state is 12/g bytes per parameter.
- `sync="broadcast"` (InternEvo's HybridZeroOptimizer, 2023: internlm/solver/optimizer/
  hybrid_zero_optim.py and utils.reduce_tensor): the gradients stay all-reduced over all d
  ranks (reduce_tensor with no destination rank all-reduces), each rank updates the
  parameters it owns, and every owner broadcasts its updated parameters to its group:
  g broadcasts of 1/g of the bf16 parameters each, one after another on one communicator,
  all waited for before the next forward (`broadcast_params` waits on every handle). Here
  one collective-broadcast node of all the parameters with meta `pieces` = g (the network
  model prices g broadcasts of 1/g). InternEvo keeps and all-reduces its gradients in
  the model's dtype: grad_dtype bf16 says so (f32: Megatron's fp32 main gradients).
- `sync="all-reduce"` (DeepSpeed's BF16_Optimizer, BLOOM's ZeRO-1, 2022): the optimizer
  has no reduce_gradients, so the engine's allreduce_gradients takes its
  buffered_allreduce_fallback on get_grads_for_reduction() (deepspeed/runtime/engine.py):
  the whole fp32 gradients all-reduced in communication_data_type (bf16 when bf16 is
  enabled); each rank updates its partition and all_gather_dp_groups gathers the bf16
  parameters. The buckets stay all-reduces (in `grad_dtype`), one all-gather per bucket
  as Megatron's, whole gradients in an fp32 buffer (`buffer_dtype` f32).

Contract: input a loop-free graph; every all-reduce of a gradient once per step (task R
of `pipeline_stages.task_of`) over data-parallel axes only becomes a reduce-scatter of
the same gradients (in `grad_dtype`); one all-gather per such bucket is added before all
other nodes (ids shift by their count) and feeds the first forward node of the bucket's layer;
optimizer nodes of that layer that stand for a template block (layer templates) have
their scale divided by the group size; the optimizer-state arguments shrink as above (meta["arguments"]).
With gather "prefetch" (Megatron-Core) the gathers are placed in forward order
among the forward nodes instead, each before the previous bucket's first forward node, and
run in the first micro-batch only (meta first_microbatch; `_prefetch_chain`).
Other nodes are unchanged. Raises FlintError on a graph with loops.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from flint.errors import FlintError
from flint.graph import Collective, Communicator, Node, NodeKind, WorkloadGraph
from flint.passes.pipeline_stages import DATA_PARALLEL_AXES, task_of

PARAMETER_BYTES = 2      # parameters are gathered in the compute dtype (bf16)
# fp32 main parameters + two fp32 Adam moments (12 B) where the step held the moments (8 B)
STATE_RATIO = 12 / 8
MOMENT_BYTES = 8         # the step's two f32 Adam moments per parameter
_DTYPE_BYTES = {"f32": 4, "bf16": 2, "f16": 2, "f64": 8}


SYNCS = ("reduce-scatter", "broadcast", "all-reduce")
GRAD_DTYPES = ("f32", "bf16")
GATHERS = ("step", "prefetch")


@dataclass(frozen=True)
class DistributedOptimizer:
    # ZeRO-2: the gradients are sharded too, so the fp32 gradient buffer (the parameter
    # arguments stand for it) holds only this rank's 1/d of what the buckets reduce
    shard_gradients: bool = False
    sync: str = "reduce-scatter"
    group: int = 0               # ranks sharing one copy of the state (0: all of them)
    grad_dtype: str = "f32"      # the main-gradient buffer and its reduction (bf16: half)
    buffer_dtype: str = ""       # the gradient buffer's, where not grad_dtype
    # when the updated parameters are gathered (reduce-scatter sync): "step", all at the
    # start of the step; "prefetch", one bucket ahead of the first micro-batch's forward
    # (Megatron-Core's overlap_param_gather: _prefetch_chain)
    gather: str = "step"
    name: ClassVar[str] = "distributed-optimizer"

    def __post_init__(self):
        if self.sync not in SYNCS:
            raise FlintError(f"distributed-optimizer: sync {self.sync!r} is not "
                             f"{' or '.join(SYNCS)}")
        for name, value in (("grad_dtype", self.grad_dtype),
                            ("buffer_dtype", self.buffer_dtype or self.grad_dtype)):
            if value not in GRAD_DTYPES:
                raise FlintError(f"distributed-optimizer: {name} {value!r} is not "
                                 f"{' or '.join(GRAD_DTYPES)}")
        if self.gather not in GATHERS:
            raise FlintError(f"distributed-optimizer: gather {self.gather!r} is not "
                             f"{' or '.join(GATHERS)}")
        if self.gather == "prefetch" and self.sync != "reduce-scatter":
            raise FlintError(f"distributed-optimizer: gather prefetch is Megatron-Core's "
                             f"(sync reduce-scatter), not sync {self.sync}")
        if self.group < 0:
            raise FlintError("distributed-optimizer: group must be >= 0")
        if self.sync != "reduce-scatter" and self.shard_gradients:
            raise FlintError(f"distributed-optimizer: {self.sync} keeps whole gradients "
                             f"(a ZeRO-1 flavour); it does not shard them")

    def run(self, graph: WorkloadGraph) -> WorkloadGraph:
        if graph.loops:
            raise FlintError("distributed-optimizer needs a loop-free graph "
                             "(run expand-loops first)")
        tasks = task_of(graph)
        buckets = [n for n in graph.nodes if _gradient_all_reduce(graph, n, tasks[n.id])]
        if not buckets:
            return graph
        return _sharded(self, graph, buckets, tasks)


def _sharded_state(graph: WorkloadGraph, buckets: list[Node],
                   shard_gradients: bool = False, groups: dict | None = None,
                   grad_bytes: int = 4) -> list:
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
        d = (groups or {}).get(n.meta.get("layer", "")) or graph.communicators[
            c.communicator].size
        shares.append((reduced / params if params else 0.0, d))
    covered = sum(x for x, _ in shares)
    if covered > 1.0:                    # rounding, or more reduced than the moments say
        shares, covered = [(x / covered, d) for x, d in shares], 1.0
    sharded = sum(x / d for x, d in shares) + (1.0 - covered)   # share of a parameter
    factors = {"optimizer_state": STATE_RATIO * sharded,
               "parameters": (sharded if shard_gradients else 1.0) * grad_bytes / 4}
    return [[name, int(round(nbytes * factors.get(argument_category(str(name)), 1.0)))]
            for name, nbytes in graph.meta.get("arguments", ())]


def _gradient_all_reduce(graph: WorkloadGraph, node: Node, task: str) -> bool:
    c = node.collective
    if task != "R" or c is None or c.type != "all-reduce" or c.reduction not in (None, "add"):
        return False
    axes = graph.communicators[c.communicator].mesh_axes
    return bool(axes) and all(a in DATA_PARALLEL_AXES for a in axes)


# --- the rewrite: shard groups, Megatron's gathers or InternEvo's broadcasts ------------
def _split(graph: WorkloadGraph, comm_id: int, g: int) -> tuple[int, int]:
    """Communicators of g consecutive members of each group of `comm_id` (inside) and of
    the members at the same place in those pieces (across), appended to the graph's;
    a group of all the members is `comm_id` itself, with nothing across (-1)."""
    comm = graph.communicators[comm_id]
    if g == comm.size:
        return comm_id, -1
    if comm.size % g:
        raise FlintError(f"distributed-optimizer: a shard group of {g} ranks does not "
                         f"divide the {comm.size} data-parallel ranks")
    groups = comm.groups()
    inside = groups.reshape(-1, g)
    across = groups.reshape(groups.shape[0], comm.size // g, g).transpose(0, 2, 1).reshape(
        -1, comm.size // g)

    def add(rows) -> int:
        if rows.shape[1] == 1:
            return -1                       # one rank: nothing to talk to
        spec = "{" + ",".join("{" + ",".join(map(str, r)) + "}" for r in rows.tolist()) + "}"
        graph.communicators.append(Communicator(len(graph.communicators), "groups", spec,
                                                comm.num_devices, int(rows.shape[1]),
                                                int(rows.shape[0]), comm.mesh_axes))
        return len(graph.communicators) - 1
    return add(inside), add(across)


def _sharded(opt: DistributedOptimizer, graph: WorkloadGraph, buckets: list,
             tasks) -> WorkloadGraph:
    """The step with its gradient buckets `buckets` synced as `opt` says (module
    docstring)."""
    graph = replace(graph, communicators=list(graph.communicators))
    split: dict[int, tuple[int, int]] = {}
    group_of: dict[str, int] = {}         # a layer's shard group (its state, its update)
    g_of: dict[int, int] = {}             # a bucket's
    for n in buckets:
        c = n.collective
        size = graph.communicators[c.communicator].size
        g = g_of[n.id] = min(opt.group or size, size)
        if c.communicator not in split:
            split[c.communicator] = _split(graph, c.communicator, g)
        group_of[n.meta.get("layer", "")] = g
    first_forward: dict[str, int] = {}
    for n in graph.nodes:
        if tasks[n.id] == "F":
            first_forward.setdefault(n.meta.get("layer", ""), n.id)
    head: list[Node] = []                 # the parameter sync, before every other node
    feeds: dict[int, list[int]] = {}
    before: dict[int, list[tuple[Node, int]]] = {}   # prefetched (gather, reader), by node
    if opt.sync == "broadcast":
        # one broadcast node per data-parallel group the buckets reduce over (a MoE
        # model's experts over their own), standing for its g owners' broadcasts
        by_comm: dict[int, list[Node]] = {}
        for n in buckets:
            by_comm.setdefault(n.collective.communicator, []).append(n)
        for comm, members in sorted(by_comm.items()):
            g = g_of[members[0].id]
            params = sum(n.collective.bytes_in * PARAMETER_BYTES // _DTYPE_BYTES.get(
                n.collective.dtype, 4) for n in members)
            head.append(Node(len(head), f"param-broadcast.{comm}", NodeKind.COLLECTIVE,
                             "collective-broadcast", "collective", [], outputs=[],
                             collective=Collective("collective-broadcast", split[comm][0],
                                                   params, params, "bf16", None, True),
                             meta={"distributed_optimizer": "param-broadcast", "pieces": g}))
            for target in sorted({first_forward[n.meta.get("layer", "")] for n in members
                                  if n.meta.get("layer", "") in first_forward}):
                feeds.setdefault(target, []).append(len(head) - 1)
    else:
        gathers = []
        for n in buckets:
            c = n.collective
            inside = split[c.communicator][0]
            g = g_of[n.id]
            params = c.bytes_in * PARAMETER_BYTES // _DTYPE_BYTES.get(c.dtype, 4)
            gathers.append((first_forward.get(n.meta.get("layer", "")), Node(
                0, f"param-all-gather.{n.name}", NodeKind.COLLECTIVE, "all-gather",
                "collective", [], outputs=[],
                collective=Collective("all-gather", inside, params // g, params, "bf16",
                                      None, True),
                meta={"layer": n.meta.get("layer", ""),
                      "distributed_optimizer": "param-gather"})))
        if opt.gather == "prefetch":
            before = _prefetch_chain(graph, gathers)
            gathers = [(None, node) for target, node in gathers if target is None]
        for target, node in gathers:
            head.append(replace(node, id=len(head)))
            if target is not None:
                feeds.setdefault(target, []).append(len(head) - 1)
    # a bucket reduce-scattered inside a smaller group gets its all-reduce across the
    # groups right after it; whatever read the reduction reads that sum
    grouped = {n.id for n in buckets if opt.sync == "reduce-scatter"
               and g_of[n.id] < graph.communicators[n.collective.communicator].size}
    new_id, read_id, pos = {}, {}, len(head)
    placed: dict[int, list[int]] = {}     # node -> the ids of the gathers before it
    for n in graph.nodes:
        for _, reader in before.get(n.id, ()):
            placed.setdefault(n.id, []).append(pos)
            feeds.setdefault(reader, []).append(pos)
            pos += 1
        new_id[n.id] = read_id[n.id] = pos
        pos += 1
        if n.id in grouped:
            read_id[n.id] = pos
            pos += 1
    nodes: list[Node] = list(head)
    for n in graph.nodes:
        for k, (gather, _) in zip(placed.get(n.id, ()), before.get(n.id, ())):
            nodes.append(replace(gather, id=k))
        i = new_id[n.id]
        node = replace(n, id=i, inputs=[read_id[j] for j in n.inputs] + feeds.get(n.id, []),
                       control=[read_id[j] for j in n.control])
        if n.collective is not None and n.collective.window is not None:
            lo, hi = n.collective.window
            node.collective = replace(n.collective, window=(new_id[lo], new_id[hi]))
        if tasks[n.id] == "post" and "composite" in n.meta \
                and n.meta.get("layer", "") in group_of:
            composite = n.meta["composite"]
            node.meta = dict(n.meta, composite=dict(
                composite, scale=composite["scale"] / group_of[n.meta.get("layer", "")]))
        reduced = _in_grad_dtype(n.collective, opt.grad_dtype) if n.id in g_of else None
        if reduced is not None and opt.sync != "reduce-scatter":
            node.collective = reduced
        if n.id in g_of and opt.sync == "reduce-scatter":
            inside, across = split[n.collective.communicator]
            g = g_of[n.id]
            node.op = "reduce-scatter"
            node.collective = replace(reduced, type="reduce-scatter",
                                      communicator=inside if n.id in grouped
                                      else n.collective.communicator,
                                      bytes_out=reduced.bytes_in // g)
            node.meta = dict(n.meta, distributed_optimizer="grad-reduce-scatter")
        nodes.append(node)
        if n.id in grouped:
            shard = reduced.bytes_in // g_of[n.id]
            nodes.append(Node(read_id[n.id], f"{n.name}.across", NodeKind.COLLECTIVE,
                              "all-reduce", "collective", [i], outputs=list(n.outputs),
                              collective=Collective("all-reduce", split[n.collective.communicator][1],
                                                    shard, shard, reduced.dtype, "add",
                                                    n.collective.is_async),
                              meta={**n.meta, "distributed_optimizer": "grad-all-reduce-across"}))
    arguments = _sharded_state(graph, buckets, opt.shard_gradients, group_of,
                               _DTYPE_BYTES[opt.buffer_dtype or opt.grad_dtype])
    # the bf16 parameters the sync writes: a buffer kept for the whole step (forward and
    # backward read it), one per bucket (with its layer) or per broadcast
    if opt.sync == "broadcast":
        copies = [[f"params/bf16/{h.name}", h.collective.bytes_out] for h in head]
    else:
        synced = head + [g for k in sorted(before) for g, _ in before[k]]
        layers = [h.meta.get("layer") or h.meta.get("gathers_for") for h in synced]
        copies = [[f"params/{layer}/bf16" if layer else "params/bf16", h.collective.bytes_out]
                  for layer, h in zip(layers, synced)]
    # the step's outputs that update those arguments in place shrink with them
    aliased = set(graph.meta.get("aliased_arguments", ()))
    shrunk = sum(old[1] - new[1] for k, (old, new) in
                 enumerate(zip(graph.meta.get("arguments", ()), arguments)) if k in aliased)
    meta = dict(graph.meta, distributed_optimizer=len(buckets), arguments=arguments + copies)
    if "output_bytes" in meta:
        meta["output_bytes"] = max(float(meta["output_bytes"]) - shrunk, 0.0)
    out = replace(graph, nodes=nodes, meta=meta)
    out.check()
    return out


def _prefetch_chain(graph: WorkloadGraph, gathers: list) -> dict:
    """Megatron-Core's overlapped parameter gather (DistributedDataParallel with
    overlap_param_gather; megatron/core/distributed/param_and_grad_buffer.py): the bucket
    groups are chained in the order the forward uses them (next_param_gather_bucket_group,
    set over the groups in reverse of the gradient order), and a module's forward pre-hook
    calls finish_param_sync, which waits for its group's all-gather and then dispatches the
    next group's. So the gathers run one at a time in forward order, each dispatched when
    the forward reaches the layer before it, and only the first micro-batch's forward
    waits (later ones find the parameters gathered).

    `gathers`: (the first forward node of the bucket's layer or None, the gather node).
    Returns {original node id: [(gather, the node that reads it)]}: a gather is placed in the node order right before the previous bucket's first forward
    node, so the host issues it when the forward reaches that node (schedule.simulate
    issues a collective when the compute stream has run what precedes it, also on another
    pipeline stage's schedule), and it feeds its own layer's first forward node; the
    first one goes before its own layer's, at the start of the forward."""
    chain = sorted((t, k) for k, (t, _) in enumerate(gathers) if t is not None)
    before: dict[int, list] = {}
    targets = sorted({t for t, _ in chain})
    previous = {t: targets[j - 1] for j, t in enumerate(targets) if j}
    for target, k in chain:
        node = gathers[k][1]
        # labelled by what it gathers for, not as the layer's own work: it sits in the
        # previous layer's stretch of the forward, and a pipeline split reads layers there
        meta = {k: v for k, v in node.meta.items() if k != "layer"}
        node.meta = dict(meta, first_microbatch=True, gathers_for=node.meta.get("layer", ""))
        before.setdefault(previous.get(target, target), []).append((node, target))
    return before


def _in_grad_dtype(c: Collective, grad_dtype: str) -> Collective:
    """Gradient reduction `c` moving its gradients in `grad_dtype`. The extracted step
    reduces a weight's gradient in the dtype its wgrad GEMM wrote (XLA places the
    partitioner's all-reduce before the convert to the f32 parameter: bf16 for the
    layers' matrices, f32 for norms and the head); Megatron reduces its main-gradient
    buffer, all of one dtype."""
    have, want = _DTYPE_BYTES.get(c.dtype, 4), _DTYPE_BYTES[grad_dtype]
    if want == have:
        return c
    return replace(c, bytes_in=c.bytes_in * want // have, bytes_out=c.bytes_out * want // have,
                   dtype=grad_dtype)
