"""Synthetic graphs with known answers: identical layers, no embedding or head, the setting
of the textbook pipeline-bubble formula (p-1)/(v*m)."""
from __future__ import annotations

from flint.cluster import Cluster
from flint.graph import Node, NodeKind, WorkloadGraph

LAYER_FLOPS = 1e14   # FLOP per forward layer: ~0.1 s on an H100, so link latency is noise


def uniform_layers(layers: int, cluster: Cluster, activation: str = "bf16[1024,1024]",
                   flops: float = LAYER_FLOPS) -> WorkloadGraph:
    """`layers` forward GEMMs in a chain, then their backward (twice the flops) in reverse,
    each backward reading its forward's output."""
    nodes: list[Node] = []

    def add(name, phase, layer, work, inputs):
        nodes.append(Node(len(nodes), name, NodeKind.COMPUTE, "dot", "gemm", list(inputs),
                          flops=work, bytes_read=1e6, bytes_written=1e6, outputs=[activation],
                          meta={"phase": phase, "layer": f"layer_{layer}"}))
        return len(nodes) - 1

    fwd, prev = [], None
    for i in range(layers):
        prev = add(f"fwd{i}", "forward", i, flops, [] if prev is None else [prev])
        fwd.append(prev)
    grad = None
    for i in reversed(range(layers)):
        grad = add(f"bwd{i}", "backward", i, 2 * flops, [fwd[i]] + ([grad] if grad else []))
    return WorkloadGraph(cluster, nodes, [], [], {})
