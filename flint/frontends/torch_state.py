"""What a PyTorch rank holds across steps, for the memory estimate: its shards of the
parameters and of the optimizer state (DTensor / FSDP2 parameters count their local
shard), the gradients backward makes (one per trainable parameter, sharded like it), and
the step's inputs.

Parameters, optimizer state and inputs become the graph's entry "arguments" (resident
for the whole step, like a JAX step's arguments); gradients are produced inside the step,
so they are part of its temporaries, and meta["memory_split"] says how much of those
are gradients (the rest are activations and other temporaries).
"""
from __future__ import annotations

import torch


def local_bytes(t) -> int:
    """Bytes this rank stores for a tensor (its local shard for a DTensor)."""
    local = getattr(t, "_local_tensor", None)
    t = local if isinstance(local, torch.Tensor) else t
    return int(t.numel()) * t.element_size()


def state_bytes(model: torch.nn.Module, optimizer, inputs: tuple) -> dict:
    params = list(model.parameters())
    optimizer_state = 0
    if optimizer is not None:
        for state in optimizer.state.values():
            optimizer_state += sum(local_bytes(v) for v in state.values()
                                   if isinstance(v, torch.Tensor) and v.dim() > 0)
    return {"parameters_bytes": sum(local_bytes(p) for p in params),
            "gradients_bytes": sum(local_bytes(p) for p in params if p.requires_grad),
            "optimizer_state_bytes": optimizer_state,
            "inputs_bytes": sum(local_bytes(x) for x in inputs
                                if isinstance(x, torch.Tensor))}


def record_state(graph, split: dict) -> None:
    """Entry arguments named so the memory estimate files them as parameters, optimizer
    state and inputs; the whole split in meta["memory_split"]."""
    graph.meta["arguments"] = [["params", split["parameters_bytes"]],
                               ["opt_state", split["optimizer_state_bytes"]],
                               ["batch", split["inputs_bytes"]]]
    graph.meta.setdefault("aliased_arguments", [])
    graph.meta["memory_split"] = dict(split)
