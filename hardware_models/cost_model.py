"""The cost-model seam: how long one node takes. Swap the compute or the network half.

    model = default_cost_model(graph, "h100-sxm", ["nic_bandwidth=800Gb/s"])
    model = dataclasses.replace(model, compute=MyCompute())   # any object with .time(node)
    estimate(graph, cost_model=model)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from flint.errors import FlintError
from flint.graph import Node, WorkloadGraph
from flint.hardware_models import kernels
from flint.hardware_models.compute import RooflineCompute
from flint.hardware_models.interference import collective_slowdown, interference
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
        if "composite" in node.meta:
            raise FlintError(f"node {node.name!r} stands for a block of a layer template: "
                             f"price graphs through hardware_models.estimate.price_nodes")
        if node.collective is not None:
            return self.network.time(node, graph.communicator(node))
        return self.compute.time(node)

    def launch_gap(self) -> float:
        """Seconds the GPU idles between two kernels launched on their own, one after the
        other on a stream (kernels.DEFAULT_LAUNCH_GAP_S); 0 on TPUs and CPUs."""
        figure = getattr(self.compute, "figure", None)
        return figure("launch_gap") if figure else kernels.figure(self.spec, "launch_gap")

    def overlap_slowdown(self, node: Node, comm: Node) -> float:
        """How much slower `node` runs while `comm` is in flight on the same GPU."""
        return interference(self.spec, self.compute, self.network, node, comm)

    def comm_slowdown(self, comm: Node, node: Node) -> float:
        """How much slower collective `comm` moves while `node` runs on the same GPU."""
        return collective_slowdown(self.spec, self.compute, self.network, comm, node)


def default_cost_model(graph: WorkloadGraph, hardware: str | None = None, overrides=(),
                       algorithm: str = "auto", protocol: str = "auto") -> DefaultCostModel:
    from flint.hardware_models.grouped_gemm import with_grouped_gemms

    spec = load_spec(hardware or _spec_name(graph.cluster.hardware), overrides)
    compute = RooflineCompute(spec, allow_tf32=bool(graph.meta.get("allow_tf32", False)))
    return DefaultCostModel(spec, with_grouped_gemms(compute, graph),
                            NetworkModel(spec, graph.cluster, algorithm, protocol))


def _spec_name(hardware: str) -> str:
    return {"unknown": "h100-sxm"}.get(hardware, hardware)
