"""Point-to-point traffic of a Chakra export: a collective-permute, send or recv becomes
COMM_SEND / COMM_RECV nodes for the ranks that take part, built per rank with protobuf
(chakra_plan encodes everything else once).

Peers: an SPMD program names its pairs by rank. A pipeline's transfers (passes/pipeline.py)
name them by each stage's first rank: rank l of a stage talks to rank l of the peer stage;
a permute inside one stage's program names that stage's own ranks 0..per_stage-1.

A pipeline transfer (a SEND/RECV pair between stages) is a rendezvous in Flint's schedule,
as NCCL's send/recv are: the data moves once the sender has issued it and the receiver
has got to its receive. ASTRA-sim moves a SEND's data at once and lets a late receive
complete on arrival, so the export writes the handshake a rendezvous protocol uses: the
receiver, at its receive's place, sends a 1-byte clear-to-send to the sender (id 2i,
beside the RECV); the sender's data SEND waits for it (a RECV with id 2i beside the
SEND) and then for the communication resource, outside the chain (Flint's sender does
not wait in line for its receiver). ASTRA-sim still simulates the data transfer itself;
the handshake adds one small message's latency per transfer.
"""
from __future__ import annotations

from dataclasses import dataclass

from flint.exporters import chakra_format as cf
from flint.exporters.chakra_nodes import FLINT_PART, chakra_name, describe, p2p_node
from flint.graph import Node, NodeKind

CLEAR_TO_SEND = 1       # bytes of a pipeline transfer's handshake message


def rendezvous(node: Node, sent: set, stages: int) -> bool:
    """A transfer between pipeline stages (both halves in the graph): `sent` holds the
    SENDs a RECV of the graph reads."""
    if stages == 1:
        return False
    if node.kind == NodeKind.SEND:
        return node.id in sent
    return node.kind == NodeKind.RECV and any(x in sent for x in node.inputs)


def half_node(proto: cf.Node, kind: int, name: str) -> cf.Node:
    """An extra node with id 2i beside node i (2i+1), without dependencies."""
    half = cf.Node()
    half.CopyFrom(proto)
    half.id = proto.id - 1
    half.type = kind
    half.name = chakra_name(kind, name)
    del half.data_deps[:]
    del half.ctrl_deps[:]
    return half


@dataclass
class PairSlot:
    """A permute / send / recv: SEND and RECV nodes for the ranks that take part."""
    node: Node
    tag: int
    base: "cf.Node"            # template proto of the node (id 2i+1), specialized per rank
    send_base: "cf.Node | None"   # a permute's SEND half (id 2i)
    target_of: dict            # source rank -> target rank
    source_of: dict            # target rank -> source rank
    in_stage: bool             # pairs of one stage's SPMD program (its own rank numbers)
    stages: int
    per_stage: int
    cts: "cf.Node | None" = None  # a pipeline transfer's clear-to-send half (id 2i)
    cts_tag: int = 0

    def peer(self, table: dict, rank: int):
        """A rank's peer in `table` (target_of or source_of), or None."""
        if self.stages == 1:
            return table.get(rank)
        first, local = rank - rank % self.per_stage, rank % self.per_stage
        if self.in_stage:
            peer = table.get(local)
            return None if peer is None else first + peer
        peer = table.get(first)
        return None if peer is None else peer + local

    def lane(self, stage: int, deps: list[int]) -> list[tuple]:
        """The SEND/RECV a stage's ranks run, as chakra_check sees them: ranks of one
        stage are alike, so one lane per stage stands for all of them."""
        node, out = self.node, []
        ranks = range(stage * self.per_stage, (stage + 1) * self.per_stage)
        targets = {self.peer(self.target_of, r) for r in ranks} - {None}
        sources = {self.peer(self.source_of, r) for r in ranks} - {None}
        send_id = self.send_base.id if self.send_base is not None else self.base.id
        send_deps = sorted(set(self.send_base.data_deps) | set(self.send_base.ctrl_deps)) \
            if self.send_base is not None else deps
        to = sorted({t // self.per_stage for t in targets})
        frm = sorted({s // self.per_stage for s in sources})
        if self.cts is not None:
            cts_deps = sorted(set(self.cts.data_deps) | set(self.cts.ctrl_deps))
            peer = frm if node.kind == NodeKind.RECV else to
            out.append(("send" if node.kind == NodeKind.RECV else "recv", self.cts.id,
                        cts_deps, (peer, self.cts_tag, describe(node) + " clear-to-send")))
        if node.op == "collective-permute" or node.kind == NodeKind.SEND:
            out.append(("send" if to else "comp", send_id, send_deps,
                        (to, self.tag, describe(node))))
        if node.op == "collective-permute" or node.kind == NodeKind.RECV:
            out.append(("recv" if frm else "comp", self.base.id, deps,
                        (frm, self.tag, describe(node))))
        return out

    def rank_nodes(self, rank: int) -> list[bytes]:
        """The framed nodes rank `rank` runs (a zero-time COMP in place of a transfer it
        takes no part in)."""
        target = self.peer(self.target_of, rank)
        source = self.peer(self.source_of, rank)
        node, c = self.node, self.node.collective
        out = []
        if self.cts is not None:
            peer = source if node.kind == NodeKind.RECV else target
            if peer is None:
                half = p2p_node(self.cts, cf.COMP, rank, rank, self.cts_tag, 0)
            elif node.kind == NodeKind.RECV:
                half = p2p_node(self.cts, cf.SEND, rank, peer, self.cts_tag, CLEAR_TO_SEND)
            else:
                half = p2p_node(self.cts, cf.RECV, peer, rank, self.cts_tag, CLEAR_TO_SEND)
            half.attr.append(cf.Attr(name=FLINT_PART, string_val="clear-to-send"))
            out.append(cf.frame(half))
        if node.op == "collective-permute":
            sends = target is not None and not (target == rank and source == rank)
            half = p2p_node(self.send_base, cf.SEND if sends else cf.COMP, rank,
                            target if sends else rank, self.tag, c.bytes_in if sends else 0)
            half.attr.append(cf.Attr(name=FLINT_PART, string_val="send"))
            out.append(cf.frame(half))
            if target == rank and source == rank:
                local = p2p_node(self.base, cf.COMP, rank, rank, self.tag, 0)
                local.duration_micros = max(1, self.base.duration_micros)  # a copy to itself
                out.append(cf.frame(local))
                return out
        elif node.kind == NodeKind.SEND:
            kind = cf.SEND if target is not None else cf.COMP
            out.append(cf.frame(p2p_node(self.base, kind, rank, target if target is not None
                                         else rank, self.tag, c.bytes_in)))
            return out
        if source is not None:
            out.append(cf.frame(p2p_node(self.base, cf.RECV, source, rank, self.tag,
                                         c.bytes_out)))
        else:
            out.append(cf.frame(p2p_node(self.base, cf.COMP, rank, rank, self.tag, 0)))
        return out
