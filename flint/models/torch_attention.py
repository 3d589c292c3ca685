"""The torch twin's unfused attention core as eager PyTorch code of the unfused era wrote it
(flint.models.torch_decoder, `attention="eager"`)."""
from __future__ import annotations

import math

import torch


def eager_core(q, k, v, dropout: float, training: bool):
    """The score path of Megatron-LM's 2019 GPT2ParallelSelfAttention (mpu/transformer.py,
    the code of Shoeybi et al. 2019), one aten op per step: QK^T, the scale, the causal
    mask as a multiply and a subtract, softmax, dropout on the probabilities, PV. Its
    model ran in half precision (FP16_Module), so the scores and probabilities stay in
    the compute dtype: autocast, which would run softmax in float32, is off around them."""
    s, hd = q.shape[2], q.shape[3]
    scores = torch.matmul(q, k.transpose(-1, -2))               # b, h, s, s
    with torch.autocast("cpu", enabled=False):
        scores = scores / math.sqrt(hd)
        mask = torch.ones(s, s, dtype=scores.dtype, device=scores.device).tril()
        scores = torch.mul(scores, mask) - 10000.0 * (1.0 - mask)
        probs = torch.softmax(scores, dim=-1)
        if dropout:
            # what F.dropout runs on a GPU (ATen Dropout.cpp, is_fused_kernel_acceptable):
            # one kernel writing the output and a bool mask, its backward one kernel
            # reading that mask; the CPU path the trace would take is three kernels
            probs = torch.native_dropout(probs, dropout, training)[0]
    return torch.matmul(probs, v)
