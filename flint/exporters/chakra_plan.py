"""Encode a workload graph as Chakra nodes once, then specialize it per rank cheaply.

Ranks of an SPMD program run the same nodes; they differ only in who their peers are. So
every node is serialized once. A collective's bytes are its rank-independent part
followed by one `pg_name` attribute naming this rank's group: `attr` is the last field of
a Chakra Node, and protobuf parses a message followed by more fields of it as the merged
message, so `template + pg_attr` is byte for byte what serializing the whole node gives
(a test checks this against mlc-chakra's own encoder). A rank's file is then a join of
constant runs and per-rank pieces: O(collectives) work per rank, not O(nodes).

Point-to-point traffic (collective-permute, send, recv) becomes COMM_SEND / COMM_RECV
pairs per rank, built with protobuf for the ranks that take part.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from flint.exporters import chakra_format as cf
from flint.graph import Communicator, Node, NodeKind, WorkloadGraph

FLINT_NODE = "flint_node"      # attribute holding what Chakra has no field for (round trip)
FLINT_PART = "flint_part"      # "send" on the extra SEND node a collective-permute makes


@dataclass
class _GroupSlot:
    """A collective on a replica-groups communicator: template + this rank's pg_name."""
    index: int                 # canonical communicator
    body: bytes
    noop: bytes                # framed no-op for ranks outside every group


@dataclass
class _PairSlot:
    """A permute / send / recv: SEND and RECV nodes for the ranks that take part."""
    node: Node
    extra_id: int              # id of the SEND a collective-permute adds
    tag: int
    base: "cf.Node"            # template proto, specialized per rank
    target_of: dict            # source rank -> target rank
    source_of: dict            # target rank -> source rank


