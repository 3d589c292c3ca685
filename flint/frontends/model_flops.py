"""Model flops of any step, for MFU, when its model is not one Flint built.

MFU (Chowdhery et al. 2022, PaLM, appendix B) counts the work the model needs, not what the
step executed: each forward matmul once in the forward and twice in the backward (the
gradients of its input and of its weight), attention scores and values without causal
savings, and no recompute. The graph already holds those forward matmuls: GEMM nodes and
fused-attention nodes of the forward phase. So model flops = 3 x (forward GEMM flops +
forward attention flops at full, non-causal cost). A user who knows better gives the
figure (`model_flops=` per step, for the whole cluster), which takes precedence.

Forward ops that remat recomputes inside the backward carry the backward's phase tag
(`transpose(...)` in JAX's op_name, `flint::backward` in torch), so they are not counted.
"""
from __future__ import annotations

from flint.graph import WorkloadGraph


def forward_matmul_flops(graph: WorkloadGraph) -> float:
    """Per device: forward GEMM/conv flops plus forward attention flops at full cost."""
    total = 0.0
    # Ops the compiler rewrote may have lost their metadata (the CPU backend's batched dots
    # of an einsum): an untagged GEMM scheduled before the first backward GEMM is forward
    # (other backward ops, such as weight transposes, may be hoisted earlier).
    first_backward = next((n.id for n in graph.nodes if n.meta.get("phase") == "backward"
                           and n.op_class in ("gemm", "conv", "attention")), len(graph.nodes))
    for node in graph.nodes:
        phase = node.meta.get("phase")
        if phase != "forward" and not (phase in (None, "", "unknown")
                                       and node.id < first_backward):
            continue
        if node.op_class in ("gemm", "conv"):
            total += node.flops * node.repeat
        elif node.op_class == "attention":
            a = node.meta.get("attention") or {}
            if a.get("backward"):
                continue
            try:   # 2 matmuls (scores over D, values over Dv) x 2 flops per MAC
                total += 2.0 * a["batch"] * a["heads"] * a["seq_q"] * a["seq_kv"] \
                    * (a["head_dim"] + a.get("v_head_dim", a["head_dim"])) * node.repeat
            except KeyError:
                total += node.flops * node.repeat * (2.0 if a.get("causal") else 1.0)
    return total


def set_model_flops(graph: WorkloadGraph, model_flops: float | None = None) -> None:
    """Record meta["model_flops_per_device"] (and where it came from) unless present:
    `model_flops` (per step, whole cluster) when given, else derived from the graph."""
    if model_flops is not None:
        graph.meta["model_flops_per_device"] = float(model_flops) / graph.cluster.devices
        graph.meta["model_flops_source"] = "given"
        return
    forward = forward_matmul_flops(graph)
    if forward > 0:
        graph.meta["model_flops_per_device"] = 3.0 * forward
        graph.meta["model_flops_source"] = "3 x forward GEMM + attention flops of the graph"
