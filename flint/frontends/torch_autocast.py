"""Autocast as the GPU runs it, on Flint's CPU fake tensors.

Flint traces a step on fake CPU tensors, where `torch.autocast("cuda", dtype=torch.bfloat16)`
does nothing: torch disables it when CUDA is absent (with a warning), and CUDA's autocast
dispatch key only acts on CUDA tensors. Every GEMM would then be traced in float32 and the
step priced at float32 (TF32) rates. CPU autocast, the one that acts on CPU tensors, casts a
different list of ops than CUDA's (float32 softmax, norms and reductions on the GPU;
bfloat16 ones on the CPU).

While Flint traces, so, an autocast region of any device type turns on CPU autocast with
the region's dtype, and CPU autocast follows CUDA's cast policy: the op lists of
ATen/autocast_mode.h (torch 2.13, `AT_FORALL_LOWER_PRECISION_FP`, `AT_FORALL_FP32`,
`AT_FORALL_FP32_SET_OPT_DTYPE`, `AT_FORALL_PROMOTE`: the CUDA registrations of
aten/src/ATen/autocast_mode.cpp) are registered as Python kernels on the AutocastCPU key
for the duration of the trace. `torch.autocast("cpu")` and `torch.autocast("cuda")` thus
trace the same program: the one the GPU runs.
"""
from __future__ import annotations

import contextlib

import torch

# CUDA's autocast policy, per op overload (ATen/autocast_mode.h of torch 2.13).
LOWER_PRECISION = (
    "_convolution.deprecated", "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc",
    "conv_transpose1d", "conv_transpose2d.input", "conv_transpose3d.input", "convolution",
    "prelu", "addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv", "linalg_vecdot",
    "linear", "addbmm", "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot",
    "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "lstm_cell", "gru_cell",
    "rnn_tanh_cell", "rnn_relu_cell", "_scaled_dot_product_flash_attention",
    "scaled_dot_product_attention")
FP32 = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p",
    "reciprocal", "rsqrt", "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor",
    "pow.Scalar", "softplus", "layer_norm", "native_layer_norm", "rms_norm", "group_norm",
    "frobenius_norm.dim", "nuclear_norm", "nuclear_norm.dim", "cosine_similarity",
    "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d",
    "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss",
    "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss",
    "triplet_margin_loss", "multi_margin_loss", "binary_cross_entropy_with_logits", "dist",
    "pdist", "cdist", "renorm", "logsumexp")
FP32_SET_OPT_DTYPE = (
    "prod", "prod.dim_int", "softmax.int", "log_softmax.int", "cumprod", "cumsum",
    "linalg_vector_norm", "linalg_matrix_norm", "linalg_matrix_norm.str_ord", "sum",
    "sum.dim_IntList")
PROMOTE = ("addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler",
           "index_put", "tensordot", "scatter_add")
# On CPU's list, not CUDA's: cross entropy runs as CUDA's log_softmax (float32 output from
# bfloat16 input, no separate cast of the logits) and nll_loss.
CPU_ONLY = ("cross_entropy_loss",)

_AUTOCAST = torch._C.DispatchKey.AutocastCPU
_LOW = (torch.float16, torch.bfloat16)


class _Policy:
    """Python kernels on AutocastCPU implementing one CUDA cast policy."""

    def __init__(self):
        self.lib = torch.library.Library("aten", "IMPL")

    def register(self) -> None:
        for name in LOWER_PRECISION:
            self._impl(name, self._lower)
        for name in FP32:
            self._impl(name, self._fp32)
        for name in FP32_SET_OPT_DTYPE:
            self._impl(name, self._fp32_opt_dtype)
        for name in PROMOTE:
            self._impl(name, self._promote)
        for name in CPU_ONLY:
            if _overload(name) is not None:
                self.lib.impl(name, torch.library.fallthrough_kernel, "AutocastCPU")

    def close(self) -> None:
        self.lib._destroy()

    def _impl(self, name: str, policy) -> None:
        op = _overload(name)
        if op is None:
            return

        def kernel(*args, **kwargs):
            return policy(op, args, kwargs)

        self.lib.impl(name, kernel, "AutocastCPU")

    @staticmethod
    def _call(op, args, kwargs):
        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(_AUTOCAST)):
            return op(*args, **kwargs)

    def _lower(self, op, args, kwargs):
        dtype = torch.get_autocast_dtype("cpu")
        return self._call(op, *_cast(args, kwargs, lambda t: t._autocast_to_reduced_precision(
            False, True, dtype, dtype)))

    def _fp32(self, op, args, kwargs):
        return self._call(op, *_cast(args, kwargs, _to_fp32))

    def _fp32_opt_dtype(self, op, args, kwargs):
        # a floating first argument: the kernel accumulates and writes float32 (reading
        # the low-precision input as it is)
        names = [a.name for a in op._schema.arguments]
        first = args[0] if args else None
        if isinstance(first, torch.Tensor) and first.is_floating_point() and "dtype" in names:
            at = names.index("dtype")
            if at < len(args):
                if args[at] is None:
                    args = args[:at] + (torch.float32,) + args[at + 1:]
            elif kwargs.get("dtype") is None:
                kwargs = {**kwargs, "dtype": torch.float32}
        return self._call(op, args, kwargs)

    def _promote(self, op, args, kwargs):
        floats = [a.dtype for a in _tensors(args, kwargs) if a.is_floating_point()]
        if len(set(floats)) < 2:
            return self._call(op, args, kwargs)
        widest = torch.float32 if torch.float32 in floats else floats[0]
        return self._call(op, *_cast(args, kwargs, lambda t: t.to(widest)
                                     if t.is_floating_point() else t))


