"""The cost-model seam: how long one node takes. Swap the compute or the network half.

    model = default_cost_model(graph, "h100-sxm", ["nic_bandwidth=800Gb/s"])
    model = dataclasses.replace(model, compute=MyCompute())   # any object with .time(node)
    estimate(graph, cost_model=model)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from flint.graph import Node, WorkloadGraph
from flint.hardware_models.compute import RooflineCompute
from flint.hardware_models.network import NetworkModel
from flint.hardware_models.spec import HardwareSpec, load_spec


class CostModel(Protocol):
    spec: HardwareSpec

    def node_time(self, node: Node, graph: WorkloadGraph) -> float:
        """Seconds one execution of `node` takes on one device."""


class ComputeTime(Protocol):
    def time(self, node: Node) -> float: ...


class CollectiveTime(Protocol):
    def time(self, node: Node, comm) -> float: ...


@dataclass(frozen=True)
class DefaultCostModel:
    spec: HardwareSpec
    compute: ComputeTime
    network: CollectiveTime

    def node_time(self, node: Node, graph: WorkloadGraph) -> float:
        if node.collective is not None:
            return self.network.time(node, graph.communicator(node))
        return self.compute.time(node)


def default_cost_model(graph: WorkloadGraph, hardware: str | None = None, overrides=(),
                       algorithm: str = "auto") -> DefaultCostModel:
    spec = load_spec(hardware or _spec_name(graph.cluster.hardware), overrides)
    return DefaultCostModel(spec, RooflineCompute(spec), NetworkModel(spec, graph.cluster,
                                                                      algorithm))


def _spec_name(hardware: str) -> str:
    return {"unknown": "h100-sxm"}.get(hardware, hardware)
