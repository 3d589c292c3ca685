"""The workload-graph JSON schema (format `flint.workload`, version 1): every field's type
and range, checked once when a graph is read (WorkloadGraph.from_json). The structural
invariants that span fields (dense ids, dependencies pointing backwards, communicators that
exist) are WorkloadGraph.check's."""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field, field_validator
from typing_extensions import Annotated

from flint.cluster import MAX_DEVICES
from flint.schema import (Bool, NonNegInt, NonNegNumber, PositiveInt, Str, Strict,
                          validated)

NodeId = NonNegInt


class ClusterSchema(Strict):
    devices: Annotated[PositiveInt, Field(le=MAX_DEVICES)]
    mesh: list[tuple[Str, PositiveInt]]
    hardware: Str = "unknown"
    platform: Str = "gpu"
    devices_per_host: PositiveInt = 8


class CollectiveSchema(Strict):
    type: Str
    communicator: NonNegInt
    bytes_in: NonNegNumber
    bytes_out: NonNegNumber
    dtype: Str
    reduction: Optional[Str] = None
    is_async: Bool = False
    window: Optional[tuple[NodeId, NodeId]] = None


class NodeSchema(Strict):
    id: NodeId
    name: Str
    kind: Literal["compute", "memory", "collective", "send", "recv"]
    op: Str
    op_class: Str
    inputs: list[NodeId] = []
    control: list[NodeId] = []
    flops: NonNegNumber = 0.0
    transcendentals: NonNegNumber = 0.0
    bytes_read: NonNegNumber = 0.0
    bytes_written: NonNegNumber = 0.0
    outputs: list[Str] = []
    operands: list[Str] = []
    repeat: PositiveInt = 1
    collective: Optional[CollectiveSchema] = None
    meta: dict = {}


class CommunicatorSchema(Strict):
    id: NonNegInt
    kind: Literal["groups", "pairs"]
    spec: Str
    num_devices: Annotated[PositiveInt, Field(le=MAX_DEVICES)]
    size: PositiveInt
    num_groups: NonNegInt
    mesh_axes: list[Str]


class LoopSchema(Strict):
    id: NonNegInt
    name: Str
    trip_count: NonNegInt
    parent: Optional[NonNegInt]
    first: NodeId
    last: NodeId
    trip_count_known: Bool = True
    carried: list[tuple[list[NodeId], list[NodeId], list[NodeId]]] = []


class GraphSchema(Strict):
    format: Literal["flint.workload"]
    version: Literal[1]
    cluster: ClusterSchema
    meta: dict = {}
    communicators: list[CommunicatorSchema]
    loops: list[LoopSchema] = []
    nodes: list[NodeSchema]

    @field_validator("communicators")
    @classmethod
    def _dense_ids(cls, comms):
        for i, c in enumerate(comms):
            if c.id != i:
                raise ValueError(f"communicator {i} has id {c.id}")
        return comms


def check_graph_json(doc, where: str = "workload graph") -> None:
    """Raise one FlintError line if `doc` is not a well-typed workload graph."""
    validated(GraphSchema, doc, where)


def check_cluster_json(doc, where: str) -> None:
    validated(ClusterSchema, doc, where)


def check_communicator_json(doc, where: str) -> None:
    validated(CommunicatorSchema, doc, where)


def check_node_json(doc, where: str) -> None:
    validated(NodeSchema, doc, where)