class ChakraPlan:
    """`rank_bytes(r)` is the complete .et file of rank r."""

    def __init__(self, flat: WorkloadGraph, durations_s: list[float], annotate: bool):
        """`annotate`: also write what Chakra has no field for (Flint's node record with
        exact flops and bytes, op class, meta; operand and result shapes), so that
        `flint import` rebuilds the graph exactly. Without it a file holds standard Chakra
        fields only: about a quarter of the bytes."""
        self.graph = flat
        self.devices = flat.cluster.devices
        self._canonical_communicators()
        self.segments: list[bytes] = []
        self.slots: list[_GroupSlot | _PairSlot] = []
        self.header = self._header().SerializeToString()
        run: list[bytes] = []
        last_on: dict[int, int] = {}
        extra = extra_tag = len(flat.nodes)
        for node, d in zip(flat.nodes, durations_s):
            c = node.collective
            comm = flat.communicators[c.communicator] if c is not None else None
            proto = self._template(node, comm, d, annotate)
            if comm is not None and comm.kind == "groups":
                k = self.canonical[comm.id]
                if k in last_on:   # members issue a communicator's collectives in one order
                    proto.ctrl_deps[:] = sorted(set(proto.ctrl_deps) | {last_on[k]})
                last_on[k] = node.id
                self._flush(run)
                self.slots.append(_GroupSlot(k, proto.SerializeToString(),
                                             cf.frame(_p2p(proto, cf.COMP, 0, 0, 0, 0))))
            elif comm is not None:
                self._flush(run)
                # A permute's SEND and RECV share its node id as tag; a send and its recv
                # are separate nodes that share only their communicator.
                tag = node.id if node.op == "collective-permute" else extra_tag + comm.id
                self.slots.append(_PairSlot(node, extra, tag, proto, *_peers(comm)))
                extra += node.op == "collective-permute"
            else:
                run.append(cf.frame(proto))
        self._flush(run)

    # --- communicators ------------------------------------------------------------
    def _canonical_communicators(self) -> None:
        """Communicators with the same groups are one Chakra process group set (pg ids are
        1-based and unique across the file set); rank -> group row per canonical one."""
        self.canonical: dict[int, int] = {}
        self.groups: list[np.ndarray] = []
        self.row_of: list[np.ndarray] = []      # [devices] group row, -1 if not a member
        self.pg_base: list[int] = []
        seen: dict[bytes, int] = {}
        next_pg = 1
        for comm in self.graph.communicators:
            if comm.kind != "groups":
                continue
            g = np.sort(np.asarray(comm.groups(), dtype=np.int64), axis=1)
            g = g[np.argsort(g[:, 0], kind="stable")] if len(g) else g.reshape(0, 1)
            key = g.tobytes() + bytes(str(g.shape), "ascii")
            if key not in seen:
                seen[key] = len(self.groups)
                rows = np.full(self.devices, -1, dtype=np.int64)
                if g.size:
                    rows[g.ravel()] = np.repeat(np.arange(len(g)), g.shape[1])
                self.groups.append(g)
                self.row_of.append(rows)
                self.pg_base.append(next_pg)
                next_pg += len(g)
            self.canonical[comm.id] = seen[key]
        self._pg_attr = [dict() for _ in self.groups]

    def comm_groups(self) -> dict[str, list[int]]:
        """The communicator-group JSON ASTRA-sim reads: {"pg id": [ranks]}."""
        out = {}
        for base, g in zip(self.pg_base, self.groups):
            for row, members in enumerate(g):
                out[str(base + row)] = [int(r) for r in members]
        return out

    def _pg(self, k: int, row: int) -> bytes:
        cache = self._pg_attr[k]
        b = cache.get(row)
        if b is None:
            holder = cf.Node(attr=[cf.Attr(name="pg_name", string_val=str(self.pg_base[k] + row))])
            b = cache[row] = holder.SerializeToString()
        return b

    # --- encoding -----------------------------------------------------------------
    def _header(self) -> cf.GlobalMetadata:
        g = self.graph
        info = {"format": "flint.chakra", "version": 1, "cluster": g.cluster.to_json(),
                "communicators": [c.to_json() for c in g.communicators], "meta": g.meta}
        return cf.GlobalMetadata(version=cf.ET_VERSION, attr=[
            cf.Attr(name="flint_graph", string_val=json.dumps(info, sort_keys=True,
                                                              separators=(",", ":")))])

    def _template(self, node: Node, comm: Communicator | None, seconds: float,
                  annotate: bool) -> cf.Node:
        c = node.collective
        p = cf.Node(id=node.id, name=node.name, type=_chakra_type(node),
                    data_deps=sorted(set(node.inputs)), ctrl_deps=sorted(set(node.control)),
                    duration_micros=max(0, round(seconds * node.repeat * 1e6)))
        if annotate:
            p.inputs.shapes = json.dumps(node.operands, separators=(",", ":"))
            p.outputs.shapes = json.dumps(node.outputs, separators=(",", ":"))
        moved = round(node.bytes_read + node.bytes_written)
        # At least 1 op and 1 byte: ASTRA-sim's roofline takes num_ops / min(peak,
        # bw x num_ops / tensor_size), which is 0/0 for a pure copy with num_ops 0 and
        # exactly tensor_size / bw with num_ops 1.
        p.attr.extend([cf.Attr(name="is_cpu_op", bool_val=False),
                       cf.Attr(name="num_ops", int64_val=max(1, round(node.flops * node.repeat))),
                       cf.Attr(name="tensor_size", uint64_val=max(1, moved * node.repeat))])
        if c is not None and c.type in cf.SIMULATED:
            p.attr.extend([cf.Attr(name="comm_type", int64_val=cf.SIMULATED[c.type]),
                           cf.Attr(name="comm_size", int64_val=_comm_size(c, comm))])
        if annotate:
            p.attr.append(cf.Attr(name=FLINT_NODE, string_val=_flint_record(node)))
        return p

    def _flush(self, run: list[bytes]) -> None:
        self.segments.append(b"".join(run))
        run.clear()

    # --- per rank -----------------------------------------------------------------
    def rank_bytes(self, rank: int) -> bytes:
        # `attr` is GlobalMetadata's last field too: the rank attribute is appended bytes.
        rank_attr = cf.GlobalMetadata(attr=[cf.Attr(name="rank", int64_val=rank)])
        tail = rank_attr.SerializeToString()
        parts = [cf.varint(len(self.header) + len(tail)), self.header, tail, self.segments[0]]
        for slot, seg in zip(self.slots, self.segments[1:]):
            if isinstance(slot, _GroupSlot):
                row = int(self.row_of[slot.index][rank])
                if row < 0:
                    parts.append(slot.noop)
                else:
                    pg = self._pg(slot.index, row)
                    parts.append(cf.varint(len(slot.body) + len(pg)))
                    parts.append(slot.body)
                    parts.append(pg)
            else:
                parts.extend(_pair_nodes(slot, rank))
            parts.append(seg)
        return b"".join(parts)


