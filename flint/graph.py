"""WorkloadGraph: the per-device workload of an SPMD training step.

One graph describes every rank: SPMD ranks run the same program and differ only in which
peers their collectives talk to, which the communicators say. Nothing here grows with the
device count except communicator group lists that XLA itself printed explicitly.

Nodes are listed in the compiler's schedule order; a node's id is its index. Loop bodies
appear once with `repeat` set to how many times they run per step (`passes.expand_loops`
unrolls them for consumers that need every instance).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from enum import Enum, StrEnum
from functools import cached_property
from typing import Iterator

import numpy as np

from flint.cluster import Cluster
from flint.errors import FlintError
from flint.hlo.replica_groups import parse_replica_groups, parse_source_target_pairs

FORMAT = "flint.workload"
VERSION = 1


class NodeKind(str, Enum):
    COMPUTE = "compute"        # arithmetic: GEMMs, convolutions, fusions, reductions
    MEMORY = "memory"          # pure data movement: copies, transposes, host offload
    COLLECTIVE = "collective"  # all-reduce, all-gather, reduce-scatter, all-to-all, permute
    SEND = "send"
    RECV = "recv"


class OpClass(StrEnum):
    """What kind of work a node does: the vocabulary front ends produce (passes.hlo_cost,
    passes.aten_cost, the Chakra importer) and the cost model and reports key on. A StrEnum:
    equal to its string, so saved graphs (whose op_class loads as a plain str) and reports
    are unchanged."""

    GEMM = "gemm"
    CONV = "conv"
    ATTENTION = "attention"
    ELEMENTWISE = "elementwise"
    REDUCTION = "reduction"
    SCATTER = "scatter"
    SORT = "sort"
    SELECT_AND_SCATTER = "select-and-scatter"
    DATA_MOVEMENT = "data_movement"
    MEMORY = "memory"
    VIEW = "view"             # torch: metadata only, no time
    HOST = "host"             # torch: host-side ops
    COLLECTIVE = "collective"
    P2P = "p2p"
    CUSTOM = "custom"         # a custom call Flint has no cost rule for
    UNKNOWN = "unknown"


# The classes that run on tensor cores (matrix units): one set for every consumer.
TENSOR_CLASSES = (OpClass.GEMM, OpClass.CONV, OpClass.ATTENTION)


def _plain(value):
    """A copy of a JSON-like value (dicts, lists, tuples of plain values), sharing nothing
    mutable with the original (what dataclasses.asdict made of a node's meta)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    return value


@dataclass
class Collective:
    """What a communication node moves, and with whom."""

    type: str                 # all-reduce | all-gather | reduce-scatter | all-to-all | ...
    communicator: int         # index into WorkloadGraph.communicators
    bytes_in: int             # this rank's input buffer, bytes
    bytes_out: int            # this rank's output buffer, bytes
    dtype: str
    reduction: str | None = None
    is_async: bool = False
    # Ids of the first and last node the compiler scheduled between start and done: the
    # work this collective may overlap with.
    window: tuple[int, int] | None = None

    @property
    def size_bytes(self) -> int:
        """The collective's size as nccl-tests reports it (its "size" column): the gathered
        output buffer for all-gather, the input buffer for every other collective."""
        return self.bytes_out if self.type == "all-gather" else self.bytes_in


@dataclass
class Node:
    id: int
    name: str
    kind: NodeKind
    op: str                   # HLO opcode (or wrapped opcode for async pairs)
    op_class: str             # an OpClass (a plain str once loaded from JSON)
    inputs: list[int] = field(default_factory=list)
    control: list[int] = field(default_factory=list)
    flops: float = 0.0
    transcendentals: float = 0.0
    bytes_read: float = 0.0
    bytes_written: float = 0.0
    outputs: list[str] = field(default_factory=list)    # e.g. ["bf16[8,4096]"]
    operands: list[str] = field(default_factory=list)
    repeat: int = 1           # executions per step (product of enclosing loop trip counts)
    collective: Collective | None = None
    meta: dict = field(default_factory=dict)

    @property
    def device(self) -> int | None:
        """The device (pipeline stage or placed device) this node runs on in an MPMD graph
        (passes.pipeline, passes.place: stored as meta["device"]); None in an SPMD graph,
        where every device runs every node."""
        device = self.meta.get("device")
        return None if device is None else int(device)

    @property
    def device_or_0(self) -> int:
        """`device`, with an SPMD node on device 0 (what per-device accounting wants)."""
        return self.device or 0

    def to_json(self) -> dict:
        # field by field with a plain-data copy, not dataclasses.asdict: its generic
        # recursion was most of the time of saving a large graph (and of a templated
        # graph's warm predict)
        d = {}
        for name in _NODE_FIELDS:
            value = getattr(self, name)
            if name == "kind":
                value = value.value
            elif name == "collective":
                if value is None:
                    continue
                value = {f: _plain(getattr(value, f)) for f in _COLLECTIVE_FIELDS}
                if value["window"] is not None:
                    value["window"] = list(value["window"])
            else:
                value = _plain(value)
            d[name] = value
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Node":
        d = dict(d)
        d["kind"] = NodeKind(d["kind"])
        c = d.get("collective")
        if c is not None:
            c = dict(c)
            if c.get("window") is not None:
                c["window"] = tuple(c["window"])
            d["collective"] = Collective(**c)
        return cls(**d)


_NODE_FIELDS = tuple(f.name for f in fields(Node))
_COLLECTIVE_FIELDS = tuple(f.name for f in fields(Collective))


@dataclass(frozen=True)
class Communicator:
    """A set of device groups that talk in one collective (or source->target pairs)."""

    id: int
    kind: str                 # "groups" or "pairs"
    spec: str                 # replica groups / pairs exactly as the compiler wrote them
    num_devices: int
    size: int                 # ranks per group (2 for pairs)
    num_groups: int
    mesh_axes: tuple[str, ...]

    def groups(self) -> np.ndarray:
        """[num_groups, size] ranks (for pairs: [num_pairs, 2] as source, target)."""
        if self.kind == "pairs":
            return parse_source_target_pairs(self.spec)
        return parse_replica_groups(self.spec, self.num_devices)

    def group_of(self, rank: int) -> list[int]:
        g = self.groups()
        rows = np.nonzero((g == rank).any(axis=1))[0]
        return [int(r) for r in g[rows[0]]] if len(rows) else []

    def to_json(self) -> dict:
        d = asdict(self)
        d["mesh_axes"] = list(self.mesh_axes)
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Communicator":
        return cls(**{**d, "mesh_axes": tuple(d["mesh_axes"])})


@dataclass
class Loop:
    """A compiled while loop whose body nodes appear once in the graph."""

    id: int
    name: str
    trip_count: int
    parent: int | None
    first: int                # first and last node id of the body (inclusive)
    last: int
    trip_count_known: bool = True
    # Loop-carried dependencies, one per state element: the nodes that produced its initial
    # value (outside the body), the body nodes that produce it at the end of an iteration,
    # and the body nodes that consume it at the start of the next iteration.
    carried: list[tuple[list[int], list[int], list[int]]] = field(default_factory=list)

    def to_json(self) -> dict:
        d = asdict(self)
        d["carried"] = [[list(i), list(p), list(c)] for i, p, c in self.carried]
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Loop":
        d = dict(d)
        d["carried"] = [(list(i), list(p), list(c)) for i, p, c in d.get("carried", [])]
        return cls(**d)


@dataclass
class WorkloadGraph:
    cluster: Cluster
    nodes: list[Node] = field(default_factory=list)
    communicators: list[Communicator] = field(default_factory=list)
    loops: list[Loop] = field(default_factory=list)
    meta: dict = field(default_factory=dict)

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    def node(self, node_id: int) -> Node:
        return self.nodes[node_id]

    @cached_property
    def users(self) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in self.nodes]
        for n in self.nodes:
            for i in n.inputs:
                out[i].append(n.id)
        return out

    def collectives(self) -> list[Node]:
        return [n for n in self.nodes if n.collective is not None]

    def communicator(self, node: Node) -> Communicator:
        return self.communicators[node.collective.communicator]

    def total_flops(self) -> float:
        return sum(n.flops * n.repeat for n in self.nodes)

    def to_networkx(self):
        """A networkx.DiGraph view: node attribute `node` holds the Node, edges are deps."""
        import networkx as nx

        g = nx.DiGraph(cluster=self.cluster, meta=self.meta)
        for n in self.nodes:
            g.add_node(n.id, node=n, kind=n.kind.value, name=n.name)
        for n in self.nodes:
            for i in n.inputs:
                g.add_edge(i, n.id, dep="data")
            for i in n.control:
                g.add_edge(i, n.id, dep="control")
        return g

    def summary(self) -> dict:
        from flint.summary import summarize

        return summarize(self)

    def as_text(self) -> str:
        """A readable dump, one line per node (for debugging and pass dumps)."""
        from flint.summary import graph_text

        return graph_text(self)

    # --- serialization -------------------------------------------------------------
    def to_json(self) -> dict:
        return {
            "format": FORMAT, "version": VERSION, "cluster": self.cluster.to_json(),
            "meta": self.meta, "communicators": [c.to_json() for c in self.communicators],
            "loops": [lp.to_json() for lp in self.loops],
            "nodes": [n.to_json() for n in self.nodes],
        }

    @classmethod
    def from_json(cls, d: dict, where: str = "workload graph") -> "WorkloadGraph":
        from flint.graph_schema import check_graph_json

        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise FlintError(f"{where}: not a Flint workload graph (missing format "
                             f"'flint.workload')")
        if d.get("version") != VERSION:
            raise FlintError(f"{where}: workload graph version {d.get('version')!r} is not "
                             f"supported (this Flint reads version {VERSION})")
        check_graph_json(d, where)
        try:
            g = cls(Cluster.from_json(d["cluster"]),
                    [Node.from_json(n) for n in d["nodes"]],
                    [Communicator.from_json(c) for c in d["communicators"]],
                    [Loop.from_json(lp) for lp in d.get("loops", [])], d.get("meta", {}))
        except (KeyError, TypeError, ValueError) as e:
            raise FlintError(f"{where}: corrupt workload graph: {type(e).__name__}: {e}") \
                from None
        except FlintError as e:   # the cluster's own checks (mesh against devices)
            raise FlintError(f"{where}: cluster: {e}") from None
        g.check(where)
        return g

    def check(self, where: str = "workload graph") -> None:
        """Structural invariants: dense ids, deps point backwards, communicators exist and
        their groups parse, loops lie inside the graph."""
        bad = f"{where}: corrupt workload graph:"
        for i, n in enumerate(self.nodes):
            if n.id != i:
                raise FlintError(f"{bad} node {i} has id {n.id}")
            for d in n.inputs + n.control:
                if not 0 <= d < i:
                    raise FlintError(f"{bad} node {i} depends on {d}")
            if n.collective and not 0 <= n.collective.communicator < len(self.communicators):
                raise FlintError(f"{bad} node {i} names a missing communicator")
        for c in self.communicators:
            try:
                groups = c.groups()
            except Exception as e:  # noqa: BLE001 - the parsers raise several types
                raise FlintError(f"{bad} communicator {c.id} groups {c.spec[:40]!r} do not "
                                 f"parse: {type(e).__name__}") from None
            if groups.size and (groups.min() < 0 or groups.max() >= self.cluster.devices):
                raise FlintError(f"{bad} communicator {c.id} names ranks outside the "
                                 f"{self.cluster.devices} devices")
        for lp in self.loops:
            if not 0 <= lp.first <= lp.last < max(len(self.nodes), 1):
                raise FlintError(f"{bad} loop {lp.id} spans nodes {lp.first}-{lp.last}")

    def save(self, path) -> None:
        from flint.io import write_atomic

        write_atomic(path, dumps_json(self.to_json()))

    @classmethod
    def load(cls, path) -> "WorkloadGraph":
        from flint.io import read_json

        return cls.from_json(read_json(path), str(path))


def dumps_json(obj) -> str:
    """Deterministic JSON: sorted keys, compact separators, trailing newline."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":")) + "\n"


def collective_size_bytes(node: Node) -> int:
    """A node's collective size (Collective.size_bytes); 0 for a node that moves nothing."""
    return node.collective.size_bytes if node.collective is not None else 0
