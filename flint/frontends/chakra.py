"""`flint import`: Chakra execution traces -> WorkloadGraph.

    graph = import_chakra("out/")                 # a directory of <prefix>.<rank>.et
    graph = import_chakra("trace.3.et", comm_groups="comm_groups.json")

A file Flint annotated (its `flint_node` records) comes back exactly as the loop-free graph
that was exported. Any other ET (Chakra's PyTorch converter, its generator, ASTRA-sim
examples, Flint's un-annotated ranks) is read by Chakra's own meaning:
- COMP_NODE: `num_ops` and `tensor_size` when present (priced by the roofline), else the
  recorded `duration_micros` (meta `recorded_s`). In a trace that has device nodes,
  host-side (`is_cpu_op`) nodes cost nothing: their time overlaps the device's, and
  their dependencies are kept.
- COMM_COLL_NODE: `comm_type`, `comm_size` (this rank's input bytes) and the group that
  `pg_name` names in the communicator-group JSON (all ranks when there is none).
- COMM_SEND/RECV_NODE: a point-to-point transfer between `comm_src` and `comm_dst`.
- METADATA_NODE: dropped; whoever depended on it inherits its dependencies.
A missing dependency, a cycle, a duplicate id or an unknown collective type is a FlintError.
"""
from __future__ import annotations

import heapq
import json
import re
from pathlib import Path
from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict

from flint.cluster import MAX_DEVICES, Cluster
from flint.errors import FlintError
from flint.exporters import chakra_format as cf
from flint.exporters.chakra_nodes import (FLINT_NODE, FLINT_PART, ID_SCHEME, dimension_group,
                                         flint_id, plain_name)
from flint.graph import Collective, Communicator, Node, NodeKind, WorkloadGraph
from flint.graph_schema import ClusterSchema, CommunicatorSchema, check_node_json
from flint.schema import Bool, Int, NonNegInt, NonNegNumber, Str, Strict, validated
from flint.passes.lower_collectives import CommunicatorTable

_RANK_FILE = re.compile(r"^(?P<prefix>.+)\.(?P<rank>\d+)\.et$")


def import_chakra(path, rank: int | None = None, comm_groups=None) -> WorkloadGraph:
    path = Path(path)
    ranks_seen = 1
    if path.is_dir():
        files = _rank_files(path)
        ranks_seen = files
        if rank is None:
            rank = min(files)
        if rank not in files:
            raise FlintError(f"{path} has no rank {rank} (ranks {min(files)}-{max(files)})")
        file = files[rank]
        if comm_groups is None and (path / "comm_groups.json").is_file():
            comm_groups = path / "comm_groups.json"
    else:
        file = path
        m = _RANK_FILE.match(path.name)
        if rank is None:
            rank = int(m.group("rank")) if m else 0
    groups = _read_comm_groups(comm_groups) if comm_groups is not None else {}
    _refuse_json(file)
    meta, nodes = cf.read_et(file)
    order = _checked_order(nodes, file)
    header = cf.attrs(meta)
    info = _graph_record(header["flint_graph"], file) if "flint_graph" in header else None
    if info is not None and all(_is_annotated(n) for n in nodes):
        return _rebuild_flint(info, nodes, file)
    return _ChakraReader(file, rank, groups, info, ranks_seen).read(nodes, order)


# --- records: the schemas of what Flint (and Chakra) put in a file ---------------------
class _GraphRecord(Strict):
    """The rank-0 metadata record `flint_graph` (flint/exporters/chakra_plan.py writes it)."""

    format: Literal["flint.chakra"] = "flint.chakra"
    version: Literal[1, 2] = 1      # 2: Chakra ids are 2i+1 (`ids`), network `dims` recorded
    ids: Optional[Literal["2i+1"]] = None
    dims: Optional[list[int]] = None     # ranks per network dimension
    cluster: ClusterSchema
    communicators: list[CommunicatorSchema]
    meta: dict = {}


class _ChakraAttrs(BaseModel):
    """The Chakra node attributes Flint reads (others are Chakra's own and left alone)."""

    model_config = ConfigDict(extra="ignore")
    comm_size: Optional[NonNegInt] = None
    comm_type: Optional[NonNegInt] = None
    comm_src: Optional[NonNegInt] = None
    comm_dst: Optional[NonNegInt] = None
    num_ops: Optional[NonNegNumber] = None
    tensor_size: Optional[NonNegNumber] = None
    is_cpu_op: Optional[Bool] = None
    pg_name: Optional[Union[Str, Int]] = None


