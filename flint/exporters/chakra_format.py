"""The MLCommons Chakra execution-trace format, through the `mlc-chakra` package.

Schema (`et_def.proto` messages) and framing (each message preceded by its length as a
varint) both come from mlc-chakra; this module only adapts them: strict reading that names
what is wrong with a file, and a cache of length prefixes for the exporter's fast path.

Facts the readers (ASTRA-sim's ETFeeder, Chakra's own tools) rely on, kept here in one place:
- a file is GlobalMetadata then Nodes, never gzipped; one file per rank, `<prefix>.<rank>.et`;
- ASTRA-sim simulates four collective types (ALL_REDUCE, ALL_GATHER, ALL_TO_ALL,
  REDUCE_SCATTER); comm_size is this rank's input buffer in bytes;
- attribute types: is_cpu_op bool, comm_type/comm_size/num_ops int64, tensor_size uint64,
  comm_src/comm_dst/comm_tag int32, pg_name string.
"""
from __future__ import annotations

import io
from functools import lru_cache
from pathlib import Path

from chakra.schema.protobuf import et_def_pb2 as pb
from chakra.src.third_party.utils.protolib import _DecodeVarint32, _EncodeVarint32
from google.protobuf.message import DecodeError

from flint.errors import FlintError

ET_VERSION = "1.0.0"          # what mlc-chakra's own generator writes in GlobalMetadata
Node = pb.Node
GlobalMetadata = pb.GlobalMetadata
Attr = pb.AttributeProto
BoolList = pb.BoolList

COMP, COLL, SEND, RECV = pb.COMP_NODE, pb.COMM_COLL_NODE, pb.COMM_SEND_NODE, pb.COMM_RECV_NODE
MEM_LOAD, MEM_STORE, METADATA = pb.MEM_LOAD_NODE, pb.MEM_STORE_NODE, pb.METADATA_NODE
INVALID = pb.INVALID_NODE

# Flint collective -> the Chakra type ASTRA-sim simulates for it. A broadcast of S bytes
# moves what an all-gather of S/p-byte shards moves (ring broadcast and ring all-gather
# both send (p-1)/p x S per rank), so it is written as one; the original type is kept in
# a Flint attribute.
SIMULATED = {
    "all-reduce": pb.ALL_REDUCE, "all-gather": pb.ALL_GATHER,
    "reduce-scatter": pb.REDUCE_SCATTER, "all-to-all": pb.ALL_TO_ALL,
    "ragged-all-to-all": pb.ALL_TO_ALL, "collective-broadcast": pb.ALL_GATHER,
}
# Chakra type -> the Flint collective the cost model prices it as, on import. Types
# ASTRA-sim does not simulate map to the nearest one that moves at least as much data.
FROM_CHAKRA = {
    pb.ALL_REDUCE: "all-reduce", pb.ALL_GATHER: "all-gather",
    pb.REDUCE_SCATTER: "reduce-scatter", pb.REDUCE_SCATTER_BLOCK: "reduce-scatter",
    pb.ALL_TO_ALL: "all-to-all", pb.BROADCAST: "collective-broadcast",
    pb.REDUCE: "all-reduce", pb.GATHER: "all-gather", pb.SCATTER: "collective-broadcast",
    pb.BARRIER: "all-reduce",
}


def chakra_type_name(value: int) -> str:
    return pb.CollectiveCommType.Name(value)


@lru_cache(maxsize=1 << 16)
def varint(n: int) -> bytes:
    """The length prefix mlc-chakra's `encodeMessage` writes before a message of n bytes."""
    buf = io.BytesIO()
    _EncodeVarint32(buf, n)
    return buf.getvalue()


def frame(message) -> bytes:
    body = message.SerializeToString()
    return varint(len(body)) + body


def read_et(path) -> tuple[GlobalMetadata, list[Node]]:
    """Every message of one .et file; a truncated, gzipped or corrupt file is a FlintError."""
    path = Path(path)
    if not path.is_file():
        raise FlintError(f"file not found: {path}")
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        raise FlintError(f"{path} is gzip-compressed; Chakra ET files are never compressed "
                         f"(gunzip it first)")
    stream = io.BytesIO(data)
    messages: list[bytes] = []
    while stream.tell() < len(data):
        at = stream.tell()
        try:
            size, _ = _DecodeVarint32(stream)
        except IOError:
            raise FlintError(f"{path} is corrupt: a bad length prefix at byte {at}") from None
        body = stream.read(size)
        if len(body) < size:
            raise FlintError(f"{path} is truncated: message {len(messages)} at byte {at} "
                             f"needs {size} bytes, {len(body)} are left")
        messages.append(body)
    if not messages:
        raise FlintError(f"{path} is empty: a Chakra ET starts with GlobalMetadata")
    meta = GlobalMetadata()
    nodes = []
    try:
        meta.ParseFromString(messages[0])
        for body in messages[1:]:
            node = Node()
            node.ParseFromString(body)
            nodes.append(node)
    except DecodeError as e:
        raise FlintError(f"{path} is corrupt: message {len(nodes) + 1} does not parse as a "
                         f"Chakra node ({e})") from None
    return meta, nodes


def attrs(message) -> dict:
    """name -> Python value of a node's (or the metadata's) attributes."""
    out = {}
    for a in message.attr:
        kind = a.WhichOneof("value")
        if kind is None:
            out[a.name] = None
            continue
        value = getattr(a, kind)
        out[a.name] = list(value.values) if kind.endswith("_list") else value
    return out
