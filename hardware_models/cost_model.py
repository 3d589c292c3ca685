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
        if "composite" in node.meta:
            raise FlintError(f"node {node.name!r} stands for a block of a layer template: "
                             f"price graphs through hardware_models.estimate.price_nodes")
        if node.collective is not None:
            return self.network.time(node, graph.communicator(node))
        return self.compute.time(node)

    def overlap_slowdown(self, node: Node, comm: Node) -> float:
        """How much slower `node` runs while `comm` is in flight on the same GPU."""
        return interference(self.spec, self.compute, self.network, node, comm)


# NCCL runs one CTA per channel, each on its own SM, for the whole collective. Its topology
# search builds 16 channels on an NVSwitch node of A100 or H100 (the 'Channel xx/16' lines of
# NCCL_DEBUG=INFO logs on DGX systems; NCCL_MIN_NCHANNELS/NCCL_MAX_NCHANNELS bound it) and
# fewer across NICs; taken as 16.
NCCL_CHANNELS = 16
# Local HBM traffic per byte a collective puts on the wire: its kernel reads the send buffer
# and writes the receive buffer (a reduction also reads the local operand).
HBM_BYTES_PER_WIRE_BYTE = {"all-reduce": 3.0, "reduce-scatter": 3.0}
MAX_SHARE = 0.5     # a collective never takes more than half of the SMs or of HBM


def interference(spec: HardwareSpec, compute, network, node: Node, comm: Node) -> float:
    """Compute-bound work loses the SMs NCCL holds; memory-bound work loses the HBM
    bandwidth the collective's traffic takes (its wire rate times local bytes per wire
    byte). The kernel's time beside the collective is the larger of its compute time on
    the SMs left and its memory time on the bandwidth left, so the factor moves smoothly
    from one bound to the other and a faster resource never makes a kernel slower. Only
    GPUs with the default models: NCCL kernels run on the SMs; TPUs and CPUs move
    collectives with DMA engines."""
    if spec.kind != "gpu" or not spec.cores or not hasattr(compute, "bound"):
        return 1.0
    if not (node.flops or node.bytes_read or node.bytes_written):
        return 1.0      # an imported node with only a recorded duration: already as it ran
    t_flops, t_bytes = compute.bound(node)
    alone = max(t_flops, t_bytes)
    if alone <= 0:
        return 1.0
    sm_left = 1.0 - min(NCCL_CHANNELS / spec.cores, MAX_SHARE)
    wire = getattr(getattr(network, "up", None), "bandwidth", 0.0)
    kind = comm.collective.type if comm.collective is not None else ""
    local = wire * HBM_BYTES_PER_WIRE_BYTE.get(kind, 2.0)
    achievable = spec.hbm_bandwidth * compute.figure("hbm_fraction")
    hbm_left = 1.0 - min(local / achievable, MAX_SHARE) if achievable else 1.0
    return max(t_flops / sm_left, t_bytes / hbm_left) / alone


def default_cost_model(graph: WorkloadGraph, hardware: str | None = None, overrides=(),
                       algorithm: str = "auto", protocol: str = "auto") -> DefaultCostModel:
    from flint.hardware_models.grouped_gemm import with_grouped_gemms

    spec = load_spec(hardware or _spec_name(graph.cluster.hardware), overrides)
    compute = RooflineCompute(spec, allow_tf32=bool(graph.meta.get("allow_tf32", False)))
    return DefaultCostModel(spec, with_grouped_gemms(compute, graph),
                            NetworkModel(spec, graph.cluster, algorithm, protocol))


def _spec_name(hardware: str) -> str:
    return {"unknown": "h100-sxm"}.get(hardware, hardware)
