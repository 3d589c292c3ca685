"""PyTorch twins of the JAX zoo decoders (flint/models/decoder.py): same configs, same math.

Attention is SDPA's fused kernel (one aten node forward, one backward), as the JAX twin's
is one flash-attention node; `attention="xla"` writes it as the JAX twin's unfused
reference does (grouped-query matmuls over the full sequence, softmax in float32);
`attention="eager"` writes it as eager PyTorch code of the unfused era did
(flint/models/torch_attention.py, Megatron-LM's 2019 GPT-2 attention: every step of the
score path its own aten op, the scores in the compute dtype, dropout on the probabilities
when the step has it).
Parameters are float32 and compute runs in bfloat16 under autocast, traced with CUDA's
cast policy as the GPU runs it (flint.frontends.torch_autocast). Layers
recompute activations by the same policies as the JAX twin (`remat`).

`zoo_step` parallelizes the twin with flint/models/torch_parallel.py (Megatron TP with
DTensor, FSDP2, HSDP, data parallelism). MoE models (experts, top-k, shared experts; GQA
attention) use flint/models/torch_moe.py.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from flint.models import TORCH_GEMM_PRECISIONS
from flint.models.decoder import DecoderConfig
from flint.models.torch_attention import eager_core
from flint.models.torch_parallel import data_parallel, parallelize, step_context

class RMSNorm(nn.Module):
    def __init__(self, d: int, layer_norm: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.layer_norm = layer_norm

    def forward(self, x):
        # normalized in float32, scaled by the weight in the input's dtype, as torchtitan's
        # and Hugging Face's Llama RMSNorm do: the backward keeps the f32 input and the
        # bf16 normalized values, not a second f32 copy
        x32 = x.float()
        if self.layer_norm:
            x32 = x32 - x32.mean(-1, keepdim=True)
        y = x32 * torch.rsqrt((x32 * x32).mean(-1, keepdim=True) + 1e-6)
        return y.to(x.dtype) * self.weight


class Attention(nn.Module):
    def __init__(self, cfg: DecoderConfig, dropout: float = 0.0):
        super().__init__()
        hd = cfg.head_dim
        self.cfg, self.hd, self.dropout = cfg, hd, dropout
        self.wq = nn.Linear(cfg.d_model, cfg.n_heads * hd, bias=False)
        self.wk = nn.Linear(cfg.d_model, cfg.n_kv_heads * hd, bias=False)
        self.wv = nn.Linear(cfg.d_model, cfg.n_kv_heads * hd, bias=False)
        self.wo = nn.Linear(cfg.n_heads * hd, cfg.d_model, bias=False)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        hd, group = self.hd, self.cfg.n_heads // self.cfg.n_kv_heads
        # -1 head counts: under tensor parallelism each rank holds a slice of the heads.
        q = self.wq(x).view(b, s, -1, hd)
        k = self.wk(x).view(b, s, -1, hd)
        v = self.wv(x).view(b, s, -1, hd)
        if cos is not None:
            q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        if self.cfg.attention == "flash":
            # SDPA's fused kernel (flash on GPUs; its CPU twin under fake tensors), K/V
            # repeated to the query heads as torchtitan's repeat_kv does
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
            k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
            out = _causal_sdpa(q, k, v)
            return self.wo(out.transpose(1, 2).reshape(b, s, -1))
        if self.cfg.attention == "eager":
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
            k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
            out = eager_core(q, k, v, self.dropout, self.training)
            return self.wo(out.transpose(1, 2).reshape(b, s, -1))
        kv = k.shape[2]
        q = q.view(b, s, kv, group, hd).permute(0, 2, 3, 1, 4).reshape(b, kv, group * s, hd)
        scores = torch.matmul(q, k.permute(0, 2, 3, 1)).float() / math.sqrt(hd)
        causal = torch.ones(s, s, dtype=torch.bool, device=x.device).tril()
        scores = scores.view(b, kv, group, s, s).masked_fill(~causal, torch.finfo(torch.float32).min)
        probs = torch.softmax(scores, dim=-1).to(x.dtype).view(b, kv, group * s, s)
        out = torch.matmul(probs, v.permute(0, 2, 1, 3))              # b, kv, g*s, hd
        out = out.view(b, kv, group, s, hd).permute(0, 3, 1, 2, 4).reshape(b, s, -1)
        return self.wo(out)


def _causal_sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _rope(x, cos, sin):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1).to(x.dtype)


class MLP(nn.Module):
    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.gated = cfg.mlp == "swiglu"
        self.relu2 = cfg.mlp == "relu2"
        self.relu = cfg.mlp == "relu"
        self.w_up = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.w_down = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)
        if self.gated:
            self.w_gate = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)

    def forward(self, x):
        up = self.w_up(x)
        if self.gated:
            up = F.silu(self.w_gate(x)) * up
        elif self.relu2:
            up = torch.square(F.relu(up))
        elif self.relu:
            up = F.relu(up)
        else:
            up = F.gelu(up)
        return self.w_down(up)


class Block(nn.Module):
    def __init__(self, cfg: DecoderConfig, moe: bool = False, attention_dropout: float = 0.0):
        super().__init__()
        layer_norm = cfg.norm == "layer"
        self.attn_norm, self.mlp_norm = RMSNorm(cfg.d_model, layer_norm), RMSNorm(cfg.d_model, layer_norm)
        self.attention, self.mlp = Attention(cfg, attention_dropout), MLP(cfg)
        if moe:
            from flint.models.torch_moe import MoE

            self.mlp = MoE(cfg)

    def forward(self, x, cos=None, sin=None):
        if self.attention.cfg.remat == "selective":
            # inside the block, so FSDP2's hooks on it stay outside the checkpointed region
            # (torchtitan wraps each block in checkpoint_wrapper before fully_shard)
            return checkpoint(self._layer, x, cos, sin, use_reentrant=False,
                              context_fn=op_sac_context)
        return self._layer(x, cos, sin)

    def _layer(self, x, cos, sin):
        x = x + self.attention(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


class Decoder(nn.Module):
    def __init__(self, cfg: DecoderConfig, attention_dropout: float = 0.0,
                 compiled: bool = False):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.d_model)
        if cfg.pos == "learned":
            self.pos_embed = nn.Embedding(cfg.seq_len, cfg.d_model)
        if cfg.kv_lora:
            from flint.errors import FlintError

            raise FlintError(f"{cfg.name}: latent attention (MLA) is in the JAX zoo only")
        self.layers = nn.ModuleList(Block(cfg, cfg.is_moe and i >= cfg.first_dense,
                                          attention_dropout) for i in range(cfg.n_layers))
        self.final_norm = RMSNorm(cfg.d_model, cfg.norm == "layer")
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        if cfg.gemm_precision == "fp8":      # torchao Float8 (torchtitan's), not the head
            from flint.models.torch_float8 import convert_linears

            convert_linears(self, skip=("lm_head",), share_casts=compiled)

    def forward(self, tokens):
        s = tokens.shape[1]
        x = self.embed(tokens)
        cos = sin = None
        if self.cfg.pos == "learned":
            x = x + self.pos_embed(torch.arange(s, device=tokens.device))
        else:
            half = self.cfg.head_dim // 2
            freqs = 500000.0 ** (-torch.arange(half, dtype=torch.float32, device=tokens.device) / half)
            ang = torch.arange(s, dtype=torch.float32, device=tokens.device)[:, None] * freqs[None]
            cos, sin = ang.cos(), ang.sin()
        # CPU autocast, so the twin also runs eagerly on this machine (flint validate's
        # live CPU profile); under Flint's trace every autocast follows CUDA's cast policy
        with torch.autocast("cpu", dtype=torch.bfloat16):
            for layer in self.layers:
                x = _remat(layer, self.cfg.remat, x, cos, sin)
            x = self.final_norm(x)
            return self.lm_head(x).float()


def _remat(layer, policy: str, x, cos, sin):
    """One decoder layer under an activation-recompute policy (flint.models.REMAT_POLICIES):
    `full` keeps only the layer's input and re-runs the layer in the backward; `selective`
    is PyTorch's selective activation checkpointing as torchtitan applies it per block
    (its "selective op" mode, the default of its Llama recipes): op_sac_context; `none`
    keeps everything. The capture turns the policy's tags into recompute
    (flint.frontends.torch_sac). (`dots` is the JAX twin's alone.)"""
    if policy == "full":
        return checkpoint(layer, x, cos, sin, use_reentrant=False)
    return layer(x, cos, sin)       # selective: Block.forward checkpoints its own math


# torchtitan's op-level SAC save list (torchtitan/distributed/activation_checkpoint.py,
# `_save_list`): the outputs of matmuls, the fused attention kernels (the CPU flash kernel
# stands for the GPU's under Flint's trace) and reduce-scatters are kept; everything else
# (norms, activations, rotary, casts, views) is recomputed in the backward
_OP_SAC_SAVED = ("mm", "_scaled_mm", "_scaled_dot_product_flash_attention",
                 "_scaled_dot_product_flash_attention_for_cpu",
                 "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
                 "reduce_scatter_tensor", "max")


def op_sac_context():
    """torchtitan's "selective op" policy for one block: every op in _OP_SAC_SAVED keeps
    its output except every second matmul of the block (counted separately in the forward
    and in the recompute, so both count the same matmuls), which is recomputed with the
    rest."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    counts = {"forward": 0, "recompute": 0}

    def policy(ctx, func, *args, **kwargs):
        name = func.__name__.split(".")[0]
        # torchao's FP8 GEMM reaches SAC as aten.mm on its Float8Tensor subclass: the
        # twin's _scaled_mm counts as the matmul it is
        if name in ("mm", "_scaled_mm"):
            mode = "recompute" if ctx.is_recompute else "forward"
            counts[mode] += 1
            if counts[mode] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
        return (CheckpointPolicy.MUST_SAVE if name in _OP_SAC_SAVED
                else CheckpointPolicy.PREFER_RECOMPUTE)

    return create_selective_checkpoint_contexts(policy)


# The policies the torch twin runs (flint.models.REMAT_POLICIES less `dots`).
TORCH_REMAT_POLICIES = ("none", "full", "selective")


def config(name, dims: dict | None = None, **overrides) -> DecoderConfig:
    """A zoo/preset name, model YAML / HF config.json path, mapping of dims or config,
    with `dims` (user keys: layers, hidden, heads, ..., flint.models.describe) applied."""
    from flint.models.describe import resolve_model

    return resolve_model(name, dims).with_(scan=False, **{k: v for k, v in overrides.items()
                                                          if v is not None})


def cross_entropy(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def zoo_step(name: str, batch_per_replica: int = 1, seq_len: int | None = None,
             layers: int | None = None, optimizer="adamw", sequence_parallel: bool = False,
             remat: str = "none", dims: dict | None = None,
             reshard_after_forward: bool = True, attention: str = "flash",
             attention_dropout: float = 0.0, gemm_precision: str = "bf16",
             compiled: bool = False):
    """The TorchStep of a zoo twin and its config (tokens are one rank's batch);
    `attention`: flash (SDPA) | eager (the unfused score path, torch_attention.eager_core),
    whose probabilities take `attention_dropout`; `gemm_precision` fp8: the blocks'
    linears as torchao's Float8Linear (flint.models.torch_float8), an input they share
    cast once when `compiled` (torch.compile's CSE)."""
    from flint.frontends.torch_capture import TorchStep

    if remat not in TORCH_REMAT_POLICIES:
        from flint.errors import FlintError

        raise FlintError(f"remat {remat!r}: the torch twin runs {' | '.join(TORCH_REMAT_POLICIES)}"
                         f" (torch's selective activation checkpointing, `dots`, does not "
                         f"trace under make_fx)")
    if gemm_precision not in TORCH_GEMM_PRECISIONS:
        from flint.errors import FlintError

        raise FlintError(f"gemm precision {gemm_precision!r}: the torch twin runs "
                         f"{' | '.join(TORCH_GEMM_PRECISIONS)} (fp8: torchao's tensorwise "
                         f"dynamic scaling)")
    cfg = config(name, dims, seq_len=seq_len, n_layers=layers, remat=remat,
                 attention=attention, gemm_precision=gemm_precision)
    tokens = torch.empty(batch_per_replica, cfg.seq_len, dtype=torch.long, device="meta")
    def par(model, mesh):
        return parallelize(model, mesh, sequence_parallel, reshard_after_forward)

    return TorchStep(lambda: Decoder(cfg, attention_dropout, compiled), (tokens,),
                     (tokens,), cross_entropy, optimizer, par, step_context,
                     on_materialize=data_parallel), cfg
