"""How the torch twin (flint/models/torch_decoder.py) is spread over a device mesh.

`parallelize(model, mesh, ...)` applies Megatron TP with DTensor (column-parallel
wq/wk/wv/w_up/w_gate, row-parallel wo/w_down, vocab-parallel embedding and LM head with a
loss-parallel cross entropy) over the `model` mesh dimension, then FSDP2 `fully_shard` per
block and at the root over the `fsdp` dimension (HSDP when there is also a `data` one),
gathering bf16 parameters and reduce-scattering fp32 gradients. MoE models use expert
parallelism over an `expert` mesh dimension (flint/models/torch_moe.py: all-to-all
dispatch and combine on its process group). `data_parallel` averages gradients over pure
data axes; `step_context` is DTensor's loss_parallel when the logits are vocab-sharded.
"""
from __future__ import annotations

import torch
from torch import nn

TP_AXES = ("model", "tp", "tensor")
FSDP_AXES = ("fsdp",)
DATA_AXES = ("data", "dp", "batch", "replica")


def parallelize(model: nn.Module, mesh, sequence_parallel: bool = False,
                reshard_after_forward: bool = True) -> nn.Module:
    """Megatron TP over the `model` dimension (with sequence parallelism: norms and
    residual stream sharded over the sequence, all-gather / reduce-scatter around the
    column / row-parallel pairs instead of all-reduce), FSDP2 over `fsdp` (HSDP with
    `data`; a `data` axis alone is plain data parallelism). `reshard_after_forward`
    False: FSDP2 keeps each layer's gathered parameters from its forward to its backward
    (ZeRO-2 style, FSDP1's SHARD_GRAD_OP) instead of gathering them again."""
    names = mesh.mesh_dim_names
    tp = next((n for n in names if n in TP_AXES), None)
    fsdp = [n for n in names if n in DATA_AXES + FSDP_AXES]
    if model.cfg.is_moe:
        from flint.errors import FlintError
        from flint.models.torch_moe import expert_parallel

        if (tp and mesh[tp].size() > 1) or any(n in FSDP_AXES for n in names):
            raise FlintError("the torch MoE twin runs on data x expert meshes (no TP/FSDP)")
        if "expert" in names:
            expert_parallel(model, mesh["expert"])
        return model
    if tp is not None and mesh[tp].size() > 1:
        from torch.distributed.tensor.parallel import parallelize_module

        parallelize_module(model, mesh[tp], _tp_plan(model, sequence_parallel))
    if fsdp and any(a in FSDP_AXES for a in fsdp):
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        sub = mesh[tuple(fsdp)] if len(fsdp) > 1 else mesh[fsdp[0]]
        if sub.size() > 1:
            # bf16 all-gathers, fp32 gradient reduce-scatters (as torchtitan trains Llama)
            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            # FSDP2's own default unless asked (it keeps the root's parameters gathered)
            keep = {} if reshard_after_forward else {"reshard_after_forward": False}
            for layer in model.layers:
                fully_shard(layer, mesh=sub, mp_policy=mp, **keep)
            fully_shard(model, mesh=sub, mp_policy=mp, **keep)
    return model


def data_parallel(model: nn.Module, mesh) -> None:
    """Pure data parallelism (data axes without `fsdp`): every gradient is averaged over
    the data ranks as soon as it is accumulated, as DDP does (DDP itself buckets gradients
    into ~25 MB all-reduces and needs real memory, so it cannot be traced)."""
    if getattr(model, "cfg", None) is not None and model.cfg.is_moe and \
            "expert" in mesh.mesh_dim_names:
        from flint.models.torch_moe import average_dense_grads

        average_dense_grads(model, mesh["expert"])
    data = [n for n in mesh.mesh_dim_names if n in DATA_AXES]
    if not data or any(n in FSDP_AXES for n in mesh.mesh_dim_names):
        return
    mesh = mesh[data[0]] if len(data) == 1 else mesh[tuple(data)]
    if mesh.size() == 1:
        return
    from torch.distributed import _functional_collectives as funcol
    from torch.distributed.tensor import DTensor

    group = mesh.get_group()

    def average(p):
        g = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
        g.copy_(funcol.all_reduce(g, "avg", group))

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(average)


def _tp_plan(model: nn.Module, sp: bool) -> dict:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                                   RowwiseParallel, SequenceParallel)

    seq = Shard(1) if sp else Replicate()
    plan = {"embed": RowwiseParallel(input_layouts=Replicate(), output_layouts=seq),
            "lm_head": ColwiseParallel(input_layouts=seq, output_layouts=Shard(-1),
                                       use_local_output=False)}
    if sp:
        plan["final_norm"] = SequenceParallel()
    for i, layer in enumerate(model.layers):
        p = f"layers.{i}."
        for w in ("attention.wq", "attention.wk", "attention.wv", "mlp.w_up", "mlp.w_gate"):
            if w != "mlp.w_gate" or layer.mlp.gated:
                plan[p + w] = ColwiseParallel()
        plan[p + "attention.wo"] = RowwiseParallel(output_layouts=seq)
        plan[p + "mlp.w_down"] = RowwiseParallel(output_layouts=seq)
        if sp:
            plan[p + "attn_norm"] = plan[p + "mlp_norm"] = SequenceParallel()
            plan[p + "attention"] = PrepareModuleInput(
                input_layouts=(Shard(1), None, None),
                desired_input_layouts=(Replicate(), None, None))
            plan[p + "mlp"] = PrepareModuleInput(input_layouts=(Shard(1),),
                                                 desired_input_layouts=(Replicate(),))
    return plan


def step_context(model):
    """DTensor's loss_parallel when the LM head's logits are vocab-sharded (it must cover
    the backward too); nothing otherwise."""
    import contextlib

    from torch.distributed.tensor import DTensor

    if isinstance(model.lm_head.weight, DTensor) and any(
            p.is_shard() and p.dim == 0 for p in model.lm_head.weight.placements):
        from torch.distributed.tensor.parallel import loss_parallel

        return loss_parallel()
    return contextlib.nullcontext()
