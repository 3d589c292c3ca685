"""Pipeline parallelism as a graph pass: one microbatch's per-device step -> an MPMD graph
of `stages` devices running `microbatches` microbatches under a pipeline schedule.

The input is what a front end extracted for one pipeline stage's slice of the cluster
(the data/tensor-parallel mesh) with the microbatch as its batch. The output holds every
stage's nodes (`meta["device"]` = stage, `meta["microbatch"]`, `meta["chunk"]`), in an
order consistent with every device's schedule, with SEND/RECV pairs wherever data crosses
devices (activations forward, their gradients backward). `hardware_models.estimate` runs
the stages on their own streams and reports the pipeline bubble.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import ClassVar

from flint.cluster import Cluster
from flint.errors import FlintError
from flint.graph import Collective, Node, NodeKind, WorkloadGraph
from flint.hlo.shapes import shapes_bytes
from flint.passes.expand_loops import ExpandLoops
from flint.passes.pipeline_comms import PIPE_AXIS, stage_pairs, tensor_parallel
from flint.passes.pipeline_stages import (SCHEDULES, arguments_by_layer, assign_chunks,
                                          device_order, layer_index, task_of)

# What a stage does with the boundary tensors it sends and receives:
# - posted-ahead: sends run on while the stage computes, beside its receives (Megatron-
#   Core's interleaved schedule with overlap_p2p_comm, PyTorch's pipelining schedules);
# - blocking: a step's sends and receives go together (batch_isend_irecv, both directions
#   at once) and the stage waits for all of them before its next step (Megatron's
#   non-interleaved 1F1B: _communicate waits on every request and synchronizes the device);
# - blocking-serial: each send and each receive is a blocking call of its own, one after
#   another (DeepSpeed's PipelineEngine: dist.send / dist.recv, "The communication is
#   blocking and must be paired", runtime/pipe/schedule.py).
P2P_MODES = ("posted-ahead", "blocking", "blocking-serial")


@dataclass(frozen=True)
class PipelineParallel:
    """Contract: input a per-device training-step graph of one microbatch (loops are
    expanded; splitting by layer needs unrolled layers); output a loop-free MPMD graph
    whose F and B work appears once per microbatch and pre/post work (parameter casts,
    optimizer) and R work (the data-parallel gradient reduction) once per step, R inside
    the last microbatch's backward, with total flops = microbatches x F+B flops + the rest;
    every cross-device edge goes through a SEND on the producer's device and a RECV on the
    consumer's; each device's nodes are in its schedule's order. Raises FlintError when
    the split or the schedule is impossible."""

    stages: int = 1
    microbatches: int = 1
    schedule: str = "1f1b"
    virtual: int = 1
    split: str = "layers"
    hardware: str = ""          # for split=time: whose predicted times balance the stages
    what_if: str = ""           # ... with these what-ifs ("nic_bandwidth=800Gb/s;...")
    # the gradient reduction (R work) after every micro-batch's backward instead of once
    # per step: ZeRO-2 keeps only its shard of the gradients, so it must reduce-scatter
    # them before the next micro-batch adds to them (DeepSpeed stage 2)
    reduce_every_microbatch: bool = False
    p2p: str = "posted-ahead"       # P2P_MODES
    # each boundary tensor crosses as this many slices, one per tensor-parallel rank, and
    # the receiver all-gathers them over TP before using it (Megatron-LM 2021's
    # scatter/gather, DeepSpeed's pipe_partitioned)
    scatter_gather: int = 1
    max_nodes: int = 3_000_000
    name: ClassVar[str] = "pipeline"
    # for split=time: a cost model (factory or CostModel, hardware_models.pluggable)
    # instead of the built-in one for `hardware`
    cost_model: object = None

    def __post_init__(self):
        if self.p2p not in P2P_MODES:
            raise FlintError(f"pipeline: unknown p2p {self.p2p!r}; use {' | '.join(P2P_MODES)}")
        if self.scatter_gather < 1:
            raise FlintError(f"pipeline: scatter_gather must be >= 1, not {self.scatter_gather}")

    def what_if_list(self) -> list[str]:
        return [w.strip() for w in self.what_if.split(";") if w.strip()]

    def run(self, graph: WorkloadGraph) -> WorkloadGraph:
        if self.schedule not in SCHEDULES:
            raise FlintError(f"unknown pipeline schedule {self.schedule!r}; use "
                             f"{' | '.join(SCHEDULES)}")
        orders = device_order(self.schedule, self.stages, self.microbatches, self.virtual)
        flat = ExpandLoops().run(graph)
        tasks = task_of(flat)
        chunks = self.stages * self.virtual
        durations = None
        if self.split == "time":
            from flint.hardware_models.estimate import price_nodes
            from flint.hardware_models.pluggable import cost_model_for

            model = cost_model_for(flat, self.hardware or None, self.what_if_list(),
                                   self.cost_model)
            durations = price_nodes(flat, model)
        chunk = assign_chunks(flat, tasks, chunks, self.split, durations, self.stages)
        per_mb = sum(t in "FB" for t in tasks)
        if per_mb * self.microbatches + len(flat.nodes) > self.max_nodes:
            raise FlintError(f"{self.microbatches} microbatches of {per_mb} nodes exceed "
                             f"the pipeline pass's limit of {self.max_nodes} nodes")
        return _Builder(flat, tasks, chunk, self).build(orders)


def apply_placement(graph: WorkloadGraph, device_of: list[int], devices: int) -> WorkloadGraph:
    """One step with node i on device `device_of[i]` (model parallelism, no microbatches):
    an MPMD graph in the original order with a SEND/RECV pair per value that crosses
    devices, ready for `hardware_models.estimate`."""
    flat = ExpandLoops().run(graph)
    if len(device_of) != len(flat.nodes):
        raise FlintError(f"placement has {len(device_of)} entries for {len(flat.nodes)} nodes")
    if any(not 0 <= d < devices for d in device_of):
        raise FlintError(f"placement names a device outside 0..{devices - 1}")
    cfg = PipelineParallel(stages=devices, microbatches=1, schedule="gpipe", split="placement")
    builder = _Builder(flat, ["F"] * len(flat.nodes), list(device_of), cfg)
    for n in flat.nodes:
        builder.emit_node(n.id, "F", 0, device_of[n.id])
    return builder.finish()


class _Builder:
    def __init__(self, graph: WorkloadGraph, tasks, chunk, cfg: PipelineParallel):
        self.g, self.tasks, self.chunk, self.cfg = graph, tasks, chunk, cfg
        self.p = cfg.stages
        self.nodes: list[Node] = []
        self.copy: dict[tuple[int, int], int] = {}       # (template, microbatch) -> new id
        self.recv: dict[tuple[int, int, int], int] = {}  # (template, mb, device) -> RECV id
        self.send_to: dict[int, list[int]] = {}          # template -> remote devices
        self.pairs: dict[tuple[int, int], int] = {}      # (src, dst) device -> communicator
        self.comms = list(graph.communicators)
        self.windows: list[tuple[Node, tuple[int, int], int]] = []
        self.members: dict[tuple[str, int], list[int]] = {}
        self.last = cfg.microbatches - 1
        self.gate: list[int] = []                        # RECVs the next node waits for
        self.deferred: list[tuple] | None = None         # sends held to a task's end
        self.sent: dict[tuple[int, int, int], int] = {}  # (template, mb, device) -> SEND
        self.sizes: dict[int, tuple[int, str]] = {}      # template -> (p2p bytes, dtype)
        self.unfinished: dict[int, list[int]] = {}       # device -> sends its next task awaits
        self.tp_comm = tensor_parallel(self.comms, cfg.scatter_gather)
        for n in graph.nodes:
            self.members.setdefault(self.group(n.id), []).append(n.id)
            dev = self.device(n.id)
            remote = {self.device(u) for u in graph.users[n.id]} - {dev}
            self.send_to[n.id] = sorted(remote)

    def group(self, template: int) -> tuple[str, int]:
        """The (F|B|pre|post, chunk) task a node runs in: R work runs inside B."""
        task = self.tasks[template]
        return ("B" if task == "R" else task), self.chunk[template]

    def device(self, template: int) -> int:
        return self.chunk[template] % self.p

    def build(self, orders) -> WorkloadGraph:
        self.emit_once("pre")              # once-per-step work before the pipeline
        pending = [list(o) for o in orders]
        while any(pending):
            progressed = False
            for d in range(self.p):
                while pending[d] and self.ready(*pending[d][0]):
                    self.emit_task(*pending[d].pop(0))
                    progressed = True
            if not progressed:
                raise FlintError("the pipeline split makes stages wait on each other "
                                 "(a cycle between chunks); try split=time")
        self.emit_once("post")
        return self.finish()

    def emit_once(self, phase: str) -> None:
        """Once-per-step nodes in the original order (they may feed each other across
        devices, e.g. the optimizer's step counter)."""
        for n in self.g.nodes:
            if self.tasks[n.id] == phase:
                self.emit_node(n.id, phase, 0, self.chunk[n.id])

    def finish(self) -> WorkloadGraph:
        for node, (first, last), mb in self.windows:
            a, b = self.copy.get((first, mb)), self.copy.get((last, mb))
            node.collective.window = (a, b) if a is not None and b is not None and a <= b \
                else None
        return self.graph()

    def runs(self, template: int, mb: int) -> bool:
        """R work runs once, with the last microbatch; work only the first microbatch does
        (meta first_microbatch: a sharded optimizer's parameter gathers) runs with it."""
        if self.g.nodes[template].meta.get("first_microbatch"):
            return mb == 0
        return (self.tasks[template] != "R" or mb == self.last
                or self.cfg.reduce_every_microbatch)

    def ready(self, phase: str, mb: int, c: int) -> bool:
        for t in self.members.get((phase, c), ()):
            if not self.runs(t, mb):
                continue
            for i in self.g.nodes[t].inputs:
                k = 0 if self.g.nodes[i].meta.get("first_microbatch") else mb
                if self.tasks[i] in "FBR" and (i, k) not in self.copy \
                        and self.group(i) != (phase, c):
                    return False
        return True

    def emit_task(self, phase: str, mb: int, c: int) -> None:
        """A stage runs a task once everything it receives has arrived (Megatron-LM's
        blocking recv_forward / recv_backward before the stage's compute): the task's
        RECVs come first and gate its first node."""
        if phase == "F" and mb == 0 and self.cfg.virtual > 1:
            self.aligned_gathers(c)
        members = [t for t in self.members.get((phase, c), ())
                   if self.runs(t, mb) and (t, mb) not in self.copy]
        dev = c % self.p
        self.gate = sorted({self.receive(i, self.instance(i, phase, mb), dev)
                            for t in members for i in self.g.nodes[t].inputs
                            if self.device(i) != dev} | set(self.unfinished.pop(dev, ())))
        # ... and sends what it produced for other stages when it is done (send_forward /
        # send_backward after the stage's forward or backward step).
        self.deferred = []
        held: set = set()        # reductions held to the flush, and the work reading them
        for t in members:
            node = self.g.nodes[t]
            if node.meta.get("after_backward") or not held.isdisjoint(node.inputs):
                held.add(t)
        for t in members:
            if t not in held:
                self.emit_node(t, phase, mb, c)
        # the step's end: its last F/B node (the gradient reduction runs on past it)
        end = max((self.copy[(t, mb)] for t in members if self.tasks[t] != "R"),
                  default=len(self.nodes) - 1)
        # reductions held to the end of the backward (no overlap) wait for this stage's
        # own flush, the last backward of the last micro-batch
        for t in members:
            if t in held:
                self.emit_node(t, phase, mb, c)
                node = self.nodes[self.copy[(t, mb)]]
                node.control = sorted(set(node.control) | {end})
        done, self.deferred = self.deferred, None
        for t, node_id, dev_, mb_, c_ in done:
            for dst in self.send_to[t]:
                sent = self.p2p(NodeKind.SEND, self.g.nodes[t], [node_id], dev_, dst, mb_, c_,
                                control=[end])
                if self.cfg.p2p != "posted-ahead":
                    self.unfinished.setdefault(dev_, []).append(sent)

    def aligned_gathers(self, c: int) -> None:
        """A sharded optimizer's parameter gathers (meta first_microbatch) under Megatron's
        interleaved schedule, which aligns them across the stages (align_param_gather,
        Megatron-LM's default there; off for the other schedules, whose layers gather one
        bucket ahead in their forward, passes.distributed_optimizer): the gathers of the
        device's first two model chunks start with the step, a later chunk's with the
        first forward of the chunk before it (schedules.py: param_sync_func of chunks 0 and
        1, then of param_sync_chunk_id in the warm-up), each chunk's all at once in its
        buckets' order, the gradients' (DistributedDataParallel.start_param_sync)."""
        for k in ([c, c + self.p] if c < self.p else [c + self.p]):
            gathers = [t for t in self.members.get(("F", k), ())
                       if self.g.nodes[t].meta.get("first_microbatch") and (t, 0) not in self.copy]
            for t in reversed(gathers):
                self.emit_node(t, "F", 0, k)

    def instance(self, i: int, phase: str, mb: int) -> int:
        """Which microbatch's copy of node i a node of `phase` in microbatch `mb` reads:
        its own for per-microbatch work, the last one once per step, 0 for once-per-step
        nodes (they have one copy)."""
        if self.tasks[i] == "R":
            return mb if self.cfg.reduce_every_microbatch and phase in "FB" else self.last
        if self.tasks[i] not in "FB" or self.g.nodes[i].meta.get("first_microbatch"):
            return 0
        return mb if phase in "FB" else self.last

    def emit_node(self, t: int, phase: str, mb: int, c: int) -> None:
        old = self.g.nodes[t]
        dev = self.device(t)

        def source(i):
            k = self.instance(i, phase, mb)
            if self.device(i) == dev:
                return self.copy[(i, k)]
            return self.receive(i, k, dev)

        inputs = [source(i) for i in old.inputs]   # may emit RECVs first
        # a shallow copy, built directly (copy.copy of a dataclass goes through
        # __reduce_ex__: a third of a long pipeline's build)
        node = Node(len(self.nodes), old.name, old.kind, old.op, old.op_class, inputs, [],
                    old.flops, old.transcendentals, old.bytes_read, old.bytes_written,
                    old.outputs, old.operands, old.repeat, old.collective, old.meta)
        control = ((i, self.instance(i, phase, mb)) for i in old.control
                   if self.device(i) == dev)
        node.control = sorted({self.copy[key] for key in control if key in self.copy}
                              | set(self.gate))
        self.gate = []
        node.meta = dict(old.meta, device=dev, chunk=c, template=t,
                         task="R" if self.tasks[t] == "R" else phase)
        if phase in "FB":
            node.meta["microbatch"] = mb
            if self.cfg.split != "placement":
                node.name = f"{old.name}.mb{mb}"
        if old.collective is not None:
            node.collective = copy.copy(old.collective)
            if old.collective.window is not None:
                self.windows.append((node, old.collective.window, mb))
        self.nodes.append(node)
        self.copy[(t, mb)] = node.id
        if self.deferred is not None:
            if self.send_to[t]:
                self.deferred.append((t, node.id, dev, mb, c))
            return
        for dst in self.send_to[t]:
            self.p2p(NodeKind.SEND, old, [node.id], dev, dst, mb, c)

    def receive(self, template: int, mb: int, dev: int) -> int:
        key = (template, mb, dev)
        if key not in self.recv:
            send = self.sent[(template, mb, dev)]
            old = self.g.nodes[template]
            got = self.p2p(NodeKind.RECV, old, [send], self.device(template), dev, mb,
                           self.chunk[template])
            if self.tp_comm is not None:
                got = self.gather(got, old, dev, mb, self.chunk[template])
            self.recv[key] = got
        return self.recv[key]

    def gather(self, recv: int, old: Node, dev: int, mb: int, c: int) -> int:
        """The all-gather over TP that puts the received slices back together, on the
        compute stream before the tensor is used (DeepSpeed's PartitionedTensor.full(),
        Megatron-LM's gather_split_1d_tensor)."""
        nbytes, dtype = self.sizes[old.id]
        node = Node(len(self.nodes), f"p2p-gather.{old.name}.mb{mb}", NodeKind.COLLECTIVE,
                    "all-gather", "collective", inputs=[recv],
                    outputs=list(old.outputs),
                    collective=Collective("all-gather", self.tp_comm,
                                          nbytes // self.cfg.scatter_gather, nbytes, dtype),
                    meta={"device": dev, "chunk": c, "microbatch": mb, "task": "p2p",
                          "phase": old.meta.get("phase") or "unknown",
                          "layer": old.meta.get("layer")})
        self.nodes.append(node)
        return node.id

    def p2p(self, kind: NodeKind, old: Node, inputs, src: int, dst: int, mb: int,
            c: int, control=()) -> int:
        sized = self.sizes.get(old.id)
        if sized is None:               # per template node: the same for every micro-batch
            sized = self.sizes[old.id] = (shapes_bytes(old.outputs), _dtype(old))
        nbytes, dtype = sized
        nbytes //= self.cfg.scatter_gather      # this rank's slice
        comm = self.pairs.get((src, dst))
        if comm is None:
            comm = self.pairs[(src, dst)] = len(self.comms)
            self.comms.append(stage_pairs(comm, self.g.cluster, src, dst, self.p))
        verb = "send" if kind == NodeKind.SEND else "recv"
        dev = src if kind == NodeKind.SEND else dst
        node = Node(len(self.nodes), f"{verb}.{old.name}.mb{mb}", kind, verb, "p2p",
                    inputs=list(inputs), control=sorted(set(control) - set(inputs)),
                    bytes_read=nbytes if kind == NodeKind.SEND else 0,
                    bytes_written=nbytes if kind == NodeKind.RECV else 0,
                    outputs=list(old.outputs) if kind == NodeKind.RECV else [],
                    collective=Collective(verb, comm, nbytes, nbytes, dtype, None, True),
                    meta={"device": dev, "chunk": c, "microbatch": mb, "task": "p2p",
                          "phase": old.meta.get("phase") or "unknown",
                          "layer": old.meta.get("layer")})
        if self.cfg.p2p == "blocking-serial":       # the stage's transfers take turns
            node.meta["half_duplex"] = True
        self.nodes.append(node)
        if kind == NodeKind.SEND:
            self.sent[(old.id, mb, dst)] = node.id
        return node.id

    def graph(self) -> WorkloadGraph:
        g, cfg = self.g, self.cfg
        c = g.cluster
        cluster = Cluster(c.devices * self.p, ((PIPE_AXIS, self.p),) + tuple(c.mesh),
                          c.hardware, c.platform, c.devices_per_host)
        meta = dict(g.meta)
        meta["mpmd_devices"] = self.p
        if cfg.split == "placement":
            meta["placement"] = {"devices": self.p}
        else:
            meta["pipeline"] = {"stages": self.p, "microbatches": cfg.microbatches,
                                "schedule": cfg.schedule, "virtual": cfg.virtual,
                                "split": cfg.split, "template_nodes": len(g.nodes)}
        if "model_flops_per_device" in meta:   # per device of the whole (p x) cluster
            meta["model_flops_per_device"] *= cfg.microbatches / self.p
        meta["device_arguments"] = _arguments_by_device(g, self.chunk, self.p)
        return WorkloadGraph(cluster, self.nodes, self.comms, [], meta)


def _dtype(node: Node) -> str:
    return node.outputs[0].split("[", 1)[0] if node.outputs else "u8"


def _arguments_by_device(graph: WorkloadGraph, chunk: list[int], p: int) -> list[float]:
    """Resident argument bytes per device: a layer's parameters and optimizer state live
    with the chunk that runs the layer; the rest (embeddings, norms, the step counter) is
    counted as spread evenly (the first and last stages hold the embedding and the head)."""
    layer_chunk: dict[int, int] = {}
    for n in graph.nodes:
        li = layer_index(n.meta.get("layer"))
        if li is not None:
            layer_chunk.setdefault(li, chunk[n.id])
    owned, rest = arguments_by_layer(graph)
    per = [rest / p] * p
    for li, nbytes in owned.items():
        per[layer_chunk[li] % p] += nbytes
    return per
