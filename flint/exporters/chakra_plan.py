"""Encode a workload graph as Chakra nodes once, then specialize it per rank cheaply.

Ranks of an SPMD program run the same nodes; they differ only in who their peers are. So
every node is serialized once. A collective's bytes are its rank-independent part
followed by one `pg_name` attribute naming this rank's group: `attr` is the last field of
a Chakra Node, and protobuf parses a message followed by more fields of it as the merged
message, so `template + pg_attr` is byte for byte what serializing the whole node gives
(a test checks this against mlc-chakra's own encoder). A rank's file is then a join of
constant runs and per-rank pieces: O(collectives) work per rank, not O(nodes). An MPMD
graph (pipeline stages, `meta["device"]`) is encoded once per stage; rank r runs stage
r // (ranks per stage).

What ASTRA-sim needs to run the files to completion (its README in ../shared/tools/
astra-sim, and `chakra_check`, which proves it before anything is written):
- Chakra ids are 2i+1 for Flint node i; the SEND half of a collective-permute (or the
  clear-to-send of a pipeline transfer, chakra_pairs) is 2i, right before the node.
  ASTRA-sim issues ready nodes smallest id first.
- Every communication node of a rank is chained to the previous one by a control
  dependency, in the order Flint's schedule starts them (program order where it starts
  them together): one order per rank, shared by all members of every communicator, so
  no two ranks wait on each other in different collectives. It is Flint's issue order,
  not program order, because a framework's own stream (FSDP2's parameter all-gathers)
  is issued ahead of the compute stream: in program order the next layer's all-gather
  would queue behind this layer's gradient reduce-scatter, which Flint overlaps.
- Compute-stream nodes are chained in program order (one in-order GPU stream, as Flint's
  schedule runs them); an asynchronous collective also waits for the compute node before
  it, which is when Flint's schedule issues it. Work on a framework's own stream waits
  only for its inputs and control edges, as in Flint's schedule.
- Names start with the Chakra node type (`COMP_NODE:fusion.3`): Chakra's timeline
  visualizer tells node types by name. Durations are whole microseconds (the field's
  unit); the rounding error is carried along the compute chain so the running total
  stays within a microsecond of the model's, and no compute node lasts 0 us.

Point-to-point traffic (collective-permute, send, recv) becomes COMM_SEND / COMM_RECV
pairs per rank (chakra_pairs), a pipeline's transfers with a rendezvous handshake; an
all-to-all becomes per-peer sends and receives, as NCCL runs it, with each rank's sizes
under MoE routing skew (chakra_alltoallv).
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from flint.errors import FlintError
from flint.exporters import chakra_format as cf
from flint.graph import Communicator, Node, NodeKind, WorkloadGraph
from flint.exporters.chakra_nodes import (FLINT_NODE, ID_SCHEME, add_ctrl, chakra_id,
                                          chakra_name, chakra_type, comm_size, describe,
                                          flint_record, p2p_node, peers)
from flint.exporters.chakra_alltoallv import AllToAllvSlot, RankWorkSlot, per_peer
from flint.exporters.chakra_pairs import PairSlot, half_node, rendezvous
from flint.hardware_models.schedule import simulate, stream_of

@dataclass
class _GroupSlot:
    """A collective on a replica-groups communicator: template + this rank's pg_name."""
    index: int                 # canonical communicator
    body: bytes
    noop: bytes                # framed no-op for ranks outside every group
    cid: int
    deps: list[int]


