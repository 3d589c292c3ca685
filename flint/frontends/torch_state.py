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

from flint.frontends.sharding_report import NOT_DATA_DIMS


def local_bytes(t) -> int:
    """Bytes this rank stores for a tensor (its local shard for a DTensor)."""
    local = getattr(t, "_local_tensor", None)
    t = local if isinstance(local, torch.Tensor) else t
    return int(t.numel()) * t.element_size()


def state_bytes(model: torch.nn.Module, optimizer, inputs: tuple) -> dict:
    """Per-rank bytes: the totals (memory_split) and one entry per tensor (arguments):
    `params/<name>`, `opt_state/<name>/<state>`, `batch/<i>`, named so the memory
    estimate files them by kind; per tensor, so a rescale can match each to the shard
    family it belongs to."""
    names = {id(p): n for n, p in model.named_parameters()}
    entries = [[f"params/{n}", local_bytes(p)] for n, p in model.named_parameters()]
    if optimizer is not None:
        for param, state in optimizer.state.items():
            for key, value in sorted(state.items()):
                if isinstance(value, torch.Tensor) and value.dim() > 0:
                    entries.append([f"opt_state/{names.get(id(param), '?')}/{key}",
                                    local_bytes(value)])
    entries += [[f"batch/{i}", local_bytes(x)] for i, x in enumerate(inputs)
                if isinstance(x, torch.Tensor)]

    def total(prefix):
        return sum(b for n, b in entries if n.startswith(prefix))

    trainable = sum(local_bytes(p) for p in model.parameters() if p.requires_grad)
    sharded = [i for i, t in enumerate(_tensors_in_order(model, optimizer))
               if _data_sharded(t)]
    return {"arguments": entries, "sharded_arguments": sharded,
            "split": {"parameters_bytes": total("params/"), "gradients_bytes": trainable,
                      "optimizer_state_bytes": total("opt_state/"),
                      "inputs_bytes": total("batch/")}}


def _tensors_in_order(model, optimizer):
    """The parameters and optimizer-state tensors in the order state_bytes lists them."""
    out = list(model.parameters())
    if optimizer is not None:
        for state in optimizer.state.values():
            out += [v for _, v in sorted(state.items())
                    if isinstance(v, torch.Tensor) and v.dim() > 0]
    return out


def _data_sharded(t) -> bool:
    """Sharded over a data-parallel mesh dimension (FSDP2), so its shard shrinks when that
    dimension grows: what flint.passes.rescale scales (meta["sharded_arguments"])."""
    placements = getattr(t, "placements", None)
    mesh = getattr(t, "device_mesh", None)
    if placements is None or mesh is None:
        return False
    from torch.distributed.tensor import Shard

    names = mesh.mesh_dim_names or ()
    return any(isinstance(p, Shard) and i < len(names) and names[i] not in NOT_DATA_DIMS
               for i, p in enumerate(placements))



def record_state(graph, state: dict) -> None:
    """Entry arguments (resident for the whole step, as a JAX step's arguments are), which
    of them FSDP shards (a rescale shrinks those), and the per-kind totals in
    meta["memory_split"]."""
    graph.meta["arguments"] = [list(e) for e in state["arguments"]]
    graph.meta["sharded_arguments"] = list(state["sharded_arguments"])
    graph.meta.setdefault("aliased_arguments", [])
    graph.meta["memory_split"] = dict(state["split"])
