"""The Llama-shaped decoder of examples/gpu_llama_jax.py written as PyTorch modules and run
eagerly: fp32 parameters under `torch.autocast("cuda", bfloat16)`, RMSNorm, rotary
embeddings, grouped-query SDPA, SwiGLU, AdamW (torch's default, foreach). It imports
nothing from Flint, so `scripts/capture_gpu.py` runs the same step on a real GPU, profiled,
and Flint traces it without one:

    flint extract examples/gpu_llama_torch.py:llama --framework torch --devices 1 \
        --hardware h200 --no-fuse --estimate
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, D, HEADS, KV_HEADS, FFN, LAYERS, SEQ = 32000, 2048, 16, 4, 5632, 16, 4096
SEQS_PER_REPLICA = 4
HEAD_DIM = D // HEADS


def rotary(x):
    """x [b, heads, s, d]: the rotate-half form of RoPE (base 10000)."""
    s, d = x.shape[2], x.shape[3]
    inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    angles = torch.outer(torch.arange(s, device=x.device, dtype=torch.float32), inv)
    angles = torch.cat([angles, angles], dim=-1)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    rotated = torch.cat([-x2, x1], dim=-1)
    return (x.float() * angles.cos() + rotated.float() * angles.sin()).to(x.dtype)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn_norm, self.mlp_norm = nn.RMSNorm(D, eps=1e-5), nn.RMSNorm(D, eps=1e-5)
        self.wq = nn.Linear(D, D, bias=False)
        self.wk = nn.Linear(D, KV_HEADS * HEAD_DIM, bias=False)
        self.wv = nn.Linear(D, KV_HEADS * HEAD_DIM, bias=False)
        self.wo = nn.Linear(D, D, bias=False)
        self.w_gate = nn.Linear(D, FFN, bias=False)
        self.w_up = nn.Linear(D, FFN, bias=False)
        self.w_down = nn.Linear(FFN, D, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        h = self.attn_norm(x)
        q = self.wq(h).view(b, s, HEADS, HEAD_DIM).transpose(1, 2)
        k = self.wk(h).view(b, s, KV_HEADS, HEAD_DIM).transpose(1, 2)
        v = self.wv(h).view(b, s, KV_HEADS, HEAD_DIM).transpose(1, 2)
        y = F.scaled_dot_product_attention(rotary(q), rotary(k), v, is_causal=True,
                                           enable_gqa=True)
        x = x + self.wo(y.transpose(1, 2).reshape(b, s, D))
        h = self.mlp_norm(x)
        return x + self.w_down(F.silu(self.w_gate(h)) * self.w_up(h))


class Llama(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.final_norm = nn.RMSNorm(D, eps=1e-5)
        self.head = nn.Linear(D, VOCAB, bias=False)

    def forward(self, tokens):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            x = self.embed(tokens)
            for block in self.layers:
                x = block(x)
            return self.head(self.final_norm(x))


def loss_fn(logits, targets):
    return F.cross_entropy(logits.float().view(-1, VOCAB), targets.view(-1))


def llama(device="meta"):
    """Flint's TorchStep fields (a dict, so this file needs no Flint)."""
    tokens = torch.zeros(SEQS_PER_REPLICA, SEQ, dtype=torch.long, device=device)
    return {"model": Llama, "example_inputs": (tokens,), "targets": (tokens,),
            "loss_fn": loss_fn, "optimizer": "adamw"}
