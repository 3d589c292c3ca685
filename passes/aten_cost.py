"""Flops, transcendentals and bytes of one aten op, from the shapes of its fake tensors.

Conventions follow XLA's HloCostAnalysis (and so Flint's HLO lowering), so the torch and
JAX twins of a model can be compared: a multiply-add is 2 flops; an elementwise op is one
flop per output element; exp/log/tanh/rsqrt/... count as transcendentals; bytes are every
distinct tensor read plus every tensor written.

Op classes: "view" (metadata only: no time), "gemm", "conv", "attention", "elementwise",
"reduction", "data_movement" (copies, gathers, concatenation), "collective", "host"
(profiler markers and the like), "unknown" (costed conservatively: reads + writes, one flop
per output element, and counted in the report).
"""
from __future__ import annotations

import math

import torch

VIEWS = frozenset({
    "view", "_unsafe_view", "reshape", "t", "transpose", "permute", "expand", "as_strided",
    "slice", "select", "unsqueeze", "squeeze", "detach", "alias", "split", "split_with_sizes",
    "unbind", "chunk", "narrow", "view_as", "expand_as", "lift_fresh_copy", "lift_fresh",
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "unfold",
    "_reshape_alias", "diagonal", "movedim", "squeeze_", "unsqueeze_", "t_", "set_",
    "scalar_tensor", "_local_scalar_dense", "resize_", "sym_size", "sym_stride", "getitem",
    # complex tensors viewed as (re, im) pairs and lazy conjugation (complex rotary)
    "view_as_complex", "view_as_real", "_conj", "conj", "_neg_view",
})
HOST = frozenset({"_record_function_enter_new", "_record_function_exit", "_record_function_enter",
                  "_assert_async", "_assert_scalar"})
TRANSCENDENTAL = frozenset({
    "exp", "exp_", "log", "log_", "log1p", "expm1", "tanh", "tanh_", "sigmoid", "sigmoid_",
    "rsqrt", "sqrt", "sqrt_", "sin", "cos", "erf", "erfinv", "pow", "silu", "silu_", "gelu",
    "softplus", "_softmax", "_log_softmax", "log_sigmoid_forward", "reciprocal", "atan2",
    "_safe_softmax",    # SDPA's math path (rows that are fully masked give 0, not NaN)
})
REDUCTIONS = frozenset({
    "sum", "mean", "amax", "amin", "max", "min", "prod", "var", "std", "var_mean", "norm",
    "linalg_vector_norm", "argmax", "argmin", "logsumexp", "_softmax", "_log_softmax",
    "_safe_softmax",
    "_softmax_backward_data", "_log_softmax_backward_data", "nll_loss_forward",
    "nll_loss_backward", "native_layer_norm", "native_layer_norm_backward", "_fused_rms_norm",
    "native_batch_norm", "native_batch_norm_backward", "cumsum", "all", "any",
})
DATA_MOVEMENT = frozenset({
    "_to_copy", "copy_", "copy", "clone", "contiguous", "cat", "stack", "index", "index_select",
    "gather", "scatter", "scatter_", "scatter_add", "index_put", "index_put_", "index_add",
    "embedding",
    "embedding_dense_backward", "slice_backward", "select_backward", "slice_scatter",
    "select_scatter", "constant_pad_nd", "roll", "flip", "repeat", "repeat_interleave",
    "zeros", "zeros_like", "ones", "ones_like", "full", "full_like", "fill_", "zero_",
    "arange", "tril", "triu", "new_zeros", "new_ones",
    "all_gather_copy_in", "split_with_sizes_copy", "chunk_cat", "nonzero", "sort", "topk",
    "_foreach_copy_", "_foreach_copy",
})
# Flops per element of the fused normalization / softmax kernels (XLA counts the same
# arithmetic when it sees them as separate ops): mean, subtract, square, mean, rsqrt,
# scale, shift for a layer norm.
PER_ELEMENT = {"native_layer_norm": 7, "native_layer_norm_backward": 12, "_fused_rms_norm": 5,
               "_softmax": 4, "_log_softmax": 4, "_safe_softmax": 4, "_softmax_backward_data": 3,
               "_log_softmax_backward_data": 3, "native_batch_norm": 7,
               "native_batch_norm_backward": 12, "addcdiv_": 3, "addcmul_": 3, "lerp_": 3,
               "addcdiv": 3, "addcmul": 3, "lerp": 3}