def _flint_record(node: Node) -> str:
    """The Node as Flint's JSON minus what the Chakra fields already say (id, name,
    dependencies, shapes)."""
    d = node.to_json()
    for key in ("id", "name", "operands", "outputs"):
        del d[key]
    if node.inputs == sorted(set(node.inputs)):
        del d["inputs"]           # data_deps say it
    return json.dumps(d, sort_keys=True, separators=(",", ":"))


def _chakra_type(node: Node) -> int:
    if node.kind == NodeKind.SEND:
        return cf.SEND
    if node.kind == NodeKind.RECV:
        return cf.RECV
    if node.collective is not None and node.collective.type in cf.SIMULATED:
        return cf.COLL
    return cf.COMP


def _comm_size(c, comm: Communicator) -> int:
    """Bytes of this rank's input buffer (ASTRA-sim's meaning for all four types). A
    broadcast of S bytes is written as an all-gather of S/p-byte shards."""
    if c.type == "collective-broadcast":
        return max(1, c.bytes_in // max(comm.size, 1))
    return max(0, c.bytes_in)


def _peers(comm: Communicator) -> tuple[dict[int, int], dict[int, int]]:
    """(source -> target, target -> source) of a pairs communicator, built once."""
    pairs = comm.groups()
    return ({int(s): int(t) for s, t in pairs}, {int(t): int(s) for s, t in pairs})


def _pair_nodes(slot: _PairSlot, rank: int) -> list[bytes]:
    target, source = slot.target_of.get(rank), slot.source_of.get(rank)
    node, c = slot.node, slot.node.collective
    if node.op == "collective-permute" and target == rank and source == rank:
        local = _p2p(slot.base, cf.COMP, rank, rank, slot.tag, 0)
        local.duration_micros = slot.base.duration_micros     # a copy to itself
        return [cf.frame(local)]
    out = []
    if node.kind == NodeKind.SEND or node.op == "collective-permute":
        if target is not None:
            send = _p2p(slot.base, cf.SEND, rank, target, slot.tag, c.bytes_in)
            if node.op == "collective-permute":
                send.id = slot.extra_id
                send.name = node.name + "/send"
                send.attr.append(cf.Attr(name=FLINT_PART, string_val="send"))
            out.append(cf.frame(send))
        elif node.kind == NodeKind.SEND:
            out.append(cf.frame(_p2p(slot.base, cf.COMP, rank, rank, slot.tag, 0)))
    if node.kind == NodeKind.RECV or node.op == "collective-permute":
        if source is not None:
            out.append(cf.frame(_p2p(slot.base, cf.RECV, source, rank, slot.tag,
                                     c.bytes_out)))
        else:
            out.append(cf.frame(_p2p(slot.base, cf.COMP, rank, rank, slot.tag, 0)))
    return out


def _p2p(base: cf.Node, kind: int, src: int, dst: int, tag: int, size: int) -> cf.Node:
    """`base` as a SEND or RECV between src and dst, or as a zero-time COMP no-op (what a
    rank outside a collective's groups, or outside a transfer, runs in its place)."""
    q = cf.Node()
    q.CopyFrom(base)
    q.type = kind
    flint = [a for a in q.attr if a.name == FLINT_NODE]
    keep = [a for a in q.attr if a.name in ("is_cpu_op", "num_ops", "tensor_size")]
    del q.attr[:]
    q.attr.extend(keep)
    if kind == cf.COMP:
        q.duration_micros = 0
    else:
        q.attr.extend([cf.Attr(name="comm_src", int32_val=src),
                       cf.Attr(name="comm_dst", int32_val=dst),
                       cf.Attr(name="comm_tag", int32_val=tag),
                       cf.Attr(name="comm_size", int64_val=max(0, size))])
    q.attr.extend(flint)
    return q
