"""What the torch capture wraps around a traced step: `flint::` record_function ranges
that make_fx keeps (module paths, the backward and optimizer phases), torch.compile'd
regions run eagerly, and PyTorch's warnings kept out of Flint's report."""
from __future__ import annotations

import contextlib
import warnings

import torch

REGION = "flint::"


class _region:
    """A record_function range that make_fx keeps as enter/exit nodes."""

    def __init__(self, name: str):
        self.name = REGION + name

    def __enter__(self):
        self.handle = torch.ops.profiler._record_function_enter_new(self.name, None)

    def __exit__(self, *exc):
        torch.ops.profiler._record_function_exit._RecordFunction(self.handle)


@contextlib.contextmanager
def _compiled_regions_eager():
    """torch.compile'd code inside the step (torchtitan's flex-attention masks, a user's
    compiled block) runs as eager aten ops while Flint traces: Dynamo compiling under
    FakeTensorMode inside make_fx crashes the process (a segfault with torch 2.13), and the
    eager ops are what Flint costs anyway (passes/fuse.py fuses pointwise chains as
    Inductor would). `force_eager` is torch.compiler's own switch for exactly this."""
    import torch._dynamo

    import torch.nn.attention.flex_attention as flex

    torch._dynamo.reset()   # nothing compiled before the capture is reused inside it
    validate_device = flex._validate_device
    flex._validate_device = _flex_device_check
    # make_fx counts as FX tracing, where Dynamo would refuse the compiled function
    # instead of running it as written
    try:
        with torch.compiler.set_stance("force_eager"), \
                torch._dynamo.config.patch(error_on_nested_fx_trace=False):
            yield
    finally:
        flex._validate_device = validate_device


def _flex_device_check(query, key, value) -> None:
    """Flex attention refuses gradients on CPU (no CPU backward kernel); Flint's CPU
    tensors are fake and stand for the GPU's, where it has one, so only the device kind
    is checked."""
    if query.device.type not in ("cpu", "cuda", "xpu", "hpu", "mps"):
        raise ValueError(f"FlexAttention does not run on {query.device.type}")


@contextlib.contextmanager
def _quiet():
    """PyTorch warns about hooks and views that matter only for real training; around
    Flint's report they are noise."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@contextlib.contextmanager
def _phases(optimizer, after_backward=None):
    """`flint::backward` around every autograd backward call and `flint::optimizer` around
    optimizer steps, whoever makes them (Flint's step or the user's); `after_backward()`
    runs at the end of each backward, inside its range (DDP's finalization)."""
    original = torch.autograd.backward
    hooks = []

    def backward(*a, **k):
        with _region("backward"):
            out = original(*a, **k)
            if after_backward is not None:
                after_backward()
            return out

    torch.autograd.backward = backward
    if optimizer is not None:
        box = {}
        hooks.append(optimizer.register_step_pre_hook(
            lambda *_: box.__setitem__("r", _region("optimizer")) or box["r"].__enter__()))
        hooks.append(optimizer.register_step_post_hook(
            lambda *_: box.pop("r").__exit__(None, None, None)))
    try:
        yield
    finally:
        torch.autograd.backward = original
        for h in hooks:
            h.remove()


class _ModuleRegions:
    """Forward (and full backward) hooks that open a `flint::module::<path>` range per
    submodule call (and per gradient computation through it), and remember which module
    was running when tracing failed."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.stack: list[tuple[str, object]] = []
        self.backward: list[tuple[str, object]] = []
        self.handles = []
        self.failed_in = ""

    @property
    def current(self) -> str:
        return self.stack[-1][0] if self.stack else ""

    def __enter__(self):
        for name, mod in self.model.named_modules():
            name = name or type(mod).__name__          # the root, by its class
            self.handles.append(mod.register_forward_pre_hook(self._opener(self.stack, name)))
            self.handles.append(mod.register_forward_hook(self._closer(self.stack, name)))
            self.handles.append(mod.register_full_backward_pre_hook(
                self._opener(self.backward, name)))
            self.handles.append(mod.register_full_backward_hook(
                self._closer(self.backward, name)))
        return self

    def __exit__(self, *exc):
        self.failed_in = self.current if exc[0] is not None else ""
        for h in self.handles:
            h.remove()
        self.stack.clear()

    @staticmethod
    def _opener(stack: list, name: str):
        def hook(*_):
            region = _region("module::" + name)
            region.__enter__()
            stack.append((name, region))
        return hook

    @staticmethod
    def _closer(stack: list, name: str):
        def hook(*_):
            if stack and stack[-1][0] == name:
                stack.pop()[1].__exit__(None, None, None)
        return hook
