"""Tensor + sequence parallelism with `parallelize_module` and FSDP2 on a 2-D
DeviceMesh, the way PyTorch's tensor-parallel tutorial composes them: a Llama-style
decoder (RMSNorm, rotary-free grouped attention, SwiGLU) whose norms run sequence-parallel
(`SequenceParallel`), whose attention and MLP are column/row parallel with their inputs
gathered from the sequence shards (`PrepareModuleInput`), and FSDP2 over the other mesh
dimension. Mixed precision by autocast.

    flint extract examples/torch_tp_sp_fsdp2.py:llama --framework torch --devices 64 --mesh dp=8,tp=8

Sequence parallelism turns each layer's TP all-reduces into an all-gather before the
column-parallel GEMMs and a reduce-scatter after the row-parallel ones, forward and
backward.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, DIM, HEADS, KV_HEADS, FFN, LAYERS, SEQ = 32768, 2048, 16, 8, 5632, 8, 4096
SEQS_PER_REPLICA = 1


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.head_dim = DIM // HEADS
        self.wq = nn.Linear(DIM, HEADS * self.head_dim, bias=False)
        self.wk = nn.Linear(DIM, KV_HEADS * self.head_dim, bias=False)
        self.wv = nn.Linear(DIM, KV_HEADS * self.head_dim, bias=False)
        self.wo = nn.Linear(HEADS * self.head_dim, DIM, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds a slice of them
        q = self.wq(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.wo(y.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = nn.Linear(DIM, FFN, bias=False)
        self.w3 = nn.Linear(DIM, FFN, bias=False)
        self.w2 = nn.Linear(FFN, DIM, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention_norm, self.ffn_norm = nn.RMSNorm(DIM), nn.RMSNorm(DIM)
        self.attention, self.feed_forward = Attention(), FeedForward()

    def forward(self, x):
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.RMSNorm(DIM)
        self.output = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens):
        x = self.tok_embeddings(tokens)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            for layer in self.layers:
                x = layer(x)
            return self.output(self.norm(x)).float()


def parallelize(model, mesh):
    """TP + SP over `tp`, then FSDP2 over `dp` (the 2-D mesh of the PyTorch tutorial)."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                                   RowwiseParallel, SequenceParallel,
                                                   parallelize_module)

    tp = mesh["tp"]
    parallelize_module(model, tp, {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    })
    for block in model.layers:
        parallelize_module(block, tp, {
            "attention_norm": SequenceParallel(),
            "attention": PrepareModuleInput(input_layouts=(Shard(1),),
                                            desired_input_layouts=(Replicate(),)),
            "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            "ffn_norm": SequenceParallel(),
            "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),),
                                               desired_input_layouts=(Replicate(),)),
            "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
        })
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    return model


def llama():
    import flint.torch as ft

    tokens = torch.empty(SEQS_PER_REPLICA, SEQ, dtype=torch.long, device="meta")
    return ft.TorchStep(model=Transformer, example_inputs=(tokens,), targets=(tokens,),
                        loss_fn=lambda logits, t: F.cross_entropy(logits.flatten(0, 1),
                                                                  t.flatten()),
                        optimizer="adamw", parallelize=parallelize)