def _overload(name: str):
    base, _, overload = name.partition(".")
    packet = getattr(torch.ops.aten, base, None)
    if packet is None:
        return None
    return getattr(packet, overload or "default", None)


def _tensors(args, kwargs) -> list:
    out = []
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            out.extend(x for x in a if isinstance(x, torch.Tensor))
    return out


def _cast(args, kwargs, fn):
    def one(a):
        if isinstance(a, torch.Tensor) and a.is_floating_point() and a.dtype != torch.float64:
            return fn(a)
        if isinstance(a, (list, tuple)):
            return type(a)(one(x) for x in a)
        return a
    return tuple(one(a) for a in args), {k: one(v) for k, v in kwargs.items()}


def _to_fp32(t):
    return t._autocast_to_full_precision(False, True) if t.dtype in _LOW else t


# --- autocast regions of any device type -----------------------------------------------

_requested: dict = {}


def record_requests() -> None:
    """Remember what each torch.autocast asked for: torch turns a CUDA autocast off at
    construction when CUDA is absent, so `enabled` is lost by the time it is entered.
    Installed once (flint.torch imports it); it changes nothing else."""
    cls = torch.amp.autocast_mode.autocast
    if getattr(cls.__init__, "_flint_records", False):
        return
    original = cls.__init__

    def __init__(self, device_type, dtype=None, enabled=True, cache_enabled=None):
        import warnings

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            original(self, device_type, dtype=dtype, enabled=enabled,
                     cache_enabled=cache_enabled)
        for w in caught:             # torch's own warnings, at the caller's line as before
            warnings.warn(w.message, w.category, stacklevel=2)
        self._flint_enabled = bool(enabled)

    __init__._flint_records = True
    cls.__init__ = __init__


@contextlib.contextmanager
def gpu_autocast(notes: dict | None = None):
    """While Flint traces: autocast regions of every device type act on the CPU fake
    tensors with CUDA's cast policy. `notes["autocast"]` collects the (device type, dtype)
    of the regions entered (what the user asked for, for the precision check)."""
    cls = torch.amp.autocast_mode.autocast
    enter, exit_ = cls.__enter__, cls.__exit__
    policy = _Policy()

    def __enter__(self):
        if torch._jit_internal.is_scripting():
            return enter(self)
        enabled = getattr(self, "_flint_enabled", True) if self.device != "cpu" \
            else self._enabled
        self._flint_prev = (torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"),
                            torch.is_autocast_cache_enabled())
        if enabled and notes is not None:
            notes.setdefault("autocast", set()).add((self.device, str(self.fast_dtype)))
        torch.set_autocast_enabled("cpu", enabled)
        if self.fast_dtype in _LOW:
            torch.set_autocast_dtype("cpu", self.fast_dtype)
        torch.autocast_increment_nesting()
        torch.set_autocast_cache_enabled(getattr(self, "_cache_enabled", True))
        return self

    def __exit__(self, *exc):
        if torch._jit_internal.is_scripting() or not hasattr(self, "_flint_prev"):
            return exit_(self, *exc)
        if torch.autocast_decrement_nesting() == 0:
            torch.clear_autocast_cache()
        enabled, dtype, cache = self._flint_prev
        torch.set_autocast_enabled("cpu", enabled)
        torch.set_autocast_dtype("cpu", dtype)
        torch.set_autocast_cache_enabled(cache)
        return False

    import warnings

    with warnings.catch_warnings():   # "Overriding a previously registered kernel"
        warnings.simplefilter("ignore")
        policy.register()
    cls.__enter__, cls.__exit__ = __enter__, __exit__
    try:
        yield
    finally:
        cls.__enter__, cls.__exit__ = enter, exit_
        policy.close()


@contextlib.contextmanager
def quiet_cuda_autocast_warning():
    """While Flint loads or traces a step: torch's "CUDA is not available ... Disabling
    autocast" is not true of the trace (gpu_autocast turns the region on), so it is not
    shown."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="CUDA is not available or torch_xla",
                                category=UserWarning)
        warnings.filterwarnings("ignore", message="User provided device_type of 'cuda'")
        yield