def _json_record(text, file, what: str):
    try:
        return json.loads(text)
    except (TypeError, ValueError, RecursionError):
        raise FlintError(f"{file}: the {what} record is not JSON") from None


def _graph_record(text, file) -> dict:
    info = _json_record(text, file, "flint_graph")
    validated(_GraphRecord, info, f"{file}: flint_graph")
    return info


def _refuse_json(file) -> None:
    """Chakra's PyTorch host/device traces are JSON: name that, not a protobuf error."""
    try:
        with open(file, "rb") as f:
            head = f.read(64).lstrip()
    except OSError:
        return              # read_et names the problem
    if head[:1] in (b"{", b"["):
        raise FlintError(f"{file} is JSON (a PyTorch execution trace?), not a Chakra ET "
                         f"protobuf: convert it with Chakra's chakra_converter first")


def _ranges(ranks: list[int]) -> str:
    shown = ", ".join(map(str, ranks[:8]))
    return shown + (f", ... ({len(ranks)} ranks)" if len(ranks) > 8 else "")


# --- files ---------------------------------------------------------------------------
def _rank_files(directory: Path) -> dict[int, Path]:
    by_prefix: dict[str, dict[int, Path]] = {}
    for p in sorted(directory.iterdir()):
        m = _RANK_FILE.match(p.name)
        if m and p.is_file():
            by_prefix.setdefault(m.group("prefix"), {})[int(m.group("rank"))] = p
    manifest = directory / "flint_export.json"
    if manifest.is_file():
        from flint.io import read_json

        doc = read_json(manifest)
        if not isinstance(doc, dict):
            raise FlintError(f"{manifest} is not a Flint export manifest (a JSON object)")
        prefix = doc.get("prefix")
        if isinstance(prefix, str) and prefix in by_prefix:
            return by_prefix[prefix]
    if not by_prefix:
        raise FlintError(f"{directory} holds no Chakra traces (<prefix>.<rank>.et)")
    if len(by_prefix) > 1:
        raise FlintError(f"{directory} holds traces with several prefixes "
                         f"({', '.join(sorted(by_prefix))}): import one file")
    return next(iter(by_prefix.values()))


def _read_comm_groups(path) -> dict[str, list[int]]:
    from flint.io import read_json

    data = read_json(path)
    if not isinstance(data, dict) or not all(
            isinstance(v, list) and v and all(isinstance(r, int) and not isinstance(r, bool)
                                              and 0 <= r < MAX_DEVICES for r in v)
            for v in data.values()):
        raise FlintError(f"{path} is not a communicator-group JSON ({{\"1\": [ranks], ...}})")
    for k, v in data.items():
        if len(set(v)) != len(v):
            raise FlintError(f"{path}: group {k!r} lists a rank twice: {v[:16]}")
    return {str(k): v for k, v in data.items()}


def _checked_order(nodes: list, file) -> list[int]:
    """Positions of the nodes in a dependency order (file order where free): ids unique,
    every dependency present, no cycle."""
    pos: dict[int, int] = {}
    for i, n in enumerate(nodes):
        if n.id in pos:
            raise FlintError(f"{file}: node id {n.id} appears twice")
        pos[n.id] = i
    waiting = [0] * len(nodes)
    users: list[list[int]] = [[] for _ in nodes]
    for i, n in enumerate(nodes):
        for d in set(n.data_deps) | set(n.ctrl_deps):
            j = pos.get(d)
            if j is None:
                raise FlintError(f"{file}: node {n.id} ({n.name!r}) depends on node {d}, "
                                 f"which is not in the file")
            users[j].append(i)
            waiting[i] += 1
    ready = [i for i, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users[i]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, u)
    if len(order) < len(nodes):
        stuck = next(nodes[i] for i, w in enumerate(waiting) if w > 0)
        raise FlintError(f"{file}: dependency cycle through node {stuck.id} ({stuck.name!r})")
    return order


