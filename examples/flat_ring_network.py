"""A third-party network model for Flint: every collective runs as a ring over one flat
network of the NIC's bandwidth, with no NVLink domain and no hierarchy. It prices
collectives with the alpha-beta (Hockney) model of ring algorithms: a ring of n ranks takes
n-1 steps per phase, each moving 1/n of the buffer over one link (Thakur, Rabenseifner and
Gropp, "Optimization of Collective Communication Operations in MPICH", IJHPCA 2005;
Patarasuk and Yuan, "Bandwidth optimal all-reduce algorithms for clusters of
workstations", JPDC 2009). Compute stays Flint's roofline model.

Use it from any command that prices a graph (the module must be importable):

    PYTHONPATH=examples flint estimate graph.json --cost-model flat_ring_network:cost_model
    PYTHONPATH=examples flint sweep space.yaml --out d --cost-model flat_ring_network:cost_model

or from Python: `estimate(graph, cost_model=flat_ring_network.cost_model)`.
"""
from __future__ import annotations

from dataclasses import dataclass

from flint.hardware_models.compute import RooflineCompute
from flint.hardware_models.cost_model import DefaultCostModel
from flint.hardware_models.spec import HardwareSpec, load_spec

# Ring phases per collective: all-reduce is a reduce-scatter then an all-gather.
PHASES = {"all-reduce": 2, "reduce-scatter": 1, "all-gather": 1, "all-to-all": 1}


@dataclass(frozen=True)
class FlatRingNetwork:
    """Collective time = phases x (n-1) x (alpha + size / n / bandwidth)."""

    bandwidth: float        # bytes/s per rank, one direction (the spec's NIC)
    latency: float          # seconds per ring step (the spec's NIC latency)

    def time(self, node, comm) -> float:
        c = node.collective
        n = max(int(getattr(comm, "size", 1) or 1), 1)
        size = float(c.size_bytes)
        phases = PHASES.get(c.type)
        if phases is None:          # point to point (send/recv, collective-permute)
            return self.latency + size / self.bandwidth
        if n == 1:
            return 0.0
        return phases * (n - 1) * (self.latency + size / n / self.bandwidth)


def cost_model(graph, hardware: str | None = None, overrides=()) -> DefaultCostModel:
    """The factory Flint calls once per graph it prices (same arguments as
    flint.hardware_models.cost_model.default_cost_model)."""
    name = hardware or {"unknown": "h100-sxm"}.get(graph.cluster.hardware,
                                                    graph.cluster.hardware)
    spec: HardwareSpec = load_spec(name, overrides)
    network = FlatRingNetwork(spec.nic_bandwidth or spec.scale_up_bandwidth, spec.nic_latency)
    return DefaultCostModel(spec, RooflineCompute(spec), network)