SDPA = {"_scaled_dot_product_flash_attention": 1.0,
        "_scaled_dot_product_flash_attention_for_cpu": 1.0,
        "_scaled_dot_product_efficient_attention": 1.0,
        "_scaled_dot_product_cudnn_attention": 1.0,
        "_flash_attention_forward": 1.0, "_efficient_attention_forward": 1.0,
        "_scaled_dot_product_flash_attention_backward": 2.5,
        "_scaled_dot_product_flash_attention_for_cpu_backward": 2.5,
        "_scaled_dot_product_efficient_attention_backward": 2.5,
        "_scaled_dot_product_cudnn_attention_backward": 2.5,
        "_flash_attention_backward": 2.5, "_efficient_attention_backward": 2.5,
        # FlexAttention's higher-order ops (torchtitan): q, k, v come first in both
        "flex_attention": 1.0, "flex_attention_backward": 2.5}
# A flex block mask's sparsity is data (fake tensors carry none), so flex attention is
# costed without mask savings: an upper bound (a causal mask skips about half the blocks).
FLEX = frozenset({"flex_attention", "flex_attention_backward"})


def op_name(target) -> str:
    """`aten.mm.default` -> "mm"; `operator.getitem` -> "getitem"."""
    name = getattr(target, "__name__", str(target))
    schema = getattr(target, "_schema", None)
    if schema is not None:
        return schema.name.split("::")[-1]
    return name.split(".")[0]


def tensors(x) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for y in x for t in tensors(y)]
    return []


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def op_class(name: str) -> str:
    if name in HOST:
        return "host"
    if name in VIEWS:
        return "view"
    if name in ("mm", "bmm", "addmm", "baddbmm", "matmul", "linear", "_scaled_mm", "addbmm"):
        return "gemm"
    if name.startswith("convolution") or name in ("_convolution", "conv2d", "conv1d"):
        return "conv"
    if name in SDPA or name == "scaled_dot_product_attention":
        return "attention"
    if name in REDUCTIONS:
        return "reduction"
    if name in DATA_MOVEMENT:
        return "data_movement"
    if _looks_elementwise(name):
        return "elementwise"
    return "unknown"


_ELEMENTWISE = frozenset({
    "add", "sub", "mul", "div", "neg", "abs", "relu", "threshold_backward", "gelu_backward",
    "silu_backward", "sigmoid_backward", "tanh_backward", "maximum", "minimum", "clamp",
    "clamp_min", "clamp_max", "eq", "ne", "lt", "le", "gt", "ge", "logical_not", "bitwise_not",
    "bitwise_or", "bitwise_and", "rsub", "square", "sign", "floor", "ceil", "round",
    "hardtanh", "leaky_relu", "dropout", "native_dropout", "native_dropout_backward",
    "masked_fill_", "logical_and", "logical_or", "_foreach_add", "addcdiv", "addcmul",
    "lerp", "fmod", "remainder", "trunc", "isnan", "isinf", "nan_to_num", "where",
    "masked_fill", "polar", "complex",
    "bernoulli", "uniform", "normal", "rand_like", "randn_like",   # dropout masks, init
})


def _looks_elementwise(name: str) -> bool:
    base = name.rstrip("_")
    return (base in _ELEMENTWISE or base in TRANSCENDENTAL or name in TRANSCENDENTAL
            or name in PER_ELEMENT)


