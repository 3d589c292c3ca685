"""Lower optimized, SPMD-partitioned HLO into a WorkloadGraph.

Every instruction that does work becomes a node; instructions that only name or regroup
values (bitcast, tuple, get-tuple-element, parameter, ...) are looked through, so a node's
inputs are the nodes that really produced its data. Called computations are inlined; a
while body is inlined once with `repeat` multiplied by its trip count; a conditional keeps
its most expensive branch. Async start/done pairs become one node that remembers the nodes
scheduled between them (its overlap window).
"""
from __future__ import annotations

import re
from collections import Counter, defaultdict

from flint.cluster import Cluster
from flint.errors import FlintError
from flint.graph import Loop, Node, NodeKind, OpClass, WorkloadGraph
from flint.hlo.buffer_assignment import update_element_bytes, update_roots
from flint.hlo.module import HloComputation, HloInstruction, HloModule
from flint.passes.hlo_cost import (COLLECTIVES, NO_WORK_TARGETS, CostRules, cudnn_attention_meta,
                                   is_known)
from flint.passes import tpu_async, tpu_megascale
from flint.passes.hlo_values import (Carried, flatten, ints, leaves_of, rebuild, structure,
                                     substitute)
from flint.passes.lower_collectives import P2P, CollectiveBuilder, fused_collective
from flint.passes.op_metadata import parse_op_name
from flint.passes.trip_count import infer_trip_count

_LOOK_THROUGH = frozenset({"bitcast", "add-dependency", "opt-barrier", "optimization-barrier",
                           "bitcast-convert", "domain", "async-update", "set-dimension-size"})
_NO_DATA = frozenset({"constant", "partition-id", "replica-id", "after-all",
                      "get-dimension-size"})


def lower_hlo(module: HloModule, cluster: Cluster,
              collapse_attention: bool = True) -> WorkloadGraph:
    """`collapse_attention=False` keeps XLA's own attention ops (the program as compiled,
    scores materialized: what its buffer assignment allocates)."""
    participants = module.num_partitions * module.replica_count
    # a Multislice program is one slice's: the cluster is its slices over the DCN
    slices = tpu_megascale.slices(module, cluster.devices, participants)
    if participants not in (1, cluster.devices) and slices == 1:
        raise FlintError(f"HLO module {module.name!r} is partitioned for {participants} devices "
                         f"but the cluster has {cluster.devices}")
    from flint.passes.attention import CollapseAttention

    graph = _Lowering(module, cluster, participants, slices).run()
    return CollapseAttention().run(graph) if collapse_attention else graph


_ALIASED_PARAM = re.compile(r":\s*\(\s*(\d+)\s*,")


def entry_buffers(module: HloModule) -> dict:
    """What the step's arguments and results occupy on a device, for the memory estimate:
    each entry parameter (name from its metadata, bytes), the result's bytes, and the
    parameters XLA aliases to results (donated buffers updated in place)."""
    entry = module.entry_computation
    params = entry.parameters
    arguments = [[params[i].metadata.get("op_name") or params[i].name,
                  int(params[i].shape.nbytes)] for i in sorted(params)]
    aliased = sorted({int(m) for m in _ALIASED_PARAM.findall(
        module.header.get("input_output_alias", ""))} & set(params))
    return {"arguments": arguments, "aliased_arguments": aliased,
            "output_bytes": int(entry.root.shape.nbytes)}


