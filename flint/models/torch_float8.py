"""Float8 training of the torch twin's linears as torchao runs it for torchtitan
(`--float8.enable_float8_linear`; torchao.float8 Float8Linear, its default recipe:
tensorwise dynamic scaling, "current" scaling in Transformer Engine's words).

Each GEMM operand is scaled by one number computed from its own absolute maximum in the
same step (torchao float8_utils.tensor_to_amax: torch.max(torch.abs(x)); amax_to_scale:
finfo.max / clamp(amax, EPS) in float32) and cast with saturation (to_fp8_saturated:
clamp, then .to(float8)): inputs and weights to e4m3, output gradients to e5m2
(Float8LinearConfig's defaults). The three GEMMs are torch._scaled_mm calls (cuBLASLt FP8,
bf16 out, the inverse scales applied in the epilogue). cuBLASLt's FP8 GEMM takes only the
"TN" layout (first operand row-major, second column-major), so the backward GEMMs that
contract over the tokens need transposed copies of their FP8 operands (torchao's mm
dispatch: `.t().contiguous().t()`); torch.compile writes them from the cast kernel
instead, which this twin does not model (one FP8 copy, 2 bytes an element, each).

What the trace then holds per linear: forward an amax reduction and a scale-and-cast for
the input and for the (gathered) weight, one FP8 GEMM; backward an amax and a cast of the
output gradient, two FP8 GEMMs and their layout copies. The forward's FP8 casts are kept
for the backward, as torchao's tensorwise path of the time does (Float8Linear casts input
and weight to Float8Tensors and calls manual_float8_matmul_with_args_in_float8, which
saves them; its axiswise path, manual_float8_matmul_with_args_in_hp, saves the
high-precision tensors and casts again in the backward).
The scale arithmetic on 0-d tensors is host bookkeeping to Flint (passes.lower_fx).
torchtitan converts every nn.Linear but the output projection (`output`, the LM head).
"""
from __future__ import annotations

import torch
from torch import nn

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
EPS = 1e-12         # torchao float8_utils.EPS


def to_float8(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(FP8 bits, inverse scale) of `x` under tensorwise dynamic scaling."""
    amax = torch.max(torch.abs(x))       # aten.max.default: torchtitan's SAC keeps it
    fmax = torch.finfo(dtype).max
    scale = (fmax / torch.clamp(amax.to(torch.float64), min=EPS)).to(torch.float32)
    # a 1-element (not 0-d) scale takes part in type promotion: the product is float32,
    # as torchao's hp_tensor.to(float32) * scale is, without a separate upcast kernel
    bits = (x * scale.reshape(1)).clamp(-fmax, fmax).to(dtype)
    return bits, scale.reciprocal()


def _scaled_mm(a, b, inv_a, inv_b, out_dtype):
    return torch._scaled_mm(a, b, scale_a=inv_a, scale_b=inv_b, out_dtype=out_dtype)


class _Float8Matmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2d, weight, x8=None, inv_x=None):
        if x8 is None:
            x8, inv_x = to_float8(x2d, E4M3)
        w8, inv_w = to_float8(weight, E4M3)
        ctx.save_for_backward(x8, inv_x, w8, inv_w)
        ctx.out_dtype = x2d.dtype
        return _scaled_mm(x8, w8.t(), inv_x, inv_w, x2d.dtype)     # w8.t(): column-major

    @staticmethod
    def backward(ctx, grad):
        x8, inv_x, w8, inv_w = ctx.saved_tensors
        g8, inv_g = to_float8(grad, E5M2)
        # grad_input = grad @ W: W's FP8 bits column-major
        grad_x = _scaled_mm(g8, w8.t().contiguous().t(), inv_g, inv_w, ctx.out_dtype)
        # grad_weight = grad^T @ x: grad^T row-major, x column-major
        grad_w = _scaled_mm(g8.t().contiguous(), x8.t().contiguous().t(), inv_g, inv_x,
                            ctx.out_dtype)
        return grad_x, grad_w, None, None


class Float8Linear(nn.Linear):
    """nn.Linear whose GEMMs run in FP8 with tensorwise dynamic scaling (no bias: the
    twin's linears have none, as Llama's). `shared_casts`, a dict the linears of one
    module hold in common, keeps the last input's FP8 cast for the next linear that reads
    the same tensor (Q, K and V; gate and up): torch.compile computes it once, because
    AOTAutograd merges identical ops on the same input (functorch config `cse`, on by
    default); eager PyTorch casts it in each linear (None)."""

    shared_casts: dict | None = None

    def forward(self, x):
        # the high-precision operands in the autocast dtype, as torchao casts input and
        # weight itself (_scaled_mm is on no autocast list); under Flint's trace every
        # autocast region is CPU autocast (flint.frontends.torch_autocast)
        dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") \
            else x.dtype
        with torch.autocast("cpu", enabled=False):
            x2d = x.to(dtype).reshape(-1, x.shape[-1])
            cast = ()
            if self.shared_casts is not None:
                key = _same_tensor_key(x)
                if self.shared_casts.get("input") != key:
                    with torch.no_grad():
                        # x held too: its storage cannot be freed and its address reused
                        self.shared_casts.update(input=key, held=x,
                                                 cast=to_float8(x2d.detach(), E4M3))
                cast = self.shared_casts["cast"]
            out = _Float8Matmul.apply(x2d, self.weight.to(dtype), *cast)
        return out.reshape(*x.shape[:-1], out.shape[-1])


def _same_tensor_key(x: torch.Tensor) -> tuple:
    """What makes two module inputs the same tensor when hooks rewrap it (a DTensor's
    local tensor; the aliases full backward hooks hand each module): its storage, offset,
    shape and strides."""
    t = getattr(x, "_local_tensor", x)
    return (t.untyped_storage()._cdata, t.storage_offset(), tuple(t.shape), t.stride())


def convert_linears(model: nn.Module, skip: tuple[str, ...] = ("lm_head",),
                    share_casts: bool = False) -> int:
    """Swap every bias-free nn.Linear of `model` but those named in `skip` for a
    Float8Linear holding the same parameters (`share_casts`: the linears of one module
    cast an input they all read once, as torch.compile runs them); returns how many were
    swapped."""
    swapped = 0
    for module in list(model.modules()):
        shared: dict = {}
        for child_name, child in list(module.named_children()):
            if type(child) is nn.Linear and child.bias is None and child_name not in skip:
                child.__class__ = Float8Linear     # same parameters and hooks
                if share_casts:
                    child.shared_casts = shared
                swapped += 1
    return swapped