def cost(name: str, args, named: dict, out) -> tuple[float, float]:
    """(flops, transcendentals) of one execution; `named` maps the schema's argument names
    to their values (positional or keyword)."""
    outs = tensors(out)
    out_elems = sum(t.numel() for t in outs)
    if name in ("mm", "matmul", "_scaled_mm"):     # _scaled_mm: FP8 with per-tensor scales
        a, b = args[0], args[1]
        return 2.0 * a.shape[0] * a.shape[1] * b.shape[-1], 0.0
    if name == "addmm":
        a, b = args[1], args[2]
        return 2.0 * a.shape[0] * a.shape[1] * b.shape[1] + out_elems, 0.0
    if name in ("bmm", "baddbmm"):
        a, b = (args[0], args[1]) if name == "bmm" else (args[1], args[2])
        return 2.0 * a.shape[0] * a.shape[1] * a.shape[2] * b.shape[2], 0.0
    if name.startswith("convolution"):
        return _conv_flops(name, args, outs), 0.0
    if name in SDPA or name == "scaled_dot_product_attention":
        return _attention_flops(name, args, named), 0.0
    if name in DATA_MOVEMENT:
        return 0.0, 0.0
    per = PER_ELEMENT.get(name, 1)
    if name in REDUCTIONS:
        ins = tensors(args[:1])
        n = max(sum(t.numel() for t in ins), out_elems)
        trans = (ins[0].numel() if ins else out_elems) if name in (
            "_softmax", "_log_softmax", "_safe_softmax") else 0
        return float(per * n), float(trans)
    trans = float(out_elems) if name.rstrip("_") in TRANSCENDENTAL or name in TRANSCENDENTAL else 0.0
    if outs and outs[0].is_complex():   # (a+bi)(c+di): 4 multiplies, 2 adds; sums: 2 adds
        per *= 6 if name.rstrip("_") in ("mul", "div") else 2
    return float(per * out_elems), trans


def _conv_flops(name: str, args, outs) -> float:
    if name == "convolution_backward":       # (grad_out, input, weight, ..., output_mask)
        grad, w = args[0], args[2]
        mask = args[-1] if isinstance(args[-1], (list, tuple)) else [True, True, False]
        fwd = 2.0 * grad.numel() * math.prod(w.shape[1:])
        return fwd * (int(bool(mask[0])) + int(bool(mask[1])))
    if not outs:
        return 0.0
    return 2.0 * outs[0].numel() * math.prod(args[1].shape[1:])     # (input, weight, ...)


def _attention_flops(name: str, args, named: dict) -> float:
    """4 * B * H * Sq * Sk * D for QK^T and PV; a causal mask halves it (flash kernels
    skip fully masked blocks; the same convention as passes.attention). Backward: 2.5x
    (two matmuls per forward one, plus recomputing QK^T)."""
    q, k = args[0], args[1]
    if name.endswith("_backward") and name not in FLEX:
        q, k = args[1], args[2]      # (grad_out, query, key, value, ...)
    b, h, sq, d = q.shape[0], q.shape[1], q.shape[-2], q.shape[-1]
    sk = k.shape[-2]
    causal = bool(named.get("is_causal", False))
    flops = 4.0 * b * h * sq * sk * d
    if causal and sq == sk:
        flops *= 0.5
    return flops * SDPA.get(name, 1.0)


# SDPA ops that name the fused kernel they run (hardware_models.attention_kernels): a
# program traced where torch picked its back end keeps that choice. The CPU variant (a
# trace on a host) and the memory-efficient kernel name none Flint prices as its own.
SDPA_BACKEND = {"_scaled_dot_product_cudnn_attention": "cudnn",
                "_scaled_dot_product_cudnn_attention_backward": "cudnn",
                "_scaled_dot_product_flash_attention": "flash2",
                "_scaled_dot_product_flash_attention_backward": "flash2",
                "_flash_attention_forward": "flash2", "_flash_attention_backward": "flash2"}


def attention_meta(name: str, args, named: dict) -> dict:
    """The shapes an attention cost model needs (the contract of passes.attention), and
    the kernel where the op names it."""
    q, k = (args[1], args[2]) if name.endswith("_backward") and name not in FLEX \
        else (args[0], args[1])
    dtype = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}.get(
        getattr(q, "dtype", None), "bf16")
    return {"batch": int(q.shape[0]), "heads": int(q.shape[1]), "kv_heads": int(k.shape[1]),
            "seq_q": int(q.shape[-2]), "seq_kv": int(k.shape[-2]), "head_dim": int(q.shape[-1]),
            "causal": bool(named.get("is_causal", False)),
            "backward": name.endswith("_backward"), "dtype": dtype,
            **({"impl": SDPA_BACKEND[name]} if name in SDPA_BACKEND else {})}