class _Lowering:
    def __init__(self, module: HloModule, cluster: Cluster, partitions: int = 1,
                 slices: int = 1):
        self.module = module
        self.cluster = cluster
        self.partitions, self.slices = partitions, slices
        self.megascale: dict = {}   # MegaScale transfers in flight (passes.tpu_megascale)
        self.rules = CostRules(module)
        self.nodes: list[Node] = []
        self.collectives = CollectiveBuilder(module, cluster, partitions if slices > 1 else 0)
        self.loops: list[Loop] = []
        self.loop_stack: list[int] = []
        self.consumers: dict[int, dict[int, set[int]]] = {}
        self.unknown: Counter = Counter()
        self.by_name: dict[str, int] = {}
        # libtpu's async collectives in flight, by channel: their start, continuations
        # and done may sit in different computations (a while body carries the state)
        self.tpu_starts: dict[str, int] = {}

    def run(self) -> WorkloadGraph:
        entry = self.module.entry_computation
        self.lower(entry, [() for _ in entry.parameters], 1)
        meta = {"module": self.module.name, "source": "hlo",
                "unknown_ops": dict(sorted(self.unknown.items())),
                **entry_buffers(self.module)}
        return WorkloadGraph(self.cluster, self.nodes, self.collectives.communicators(),
                             self.loops, meta)

    # --- computations -------------------------------------------------------------------
    def lower(self, comp: HloComputation, args: list, repeat: int):
        env: dict[str, object] = {}
        starts: dict[str, int] = {}
        for ins in comp.instructions:
            op = ins.opcode
            if op == "parameter":
                idx = int(ins.operand_text)
                v = args[idx] if idx < len(args) else ()
            elif op == "get-tuple-element":
                src = env.get(ins.operands[0], ())
                idx = int(ins.attr("index") or 0)
                v = src[idx] if isinstance(src, list) and idx < len(src) else src
            elif op == "tuple":
                v = [env.get(o, ()) for o in ins.operands]
            elif op in _LOOK_THROUGH:
                v = env.get(ins.operands[0], ()) if ins.operands else ()
            elif op in _NO_DATA or (op == "custom-call" and _no_work_call(ins)):
                v = ()
            elif op == "while":
                v = self.lower_while(ins, comp, env, repeat)
            elif op == "call":
                callee = self.module.computations[ins.called("to_apply")[0]]
                v = self.lower(callee, [env.get(o, ()) for o in ins.operands], repeat)
            elif op == "conditional":
                v = self.lower_conditional(ins, env, repeat)
            elif self.slices > 1 and tpu_megascale.is_transfer(ins):
                v = tpu_megascale.lower_transfer(self, ins, comp, env, repeat)
            elif op.endswith("-done"):
                if ins.operands[0] in starts:
                    node = self.nodes[starts.pop(ins.operands[0])]
                    self.close_async(node, ins)
                    v = leaves_of(node.id, ins.shape)
                else:  # started in another computation: the value flows through
                    v = env.get(ins.operands[0], ())
            elif op.endswith("-start") and op != "copy-start" or op == "async-start":
                node = self.start_async(ins, comp, env, repeat)
                starts[ins.name] = node.id
                v = (node.id,)
            elif (op == "fusion" and self.cluster.platform == "tpu"
                  and (role := tpu_async.tpu_async_role(self.module, ins))):
                v = leaves_of(tpu_async.lower_fusion(self, ins, comp, env, repeat, role),
                               ins.shape)
            else:
                node = self.make_node(ins, comp, ins, [env.get(o, ()) for o in ins.operands],
                                      repeat)
                if op == "collective-permute" and self.cluster.platform == "tpu":
                    tpu_async.mark_async(node)      # a DMA waited for at its first use
                if op == "copy-start":
                    node.meta["async"] = True
                    starts[ins.name] = node.id
                v = leaves_of(node.id, ins.shape)
            env[ins.name] = v
        return env.get(comp.root.name, ())

    def lower_while(self, ins: HloInstruction, comp: HloComputation, env: dict, repeat: int):
        init = env.get(ins.operands[0], ())
        n = ins.backend_config.get("known_trip_count", {}).get("n")
        if n is None:  # TPU (and some loops elsewhere) carry no annotation: infer it
            n = infer_trip_count(self.module, ins, comp)
        trip = int(n) if n is not None else 1
        loop_id = len(self.loops)
        body = self.module.computations[ins.called("body")[0]]
        cond = self.module.computations[ins.called("condition")[0]]
        state_shape = body.parameters[0].shape if 0 in body.parameters else ins.shape
        init_leaves = flatten(structure(init, state_shape))
        carried = rebuild(structure(init, state_shape),
                           iter([(Carried(loop_id, k, leaf),) for k, leaf in enumerate(init_leaves)]))
        self.loops.append(Loop(loop_id, ins.name, trip,
                               self.loop_stack[-1] if self.loop_stack else None,
                               len(self.nodes), len(self.nodes) - 1, n is not None))
        self.consumers[loop_id] = defaultdict(set)
        self.loop_stack.append(loop_id)
        self.lower(cond, [carried], repeat * trip)
        root = self.lower(body, [carried], repeat * trip)
        self.loop_stack.pop()
        loop = self.loops[loop_id]
        loop.last = len(self.nodes) - 1
        for k, leaf in enumerate(flatten(structure(root, state_shape))):
            producers = sorted(p for p in leaf if isinstance(p, int) and p >= loop.first)
            consumers = sorted(self.consumers[loop_id].get(k, ()))
            if producers and consumers:
                init = sorted(ints(init_leaves[k]) if k < len(init_leaves) else ())
                loop.carried.append((init, producers, consumers))
        del self.consumers[loop_id]
        return substitute(root, loop_id)

    def lower_conditional(self, ins: HloInstruction, env: dict, repeat: int):
        names = ins.called("branch_computations") or (
            ins.called("true_computation") + ins.called("false_computation"))
        costs = [self.rules.computation_flops(b)[0] for b in names]
        pick = max(range(len(names)), key=lambda i: (costs[i], -i))
        first = len(self.nodes)
        args = [env.get(ins.operands[1 + pick], ())] if len(ins.operands) > 1 + pick else []
        v = self.lower(self.module.computations[names[pick]], args, repeat)
        for node in self.nodes[first:]:
            node.meta["conditional"] = f"{ins.name}:branch{pick}/{len(names)}"
        return v

    # --- nodes --------------------------------------------------------------------------
    def start_async(self, ins: HloInstruction, comp: HloComputation, env: dict, repeat: int):
        operands = [env.get(o, ()) for o in ins.operands]
        if ins.opcode == "async-start":
            wrapped_comp = self.module.computations[ins.called("calls")[0]]
            node = self.make_node(wrapped_comp.root, wrapped_comp, ins, operands, repeat)
            if node.collective is None:
                # A kernel XLA wraps in an async computation (newer XLA does so for the
                # in-place updates of a scan's stacked outputs) is still a kernel on the
                # SMs, queued on the stream its operation_queue_id names: 0, the compute
                # stream, in the dumps seen (a jax 0.11 H200 trace runs them there).
                # Priced as the wrapped kernel, writing what it writes (in place).
                node.meta["wrapped_kernel"] = wrapped_comp.root.name
                node.meta["wrapped_name"] = wrapped_comp.root.name
                return node
        else:
            node = self.make_node(ins, comp, ins, operands, repeat,
                                  opcode=ins.opcode[: -len("-start")])
        node.meta["async"] = True
        wrapped = self.module.wrapped_names.get(ins.name)
        if wrapped:
            node.meta["wrapped_name"] = wrapped
        if node.collective:
            node.collective.is_async = True
        return node

    def close_async(self, node: Node, done: HloInstruction) -> None:
        out = done.shape
        node.outputs = [str(s) for s in out.leaves()]
        if node.meta.get("wrapped_kernel"):
            return
        node.bytes_written = float(out.nbytes)
        if node.collective:
            node.collective.bytes_out = out.nbytes
        if len(self.nodes) - 1 > node.id:
            window = (node.id + 1, len(self.nodes) - 1)
            if node.collective:
                node.collective.window = window
            else:
                node.meta["window"] = list(window)

    def make_node(self, ins: HloInstruction, comp: HloComputation, at: HloInstruction,
                  operands: list, repeat: int, opcode: str | None = None,
                  carried_collective: bool = False) -> Node:
        """Node for `ins` (evaluated in `comp`), placed where `at` is scheduled;
        `carried_collective`: a fusion whose collective is another node's (a TPU
        continuation fusion), priced as its compute."""
        node_id = len(self.nodes)
        opcode = opcode or ins.opcode
        flops, trans = self.rules.flops(ins, comp)
        read, written = self.rules.bytes(ins, comp)
        op_class = self.rules.op_class(ins)
        meta = self.metadata(at if at.metadata else ins)
        if not is_known(opcode):
            self.unknown[opcode] += 1
            meta["unknown"] = True
        if opcode == "custom-call":
            meta["target"] = (ins.attr("custom_call_target") or "").strip('"')
            if op_class == OpClass.ATTENTION:
                attention = cudnn_attention_meta(ins, comp)
                if attention:
                    meta["attention"] = attention
            if op_class == OpClass.CUSTOM:
                self.unknown[f"custom-call:{meta['target']}"] += 1
                meta["unknown"] = True
        if opcode == "fusion":
            meta["fusion_kind"] = ins.attr("kind") or ""
            kind_cfg = ins.backend_config.get("fusion_backend_config", {}).get("kind")
            if kind_cfg:
                meta["fusion_kind"] = kind_cfg
            called = ins.called("calls")
            fused = self.module.computations[called[0]] if called else None
            root = fused.root if fused is not None else None
            if fused is not None and update_roots(fused) and self.rules.in_place(ins):
                # XLA's in-place emitter: one thread per update element, no unrolling
                # (hardware_models/populations.py prices it by the element it loads)
                meta["update_element_bytes"] = update_element_bytes(fused)
            if (root is not None and meta["fusion_kind"] in ("kCustom", "__custom_fusion")
                    and root.opcode == "custom-call"):
                # A dynamic-slice ("address computation") fusion runs its root library call
                # as the thunk, and profilers name the thunk after that root.
                meta["wrapped_name"] = root.name
        if self.loop_stack:
            meta["loop"] = self.loop_stack[-1]
        collective = None
        kind = NodeKind.MEMORY if op_class == OpClass.DATA_MOVEMENT else NodeKind.COMPUTE
        if opcode in COLLECTIVES or opcode in P2P:
            collective = self.collectives.of(ins, comp, opcode)
            kind = P2P.get(opcode, NodeKind.COLLECTIVE)
            op_class = OpClass.COLLECTIVE if opcode in COLLECTIVES else OpClass.P2P
        elif (opcode == "fusion" and not carried_collective
              and (inner := fused_collective(self.module, ins)) is not None):
            collective = self.collectives.fused(ins, inner)
            kind, op_class = NodeKind.COLLECTIVE, OpClass.COLLECTIVE
            meta["fused_collective"] = inner[1].name
        node = Node(
            id=node_id, name=at.name, kind=kind, op=opcode, op_class=op_class,
            inputs=self.resolve(operands, node_id), flops=flops, transcendentals=trans,
            bytes_read=read, bytes_written=written,
            outputs=[str(s) for s in ins.shape.leaves()],
            operands=[str(comp.by_name[o].shape) for o in ins.operands if o in comp.by_name],
            repeat=repeat, collective=collective, meta=meta)
        return self.append(node, at)

    def append(self, node: Node, at: HloInstruction) -> Node:
        """Add `node`, scheduled where `at` is (after `at`'s control predecessors)."""
        preds = at.attr("control-predecessors")
        if preds:
            node.control = sorted(set(self._control(preds)) - set(node.inputs))
        self.nodes.append(node)
        self.by_name[node.name] = node.id
        return node

    def metadata(self, ins: HloInstruction) -> dict:
        md = ins.metadata
        out: dict = {}
        op_name = md.get("op_name", "")
        if op_name:
            scope, layer, phase = parse_op_name(op_name)
            out.update(op_name=op_name, scope=scope, layer=layer, phase=phase)
        frame = md.get("stack_frame_id")
        if frame is not None and int(frame) in self.module.stack_frames:
            out["source"] = self.module.stack_frames[int(frame)]
        elif md.get("source_file"):
            out["source"] = f"{md['source_file']}:{md.get('source_line', '?')}"
        if md.get("deduplicated_name"):
            # XLA emits one kernel for identical fusions and names it after the first:
            # a profiler shows this instruction under that kernel's name
            out["kernel_name"] = md["deduplicated_name"]
        return out

    # --- value plumbing -----------------------------------------------------------------
    def resolve(self, values: list, consumer: int) -> list[int]:
        out: set[int] = set()
        stack = list(values)
        while stack:
            v = stack.pop()
            if isinstance(v, list):
                stack.extend(v)
                continue
            for p in v:
                if isinstance(p, int):
                    out.add(p)
                else:
                    if p.loop in self.consumers:
                        self.consumers[p.loop][p.index].add(consumer)
                    stack.append(p.init)
        return sorted(out)

    def _control(self, preds: str) -> list[int]:
        names = (p.strip().lstrip("%") for p in preds.strip("{}").split(","))
        return [self.by_name[n] for n in names if n in self.by_name]


def _no_work_call(ins: HloInstruction) -> bool:
    return (ins.attr("custom_call_target") or "").strip('"') in NO_WORK_TARGETS