class ChakraPlan:
    """`rank_bytes(r)` is the complete .et file of rank r."""

    def __init__(self, flat: WorkloadGraph, durations_s: list[float], annotate: bool,
                 dims: list[int] | None = None, hierarchical: frozenset = frozenset(),
                 rank_work: tuple = ({}, {})):
        """`annotate`: also write what Chakra has no field for (Flint's node record with
        exact flops and bytes, op class, meta; operand and result shapes), so that
        `flint import` rebuilds the graph exactly. Without it a file holds standard Chakra
        fields only: about a quarter of the bytes. `dims`: ranks per ASTRA-sim network
        dimension, innermost first; a communicator whose groups are whole dimensions is
        written with `involved_dim` instead of a process group, so that ASTRA-sim runs
        it with the per-dimension algorithms of system.json (it runs any process group
        smaller than the cluster as a plain ring). `hierarchical`: ids of the all-to-alls
        Flint prices DeepEP's way (domains of dims[0] ranks; chakra_alltoallv).
        `rank_work`: (seconds per EP position by node id, EP position by rank) of the
        expert nodes of a routed MoE graph (chakra_alltoallv.expert_work_by_rank)."""
        self.graph = flat
        self.dims = list(dims or [])
        self.hierarchical = hierarchical if self.dims else frozenset()
        self.rank_work, self.ep_position = rank_work
        self.devices = flat.cluster.devices
        self.stages = max(1, int(flat.meta.get("mpmd_devices", 1) or 1))
        if self.devices % self.stages:
            raise FlintError(f"{self.devices} ranks do not split into {self.stages} stages")
        self.per_stage = self.devices // self.stages
        self._canonical_communicators()
        self.header = self._header().SerializeToString()
        on = [n.device_or_0 if self.stages > 1 else 0 for n in flat.nodes]
        if any(not 0 <= s < self.stages for s in on):
            raise FlintError("a node's meta device is outside the graph's pipeline stages")
        sent = {i for n in flat.nodes if n.kind == NodeKind.RECV for i in n.inputs
                if flat.nodes[i].kind == NodeKind.SEND}
        self.segments: list[list[bytes]] = []
        self.slots: list[list] = []
        self.lanes: list[list[tuple]] = []       # per stage: what chakra_check simulates
        # Flint's issue times, with a stage's sends and receives on one stream: an
        # ASTRA-sim rank runs one transfer at a time, so the export's order must be one
        # that a single stream can keep (with duplex links the receive of one task and the
        # send of another may cross, and the clear-to-send handshakes would deadlock)
        self.start_s = simulate(flat, durations_s, duplex=False).start
        # ids and tags of the parts an all-to-all-v adds: above those of every node and transfer
        n = len(flat.nodes)
        self._next_id = 2 * n + 2
        self._next_tag = 4 * n + 2 * len(flat.communicators) + 2
        for stage in range(self.stages):
            self._encode_stage(stage, on, durations_s, annotate, sent)

    # --- communicators ------------------------------------------------------------
    def _canonical_communicators(self) -> None:
        """Communicators with the same groups are one Chakra process group set (pg ids are
        1-based and unique across the file set, one block per pipeline stage); rank ->
        group row per canonical one."""
        self.canonical: dict[int, int] = {}
        self.groups: list[np.ndarray] = []
        self.row_of: list[np.ndarray] = []      # [ranks per stage] group row, -1 if none
        self.pg_base: list[int] = []
        seen: dict[bytes, int] = {}
        next_pg = 1
        for comm in self.graph.communicators:
            if comm.kind != "groups":
                continue
            g = np.sort(np.asarray(comm.groups(), dtype=np.int64), axis=1)
            g = g[np.argsort(g[:, 0], kind="stable")] if len(g) else g.reshape(0, 1)
            if g.size and g.max() >= self.per_stage:
                raise FlintError(f"communicator {comm.id} names rank {int(g.max())}, outside "
                                 f"a pipeline stage's {self.per_stage} ranks")
            key = g.tobytes() + bytes(str(g.shape), "ascii")
            if key not in seen:
                seen[key] = len(self.groups)
                rows = np.full(self.per_stage, -1, dtype=np.int64)
                if g.size:
                    rows[g.ravel()] = np.repeat(np.arange(len(g)), g.shape[1])
                self.groups.append(g)
                self.row_of.append(rows)
                self.pg_base.append(next_pg)
                next_pg += len(g) * self.stages
            self.canonical[comm.id] = seen[key]
        self._pg_attr = [dict() for _ in self.groups]
        self.involved = [self._involved_dims(g) for g in self.groups]

    def _involved_dims(self, g: np.ndarray) -> list[bool] | None:
        """The network dimensions a communicator's groups span, when its groups (in every
        pipeline stage) are exactly the sets of ranks that differ only in those
        dimensions; else None."""
        if not self.dims or not g.size or int(np.prod(self.dims)) != self.devices:
            return None
        every = np.concatenate([g + s * self.per_stage for s in range(self.stages)])
        if len(np.unique(every)) != self.devices:
            return None
        npus = np.asarray(self.dims, dtype=np.int64)
        strides = np.concatenate([[1], np.cumprod(npus)[:-1]])
        coords = (every[:, :, None] // strides) % npus          # [groups, size, dims]
        varies = (coords != coords[:, :1]).any(axis=1)           # [groups, dims]
        if not (varies == varies[0]).all():
            return None
        if g.shape[1] != int(np.prod(npus[varies[0]])):
            return None
        return [bool(v) for v in varies[0]]

    def pg_id(self, k: int, stage: int, row: int) -> int:
        return self.pg_base[k] + stage * len(self.groups[k]) + row

    def comm_groups(self) -> dict[str, list[int]]:
        """The communicator-group JSON ASTRA-sim reads: {"pg id": [ranks]}."""
        out = {}
        for k, g in enumerate(self.groups):
            for stage in range(self.stages):
                offset = stage * self.per_stage
                for row, members in enumerate(g):
                    out[str(self.pg_id(k, stage, row))] = [int(r) + offset for r in members]
        return out

    def _pg(self, k: int, stage: int, row: int) -> bytes:
        cache = self._pg_attr[k]
        b = cache.get((stage, row))
        if b is None:
            holder = cf.Node(attr=[cf.Attr(name="pg_name",
                                           string_val=str(self.pg_id(k, stage, row)))])
            b = cache[(stage, row)] = holder.SerializeToString()
        return b

    # --- encoding -----------------------------------------------------------------
    def _header(self) -> cf.GlobalMetadata:
        g = self.graph
        info = {"format": "flint.chakra", "version": 2, "ids": ID_SCHEME, "dims": self.dims,
                "cluster": g.cluster.to_json(),
                "communicators": [c.to_json() for c in g.communicators], "meta": g.meta}
        return cf.GlobalMetadata(version=cf.ET_VERSION, attr=[
            cf.Attr(name="flint_graph", string_val=json.dumps(info, sort_keys=True,
                                                              separators=(",", ":")))])

    def _encode_stage(self, stage, on, durations_s, annotate, sent) -> None:
        flat = self.graph
        segments, slots, lane = [], [], []
        run: list[bytes] = []
        last_compute = None
        after = self._communication_order(stage, on, sent)
        modeled = written = 0.0        # running compute totals, microseconds
        n = len(flat.nodes)
        for node, d in zip(flat.nodes, durations_s):
            if on[node.id] != stage:
                continue
            c = node.collective
            comm = flat.communicators[c.communicator] if c is not None else None
            ctype = chakra_type(node)
            local = [x for x in node.inputs if on[x] == stage]
            control = [x for x in node.control if on[x] == stage]
            proto = self._template(node, comm, d, annotate, ctype, local, control)
            chain = set()
            communicates = ctype != cf.COMP or (comm is not None and comm.kind == "pairs")
            # A receive whose send comes earlier (a pipeline's) takes its place in the
            # order, as on Flint's one p2p stream; one whose send may come later (XLA's
            # SPMD send/recv) must not block the order: ASTRA-sim lets it wait aside.
            aside = node.kind == NodeKind.RECV and not any(x in sent for x in node.inputs)
            own_stream = bool(node.meta.get("stream"))
            if not own_stream:
                chain |= {last_compute} - {None}
            if communicates and not aside and node.id in after:
                chain.add(chakra_id(after[node.id]))
            if ctype == cf.COMP and not communicates:
                modeled += d * node.repeat * 1e6
                micros = max(1, round(modeled - written))
                written += micros
                proto.duration_micros = micros
            cts = None
            if rendezvous(node, sent, self.stages) and node.kind == NodeKind.RECV:
                cts = half_node(proto, cf.SEND, node.name + "/cts")
                add_ctrl(cts, chain)        # the clear-to-send takes the receive's place
                chain = {cts.id}
            elif rendezvous(node, sent, self.stages):
                cts = half_node(proto, cf.RECV, node.name + "/cts")
                chain.add(cts.id)           # the data waits for its receiver
            send_base = None
            if node.op == "collective-permute":
                send_base = cf.Node()
                send_base.CopyFrom(proto)
                send_base.id = chakra_id(node.id) - 1
                send_base.name = chakra_name(cf.SEND, node.name + "/send")
                add_ctrl(send_base, chain)
                chain = {send_base.id}
            add_ctrl(proto, chain)
            deps = sorted(set(proto.data_deps) | set(proto.ctrl_deps))
            if not communicates and not own_stream:
                last_compute = proto.id
            elif communicates and not aside and stream_of(node) == "compute":
                last_compute = proto.id           # a synchronous collective blocks compute
            sizes = per_peer(node, comm) if ctype == cf.COLL else None
            if sizes is not None:
                # an all-to-all: per-peer sends and receives (chakra_alltoallv)
                segments.append(b"".join(run))
                run.clear()
                slot = AllToAllvSlot(node, proto, comm, sizes, self._next_id, self._next_tag,
                                     stage, self.per_stage,
                                     self.dims[0] if node.id in self.hierarchical else 0,
                                     int(node.meta.get("moe_top_k") or 0))
                self._next_id += slot.extra_ids
                self._next_tag += slot.tags
                slots.append(slot)
                lane.extend(slot.lane())
            elif comm is not None and comm.kind == "groups" and ctype == cf.COLL \
                    and self.involved[self.canonical[comm.id]] is not None:
                # the same node on every rank: ASTRA-sim finds the group from the dims
                k = self.canonical[comm.id]
                proto.attr.insert(len(proto.attr) - (1 if annotate else 0), cf.Attr(
                    name="involved_dim", bool_list=cf.BoolList(values=self.involved[k])))
                run.append(cf.frame(proto))
                lane.append(("coll", proto.id, deps, (stage, k, describe(node))))
            elif comm is not None and comm.kind == "groups" and ctype == cf.COLL:
                k = self.canonical[comm.id]
                segments.append(b"".join(run))
                run.clear()
                slots.append(_GroupSlot(k, proto.SerializeToString(),
                                        cf.frame(p2p_node(proto, cf.COMP, 0, 0, 0, 0)),
                                        proto.id, deps))
                lane.append(("coll", proto.id, deps, (stage, k, describe(node))))
            elif comm is not None and comm.kind == "pairs":
                segments.append(b"".join(run))
                run.clear()
                if node.op == "collective-permute" or node.kind == NodeKind.SEND:
                    tag = node.id if (node.op == "collective-permute" or node.id in sent) \
                        else n + comm.id
                else:
                    tag = next((x for x in node.inputs if x in sent), n + comm.id)
                target_of, source_of = peers(comm)
                # a stage's own permute names the stage's ranks 0..per_stage-1; the
                # pipeline's transfers name the whole cluster's
                in_stage = self.stages > 1 and comm.num_devices == self.per_stage
                slot = PairSlot(node, tag, proto, send_base, target_of, source_of,
                                in_stage, self.stages, self.per_stage, cts, 2 * n + tag)
                slots.append(slot)
                lane.extend(slot.lane(stage, deps))
            elif node.id in self.rank_work:       # an expert's work: the rank's own load
                segments.append(b"".join(run))
                run.clear()
                slots.append(RankWorkSlot(proto, self.rank_work[node.id], node.repeat,
                                          self.ep_position, self.per_stage))
                lane.append(("comp", proto.id, deps, None))
            else:
                run.append(cf.frame(proto))
                lane.append(("comp", proto.id, deps, None))
        segments.append(b"".join(run))
        self.segments.append(segments)
        self.slots.append(slots)
        self.lanes.append(lane)

    def _communication_order(self, stage: int, on: list[int], sent: set) -> dict[int, int]:
        """{node: the communication node before it in its stage's one order}: the nodes
        that take a place in the order (every collective, send and permute, and receives
        whose send comes earlier), sorted by when Flint's schedule starts them. Every
        dependency the export writes goes from an earlier start to a later one (ties in
        program order), so the order adds no cycle."""
        flat, placed = self.graph, []
        for node in flat.nodes:
            if on[node.id] != stage:
                continue
            c = node.collective
            pairs = c is not None and flat.communicators[c.communicator].kind == "pairs"
            if chakra_type(node) == cf.COMP and not pairs:
                continue
            if node.kind == NodeKind.RECV and not any(x in sent for x in node.inputs):
                continue                          # waits aside, keeps no place
            if node.kind == NodeKind.SEND and rendezvous(node, sent, self.stages):
                continue                          # waits for its receiver, aside
            placed.append(node.id)
        placed.sort(key=lambda i: (self.start_s[i], i))
        return dict(zip(placed[1:], placed))

    def _template(self, node: Node, comm: Communicator | None, seconds: float,
                  annotate: bool, ctype: int, inputs: list[int], control: list[int]) -> cf.Node:
        c = node.collective
        data = sorted({chakra_id(x) for x in inputs})
        p = cf.Node(id=chakra_id(node.id), name=chakra_name(ctype, node.name), type=ctype,
                    data_deps=data,
                    ctrl_deps=sorted({chakra_id(x) for x in control} - set(data)),
                    duration_micros=max(0, round(seconds * node.repeat * 1e6)))
        if annotate:
            p.inputs.shapes = json.dumps(node.operands, separators=(",", ":"))
            p.outputs.shapes = json.dumps(node.outputs, separators=(",", ":"))
        moved = round(node.bytes_read + node.bytes_written)
        # At least 1 op and 1 byte: ASTRA-sim's roofline takes num_ops / min(peak,
        # bw x num_ops / tensor_size), which is 0/0 for a pure copy with num_ops 0 and
        # exactly tensor_size / bw with num_ops 1.
        # ASTRA-sim runs one GPU compute node per NPU at a time; its one other compute
        # resource is the host's. Compute on a framework's own stream (FSDP2's copy-in
        # kernels on its all-gather stream) goes there, so that it runs beside the
        # compute stream, one node at a time, as Flint's schedule runs that stream.
        side = ctype == cf.COMP and bool(node.meta.get("stream"))
        p.attr.extend([cf.Attr(name="is_cpu_op", bool_val=side),
                       cf.Attr(name="num_ops", int64_val=max(1, round(node.flops * node.repeat))),
                       cf.Attr(name="tensor_size", uint64_val=max(1, moved * node.repeat))])
        if c is not None and c.type in cf.SIMULATED:
            p.attr.extend([cf.Attr(name="comm_type", int64_val=cf.SIMULATED[c.type]),
                           cf.Attr(name="comm_size", int64_val=comm_size(c, comm))])
        if annotate:
            p.attr.append(cf.Attr(name=FLINT_NODE, string_val=flint_record(node)))
        return p

    # --- per rank -----------------------------------------------------------------
    def rank_bytes(self, rank: int) -> bytes:
        # `attr` is GlobalMetadata's last field too: the rank attribute is appended bytes.
        rank_attr = cf.GlobalMetadata(attr=[cf.Attr(name="rank", int64_val=rank)])
        tail = rank_attr.SerializeToString()
        stage, local = divmod(rank, self.per_stage)
        segments = self.segments[stage]
        parts = [cf.varint(len(self.header) + len(tail)), self.header, tail, segments[0]]
        for slot, seg in zip(self.slots[stage], segments[1:]):
            if isinstance(slot, _GroupSlot):
                row = int(self.row_of[slot.index][local])
                if row < 0:
                    parts.append(slot.noop)
                else:
                    pg = self._pg(slot.index, stage, row)
                    parts.append(cf.varint(len(slot.body) + len(pg)))
                    parts.append(slot.body)
                    parts.append(pg)
            else:
                parts.extend(slot.rank_nodes(rank))
            parts.append(seg)
        return b"".join(parts)