# --- Flint's own files ---------------------------------------------------------------
def _is_annotated(node) -> bool:
    return any(a.name in (FLINT_NODE, FLINT_PART) for a in node.attr)


def _rebuild_flint(info: dict, nodes: list, file) -> WorkloadGraph:
    out = []
    mapped = info.get("ids") == ID_SCHEME       # version 2: Chakra id 2i+1 for node i
    to_flint = flint_id if mapped else (lambda i: i)
    for p in sorted(nodes, key=lambda p: p.id):
        a = cf.attrs(p)
        if FLINT_PART in a:
            continue            # a permute's SEND half, a transfer's clear-to-send
        d = _json_record(a[FLINT_NODE], file, f"node {p.id} flint_node")
        if not isinstance(d, dict):
            raise FlintError(f"{file}: node {p.id}'s flint_node record is not a JSON object")
        d.setdefault("name", plain_name(p.name) if mapped else p.name)
        d.update(id=to_flint(p.id),
                 operands=_json_record(p.inputs.shapes or "[]", file, f"node {p.id} shapes"),
                 outputs=_json_record(p.outputs.shapes or "[]", file, f"node {p.id} shapes"))
        d.setdefault("inputs", [to_flint(i) for i in p.data_deps])
        check_node_json(d, f"{file}: node {p.id}")
        out.append(Node.from_json(d))
    try:
        g = WorkloadGraph(Cluster.from_json(info["cluster"]), out,
                          [Communicator.from_json(c) for c in info["communicators"]], [],
                          info.get("meta", {}))
    except (KeyError, TypeError, ValueError) as e:
        raise FlintError(f"{file}: corrupt Flint annotation: {type(e).__name__}: {e}") from None
    g.check()
    return g


# --- any Chakra ET -------------------------------------------------------------------
_CLASSES = (("attention", ("attention", "flash", "sdpa", "fmha")),
            ("conv", ("conv",)),
            ("gemm", ("gemm", "matmul", "aten::mm", "aten::bmm", "aten::addmm", "linear",
                      "cutlass", "xmma", "dot")))


def _op_class(name: str) -> str:
    low = name.lower()
    for cls, keys in _CLASSES:
        if any(k in low for k in keys):
            return cls
    return "elementwise"


