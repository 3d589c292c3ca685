"""Chakra node pieces Flint's exporter writes and its importer reads back: the id scheme
(Flint node i is Chakra id 2i+1, a permute's SEND half 2i), typed names, Flint's own
record attribute, point-to-point halves, and the rank groups of ASTRA-sim's `involved_dim`.
"""
from __future__ import annotations

import json
import re

from flint.exporters import chakra_format as cf
from flint.graph import Communicator, Node, NodeKind

FLINT_NODE = "flint_node"      # attribute holding what Chakra has no field for (round trip)
FLINT_PART = "flint_part"      # on the extra node 2i: a permute's "send", a "clear-to-send"
ID_SCHEME = "2i+1"             # header field naming how Chakra ids map to Flint ids
_UNSAFE = re.compile(r"[,=\r\n]")   # separators of ASTRA-sim's trace lines
_TYPED = re.compile(r"^[A-Z_]+_NODE:")


def chakra_id(flint_id: int) -> int:
    return 2 * flint_id + 1


def flint_id(cid: int) -> int:
    return cid >> 1


def chakra_name(kind: int, name: str) -> str:
    return f"{cf.Node.DESCRIPTOR.fields_by_name['type'].enum_type.values_by_number[kind].name}:" \
           + _UNSAFE.sub("_", name)


def plain_name(name: str) -> str:
    """A Flint-written Chakra name without its node-type prefix."""
    return _TYPED.sub("", name, count=1)


def add_ctrl(p: cf.Node, extra: set) -> None:
    if extra - set(p.ctrl_deps) - set(p.data_deps):
        p.ctrl_deps[:] = sorted((set(p.ctrl_deps) | extra) - set(p.data_deps))


def describe(node: Node) -> str:
    return f"{node.op} {node.name!r}"


def flint_record(node: Node) -> str:
    """The Node as Flint's JSON minus what the Chakra fields already say (id, name when
    the Chakra name keeps it, dependencies, shapes)."""
    d = node.to_json()
    for key in ("id", "operands", "outputs"):
        del d[key]
    if not _UNSAFE.search(node.name):
        del d["name"]
    if node.inputs == sorted(set(node.inputs)):
        del d["inputs"]           # data_deps say it
    return json.dumps(d, sort_keys=True, separators=(",", ":"))


def chakra_type(node: Node) -> int:
    if node.kind == NodeKind.SEND:
        return cf.SEND
    if node.kind == NodeKind.RECV:
        return cf.RECV
    if node.collective is not None and node.collective.type in cf.SIMULATED:
        return cf.COLL
    return cf.COMP


def comm_size(c, comm: Communicator) -> int:
    """Bytes of this rank's input buffer (ASTRA-sim's meaning for all four types). A
    broadcast of S bytes is written as an all-gather of S/p-byte shards."""
    if c.type == "collective-broadcast":
        return max(1, c.bytes_in // max(comm.size, 1))
    return max(0, c.bytes_in)


def peers(comm: Communicator) -> tuple[dict[int, int], dict[int, int]]:
    """(source -> target, target -> source) of a pairs communicator, built once."""
    pairs = comm.groups()
    return ({int(s): int(t) for s, t in pairs}, {int(t): int(s) for s, t in pairs})


def p2p_node(base: cf.Node, kind: int, src: int, dst: int, tag: int, size: int) -> cf.Node:
    """`base` as a SEND or RECV between src and dst, or as a zero-time COMP no-op (what a
    rank outside a collective's groups, or outside a transfer, runs in its place)."""
    q = cf.Node()
    q.CopyFrom(base)
    q.type = kind
    q.name = chakra_name(kind, plain_name(base.name))
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


def dimension_group(rank: int, dims: list[int], involved: list[bool]) -> list[int]:
    """The ranks that differ from `rank` only in the involved network dimensions (ranks
    fill dimension 0 first), as ASTRA-sim forms a group from `involved_dim`."""
    strides, s = [], 1
    for d in dims:
        strides.append(s)
        s *= d
    members = [rank]
    for d, stride, used in zip(dims, strides, involved):
        if used:
            base = [r - (r // stride % d) * stride for r in members]
            members = [b + i * stride for b in base for i in range(d)]
    return sorted(members)
