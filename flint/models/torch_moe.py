"""PyTorch twin of the zoo's mixture-of-experts layer (flint/models/moe.py): same routing,
same capacity buffer, same math, with expert parallelism over an EP process group.

Routing: f32 router logits, top-k, softmax over the k picked logits; each (token, choice)
takes the next free slot of its expert's buffer of `capacity` rows per sequence (the
balanced count when dropless; see flint.models.moe), filled by a gather (Megatron-Core's
permute), empty slots zero. With expert parallelism (`expert_parallel(model, ep_mesh)`:
each rank keeps E / ep experts, contiguous) the buffer goes to the experts' ranks with one
`all_to_all_single` over the EP group (dispatch), runs through the local experts as
batched GEMMs (torch.bmm, experts as the batch: a grouped GEMM of equal groups), and comes
back with a second one (combine); the gradients of the dense parameters are averaged over
the EP group, as EP ranks are data-parallel ranks for everything but the experts.

Scope of the twin (the JAX zoo model has the rest): GQA attention only (no MLA), no
tensor parallelism inside MoE models, data x expert meshes (no FSDP of MoE models).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def capacity(cfg, seq: int) -> int:
    cf = cfg.capacity_factor or 1.0
    return max(1, math.ceil(cf * seq * cfg.top_k / cfg.n_experts))


class MoE(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        e, d, f = cfg.n_experts, cfg.d_model, cfg.moe_ffn
        self.router = nn.Linear(d, e, bias=False)
        self.w_up = nn.Parameter(torch.empty(e, d, f))
        self.w_gate = nn.Parameter(torch.empty(e, d, f))
        self.w_down = nn.Parameter(torch.empty(e, f, d))
        for w in (self.w_up, self.w_gate, self.w_down):
            nn.init.normal_(w, std=0.02)
        self.shared = None
        if cfg.n_shared_experts:
            fs = cfg.n_shared_experts * f
            self.shared = nn.ModuleDict({"s_up": nn.Linear(d, fs, bias=False),
                                         "s_gate": nn.Linear(d, fs, bias=False),
                                         "s_down": nn.Linear(fs, d, bias=False)})
        self.ep_group = None
        self.ep = 1

    def forward(self, x):
        y = self._routed(x)
        if self.shared is not None:
            s = self.shared
            y = y + s["s_down"](F.silu(s["s_gate"](x)) * s["s_up"](x))
        return y

    def _routed(self, x):
        cfg = self.cfg
        b, s, d = x.shape
        e, k, ep = cfg.n_experts, cfg.top_k, self.ep
        cap = capacity(cfg, s)
        logits = self.router(x).float()
        top, idx = logits.topk(k, dim=-1)
        gates = top.softmax(-1).to(x.dtype)
        choice = idx.reshape(b, s * k)
        onehot = F.one_hot(choice, e)
        pos = (onehot.cumsum(1) * onehot).sum(-1) - 1
        keep = pos < cap
        slot = torch.where(keep, choice * cap + pos, torch.full_like(choice, e * cap))
        order = torch.arange(s * k, device=x.device).expand(b, -1)
        source = torch.full((b, e * cap + 1), s * k, dtype=torch.long, device=x.device)
        source = source.scatter(1, slot, order)[:, :e * cap] // k      # token row; s = empty
        # tokens travel in the compute dtype (bf16 under autocast), not the residual's f32
        dtype = (torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu")
                 else x.dtype)
        padded = torch.cat([x, x.new_zeros(b, 1, d)], dim=1).to(dtype)
        buf = torch.gather(padded, 1, source[..., None].expand(-1, -1, d))
        # expert-major: [experts, b * cap, d], experts contiguous per destination rank
        send = buf.view(b, e, cap, d).transpose(0, 1).reshape(e * b * cap, d)
        if ep > 1:
            from torch.distributed import _functional_collectives as funcol

            send = funcol.all_to_all_single(send, None, None, self.ep_group)
        tokens = send.view(ep, e // ep, b * cap, d).transpose(0, 1).reshape(
            e // ep, ep * b * cap, d)
        h = F.silu(torch.bmm(tokens, self.w_gate.to(dtype))) * torch.bmm(
            tokens, self.w_up.to(dtype))
        y = torch.bmm(h, self.w_down.to(dtype))
        back = y.view(e // ep, ep, b * cap, d).transpose(0, 1).reshape(e * b * cap, d)
        if ep > 1:
            from torch.distributed import _functional_collectives as funcol

            back = funcol.all_to_all_single(back, None, None, self.ep_group)
        got = back.view(e, b, cap, d).transpose(0, 1).reshape(b, e * cap, d)
        got = torch.cat([got, got.new_zeros(b, 1, d)], dim=1)
        picked = torch.gather(got, 1, slot[..., None].expand(-1, -1, d))
        w = (gates.reshape(b, s * k) * keep).to(picked.dtype)
        return (picked * w[..., None]).view(b, s, k, d).sum(2)


def expert_parallel(model, ep_mesh) -> None:
    """Keep each rank's E / ep experts (contiguous); `average_dense_grads` (once the model
    is materialized) averages the other parameters' gradients over the EP group."""
    ep = ep_mesh.size()
    if ep == 1:
        return
    group = ep_mesh.get_group()
    rank = ep_mesh.get_local_rank()
    moes = [m for m in model.modules() if isinstance(m, MoE)]
    for m in moes:
        if m.cfg.n_experts % ep:
            from flint.errors import FlintError

            raise FlintError(f"{m.cfg.n_experts} experts do not divide over expert={ep}")
        n = m.cfg.n_experts // ep
        for name in ("w_up", "w_gate", "w_down"):
            full = getattr(m, name)
            setattr(m, name, nn.Parameter(full.detach()[rank * n:(rank + 1) * n].clone()))
        m.ep, m.ep_group = ep, group


def average_dense_grads(model, ep_mesh) -> None:
    """Every non-expert gradient averaged over the EP group as soon as it is accumulated."""
    if ep_mesh.size() == 1:
        return
    from torch.distributed import _functional_collectives as funcol

    group = ep_mesh.get_group()
    experts = {id(getattr(m, n)) for m in model.modules() if isinstance(m, MoE)
               for n in ("w_up", "w_gate", "w_down")}

    def average(p):
        p.grad.copy_(funcol.all_reduce(p.grad, "avg", group))

    for p in model.parameters():
        if id(p) not in experts:
            p.register_post_accumulate_grad_hook(average)