class _ChakraReader:
    def __init__(self, file, rank: int, groups: dict, info: dict | None, ranks_seen: int):
        self.file, self.rank, self.groups = file, rank, groups
        self.flint_ids = info is not None and info.get("ids") == ID_SCHEME
        self.dims = list(info.get("dims") or []) if info is not None else []
        if info is not None:
            self.cluster = Cluster.from_json(info["cluster"])
        else:
            if isinstance(ranks_seen, dict) and sorted(ranks_seen) != list(range(len(ranks_seen))):
                missing = sorted(set(range(max(ranks_seen) + 1)) - set(ranks_seen))
                raise FlintError(f"{file.parent}: rank files {_ranges(sorted(ranks_seen))} leave "
                                 f"out ranks {_ranges(missing)}: the cluster size is unknown")
            count = len(ranks_seen) if isinstance(ranks_seen, dict) else ranks_seen
            top = max((r for g in groups.values() for r in g), default=0)
            n = max(count, top + 1, rank + 1)
            self.cluster = Cluster(n, (("ranks", n),), "unknown")
        self.comms = CommunicatorTable(self.cluster)

    def read(self, nodes: list, order: list[int]) -> WorkloadGraph:
        device_trace = any(not cf.attrs(n).get("is_cpu_op", False) for n in nodes
                           if n.type != cf.METADATA)
        new_id: dict[int, list[int]] = {}      # chakra id -> flint ids it stands for
        out: list[Node] = []
        for i in order:
            p = nodes[i]
            deps = sorted({x for d in p.data_deps for x in new_id[d]})
            ctrl = sorted({x for d in p.ctrl_deps for x in new_id[d]} - set(deps))
            if p.type in (cf.METADATA, cf.INVALID):
                new_id[p.id] = sorted(set(deps) | set(ctrl))
                continue
            node = self._node(p, len(out), deps, ctrl, device_trace)
            new_id[p.id] = [node.id]
            out.append(node)
        comms = self.comms.all()
        meta = {"source": "chakra", "file": str(self.file), "rank": self.rank}
        g = WorkloadGraph(self.cluster, out, comms, [], meta)
        g.check()
        return g

    def _node(self, p, nid: int, deps, ctrl, device_trace: bool) -> Node:
        a = cf.attrs(p)
        validated(_ChakraAttrs, a, f"{self.file}: node {p.id} ({p.name[:40]!r})")
        recorded = p.duration_micros * 1e-6
        host = bool(a.get("is_cpu_op", False))
        meta = {"chakra_id": p.id, "recorded_s": 0.0 if (host and device_trace) else recorded}
        if host:
            meta["host"] = True
        name = plain_name(p.name) if self.flint_ids else p.name
        common = dict(id=nid, name=name or f"node{p.id}", inputs=deps, control=ctrl,
                      meta=meta)
        if p.type in (cf.COLL, cf.SEND, cf.RECV):
            return self._communication(p, a, common)
        flops = float(a.get("num_ops") or 0)
        moved = float(a.get("tensor_size") or 0)
        kind = NodeKind.MEMORY if p.type in (cf.MEM_LOAD, cf.MEM_STORE) else NodeKind.COMPUTE
        return Node(kind=kind, op=common["name"], op_class="memory" if kind == NodeKind.MEMORY
                    else _op_class(common["name"]), flops=flops, bytes_read=moved, **common)

    def _communication(self, p, a: dict, common: dict) -> Node:
        size = a.get("comm_size")
        if size is None:
            raise FlintError(f"{self.file}: communication node {p.id} ({p.name!r}) has no "
                             f"comm_size")
        size = int(size)
        if p.type == cf.COLL:
            t = a.get("comm_type")
            if t is None:
                raise FlintError(f"{self.file}: collective node {p.id} ({p.name!r}) has no "
                                 f"comm_type")
            if int(t) not in cf.FROM_CHAKRA:
                raise FlintError(f"{self.file}: collective node {p.id} ({p.name!r}) has an "
                                 f"unknown comm_type {t} (Chakra defines "
                                 f"{', '.join(f'{k}={cf.chakra_type_name(k)}' for k in sorted(cf.FROM_CHAKRA))})")
            kind_name = cf.FROM_CHAKRA[int(t)]
            comm = self._group_comm(a.get("pg_name"), p, a.get("involved_dim"))
            size_out = {"all-gather": size * comm.size,
                        "reduce-scatter": size // max(comm.size, 1)}.get(kind_name, size)
            coll = Collective(kind_name, comm.id, size, size_out, "u8", is_async=True)
            common["meta"]["chakra_type"] = cf.chakra_type_name(int(t))
            return Node(kind=NodeKind.COLLECTIVE, op=kind_name, op_class="collective",
                        bytes_read=size, bytes_written=size_out, collective=coll, **common)
        src, dst = int(a.get("comm_src", 0)), int(a.get("comm_dst", 0))
        if max(src, dst) >= self.cluster.devices or min(src, dst) < 0:
            raise FlintError(f"{self.file}: node {p.id} sends from rank {src} to {dst}, "
                             f"outside the {self.cluster.devices} ranks")
        comm = self.comms.get("pairs", f"{{{{{src},{dst}}}}}")
        send = p.type == cf.SEND
        coll = Collective("send" if send else "recv", comm.id, size, size, "u8", is_async=True)
        return Node(kind=NodeKind.SEND if send else NodeKind.RECV,
                    op="send" if send else "recv", op_class="collective",
                    bytes_read=size if send else 0, bytes_written=0 if send else size,
                    collective=coll, **common)

    def _group_comm(self, pg_name, p, involved=None) -> Communicator:
        if pg_name in (None, "") and involved and len(involved) == len(self.dims):
            ranks = dimension_group(self.rank, self.dims, involved)
            return self.comms.get("groups", "{{" + ",".join(map(str, ranks)) + "}}")
        if pg_name in (None, ""):
            return self.comms.get("groups", "{}")
        ranks = self.groups.get(str(pg_name))
        if ranks is None:
            raise FlintError(f"{self.file}: node {p.id} names process group {pg_name!r}, which "
                             f"the communicator-group JSON does not define"
                             + ("" if self.groups else " (none was given: --comm-groups)"))
        return self.comms.get("groups", "{{" + ",".join(map(str, ranks)) + "}}")

