"""A nanoGPT-style GPT-2 trained as nanoGPT trains it: DistributedDataParallel,
`torch.autocast(device_type="cuda", dtype=torch.bfloat16)` made once at module level,
gradient accumulation that syncs gradients only on the last micro-step, gradient
clipping, AdamW. The step is a decorated function, given to the CLI as it is:

    flint extract examples/nanogpt_ddp.py:train_step --framework torch --devices 64 --estimate

Flint traces DDP's gradient buckets (1 MiB first, then `bucket_cap_mb`, 25 MiB by default)
as one all-reduce each, overlapping the last micro-step's backward, and the autocast
region as the GPU runs it (bf16 GEMMs), although the trace runs on CPU fake tensors.
The model is written here from GPT-2's published architecture (Radford et al. 2019).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import flint

VOCAB, N_EMBD, N_HEAD, N_LAYER, BLOCK = 50304, 768, 12, 12, 1024
MICRO_BATCH, GRAD_ACCUM = 8, 4          # sequences per rank per micro-step, micro-steps
BUCKET_CAP_MB = None                    # DDP's default (25 MiB, first bucket 1 MiB)
ctx = torch.autocast(device_type="cuda", dtype=torch.bfloat16)


class CausalSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn = nn.Linear(N_EMBD, 3 * N_EMBD)
        self.c_proj = nn.Linear(N_EMBD, N_EMBD)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(N_EMBD, dim=2)
        q, k, v = (z.view(b, t, N_HEAD, c // N_HEAD).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(N_EMBD), nn.LayerNorm(N_EMBD)
        self.attn = CausalSelfAttention()
        self.mlp = nn.Sequential(nn.Linear(N_EMBD, 4 * N_EMBD), nn.GELU(approximate="tanh"),
                                 nn.Linear(4 * N_EMBD, N_EMBD))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(VOCAB, N_EMBD), wpe=nn.Embedding(BLOCK, N_EMBD),
            h=nn.ModuleList(Block() for _ in range(N_LAYER)), ln_f=nn.LayerNorm(N_EMBD)))
        self.lm_head = nn.Linear(N_EMBD, VOCAB, bias=False)
        self.transformer.wte.weight = self.lm_head.weight      # weight tying

    def forward(self, idx, targets):
        pos = torch.arange(0, idx.shape[1], dtype=torch.long, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def ddp(model, mesh):
    # nanoGPT passes its local GPU; Flint's model lives on the meta device
    return DDP(model, device_ids=[0], process_group=mesh.get_group(),
               bucket_cap_mb=BUCKET_CAP_MB)


@flint.capture(devices=64, mesh={"dp": 64}, parallelize=ddp)
def train_step(model, optimizer, x, y):
    for micro_step in range(GRAD_ACCUM):
        model.require_backward_grad_sync = micro_step == GRAD_ACCUM - 1
        with ctx:
            _, loss = model(x, y)
            loss = loss / GRAD_ACCUM
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def example_args():
    """(model class, optimizer, one rank's micro-batch of token ids and targets)."""
    tokens = torch.empty(MICRO_BATCH, BLOCK, dtype=torch.long, device="meta")
    return GPT, "adamw", tokens, tokens
