"""DistributedDataParallel (and `torch.distributed._composable.replicate`) as the GPU runs it,
in a graph traced on fake tensors.

DDP's gradient reduction lives in its C++ Reducer: autograd hooks copy each gradient,
divided by the world size, into a flat bucket, and a bucket whose gradients are all ready
is all-reduced while the backward goes on; after the backward the reduced buckets are
copied back into the gradients. make_fx sees none of that (the Reducer's hooks act on the
parameters as they were at construction, on the meta device), and its constructor's
parameter broadcast calls `.item()`, which fake tensors cannot answer.

While Flint traces, so, DDP is built without its initial sync (nothing to broadcast: no
values exist) and without device ids (the module is on the meta device, not a GPU), and
its Reducer is bypassed; Flint's own hooks do the Reducer's work with the same ops, which
are traced: per gradient a scaled copy into its bucket view (`mul.out`), per bucket one
in-place all-reduce on DDP's process group, issued in bucket order as soon as the
bucket's last gradient exists (so it overlaps the rest of the backward), and the copies
back after the backward (none with `gradient_as_bucket_view`). `no_sync()` skips the
reduction as DDP does (gradient accumulation); buffers are broadcast each forward when
DDP would (`broadcast_buffers` / `forward_sync_buffers`).

Buckets are those of DDP's steady state (torch 2.13, torch/nn/parallel/distributed.py
`_BucketCapacityConfig` and the Reducer's `rebuild_buckets` in
torch/csrc/distributed/c10d/reducer.cpp): after the first iteration DDP rebuilds its
buckets in the order the gradients became ready, with a first bucket of
`dist._DEFAULT_FIRST_BUCKET_BYTES` (1 MiB) and then `bucket_cap_mb` (default 25 MiB) each,
grouped by dtype, through `dist._compute_bucket_assignment_by_size` (the Reducer's own
function). Flint's warm-up step records that order. With `find_unused_parameters=True`
(and no static graph) DDP never rebuilds: its initial buckets (parameters in reverse
order) stay.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from flint.errors import FlintError


class _Reduction:
    """What the Reducer does for one DDP instance, as traceable ops."""

    def __init__(self, ddp: DistributedDataParallel):
        self.ddp = ddp
        self.params = _reducer_params(ddp)
        self.index = {id(p): i for i, p in enumerate(self.params)}
        self.ready_order: list[int] = []
        self.buckets: list[list[int]] | None = None
        self.armed = False
        self.pending: dict[int, set] = {}
        self.flat: dict[int, torch.Tensor] = {}
        self.views: dict[int, torch.Tensor] = {}
        self.launched = 0
        self.handles = [p.register_post_accumulate_grad_hook(self._ready)
                        for p in self.params]

    # --- buckets --------------------------------------------------------------------
    def steady_buckets(self) -> list[list[int]]:
        """DDP's buckets after its first iteration (see the module docstring)."""
        ddp = self.ddp
        config = ddp._bucket_config
        expect_sparse = [False] * len(self.params)
        rebuilds = getattr(ddp, "static_graph", False) or not ddp.find_unused_parameters
        if config.has_custom_per_bucket_caps:
            limits = list(config.per_bucket_bytes_caps)
        elif config.first_bucket_bytes_cap < config.bucket_bytes_cap:
            limits = [config.first_bucket_bytes_cap, config.bucket_bytes_cap]
        else:
            limits = [config.bucket_bytes_cap]
        if rebuilds:
            order = self.ready_order if len(self.ready_order) == len(self.params) else \
                list(range(len(self.params) - 1, -1, -1))
            if not config.has_custom_per_bucket_caps:
                limits = [config.first_bucket_bytes_cap, config.bucket_bytes_cap]
            buckets, _ = dist._compute_bucket_assignment_by_size(
                [self.params[i] for i in order], limits, expect_sparse, order)
            return [list(b) for b in buckets]
        buckets, _ = dist._compute_bucket_assignment_by_size(self.params, limits,
                                                             expect_sparse)
        return [list(b) for b in reversed(buckets)]

    def bucket_sizes(self) -> list[int]:
        """Bytes of each bucket, in launch order."""
        return [sum(self.params[i].numel() * self.params[i].element_size() for i in b)
                for b in self.buckets or []]

    # --- one iteration -----------------------------------------------------------------
    def arm(self, warming_up: bool) -> None:
        """At forward: this backward reduces (unless no_sync() is on). The warm-up step
        only learns the order in which gradients become ready."""
        if self.buckets is None and not warming_up:
            self.buckets = self.steady_buckets()
        self.armed = torch.is_grad_enabled() and self.ddp.require_backward_grad_sync
        if self.buckets is not None:
            self.pending = {b: set(bucket) for b, bucket in enumerate(self.buckets)}
        self.launched = 0
        self.flat, self.views = {}, {}

    def _ready(self, param) -> None:
        i = self.index.get(id(param))
        if i is None:
            return
        if self.buckets is None:            # the warm-up step: learn the ready order
            if i not in self.ready_order:
                self.ready_order.append(i)
            return
        if not self.armed:
            return
        bucket = next(b for b, members in enumerate(self.buckets) if i in members)
        if bucket not in self.flat:
            self._allocate(bucket)
        self._scaled_copy(i)
        self.pending[bucket].discard(i)
        while self.launched < len(self.buckets) and not self.pending[self.launched]:
            self._launch(self.launched)      # buckets go out in order, as DDP's do
            self.launched += 1

    def _allocate(self, bucket: int) -> None:
        members = self.buckets[bucket]
        first = self.params[members[0]]
        total = sum(self.params[i].numel() for i in members)
        flat = torch.empty(total, dtype=first.dtype, device=first.device)
        self.flat[bucket] = flat
        offset = 0
        for i in members:
            n = self.params[i].numel()
            self.views[i] = flat[offset:offset + n].view_as(self.params[i])
            offset += n

    def _scaled_copy(self, i: int) -> None:
        # the Reducer divides while copying into the bucket view (one pass over the grad)
        grad = self.params[i].grad
        torch.mul(grad, 1.0 / self.ddp.process_group.size(), out=self.views[i])

    def _launch(self, bucket: int) -> None:
        dist.all_reduce(self.flat[bucket], group=self.ddp.process_group, async_op=True)

    def finish(self) -> None:
        """After the backward: the reduced buckets back into the gradients."""
        if not self.armed or self.buckets is None:
            return
        if self.launched < len(self.buckets):
            for b in range(self.launched, len(self.buckets)):   # unused parameters
                if b not in self.flat:
                    self._allocate(b)
                self._launch(b)
            self.launched = len(self.buckets)
        for i, view in self.views.items():
            p = self.params[i]
            if self.ddp.gradient_as_bucket_view or p.grad is None:
                p.grad = view
            else:
                p.grad.copy_(view)
        self.armed = False

    def sync_buffers(self) -> None:
        """DDP broadcasts the module's buffers from rank 0 before each forward, coalesced
        into chunks of its broadcast_bucket_size (250 MiB)."""
        buffers = [b for b in self.ddp.module.buffers() if b.numel()]
        cap = self.ddp.broadcast_bucket_size
        chunk: list[torch.Tensor] = []
        for b in buffers + [None]:
            full = b is None or (chunk and sum(t.numel() * t.element_size() for t in chunk)
                                 + b.numel() * b.element_size() > cap)
            if full and chunk:
                flat = torch.cat([t.reshape(-1).to(chunk[0].dtype) for t in chunk]) \
                    if len(chunk) > 1 else chunk[0]
                dist.broadcast(flat, src=dist.get_global_rank(self.ddp.process_group, 0),
                               group=self.ddp.process_group)
                chunk = []
            if b is not None:
                chunk.append(b)


def _reducer_params(ddp: DistributedDataParallel) -> list:
    """The parameters DDP's Reducer holds, in its order (DDP's _build_params_for_reducer:
    per module, trainable, not ignored, shared parameters once)."""
    seen, out = set(), []
    for module_name, module in ddp.module.named_modules():
        for name, p in module.named_parameters(recurse=False):
            full = f"{module_name}.{name}" if module_name else name
            if p.requires_grad and full not in ddp.parameters_to_ignore and id(p) not in seen:
                seen.add(id(p))
                out.append(p)
    return out


class DataParallelTracing:
    """Context for one capture: DDP constructed traceably, its reduction done by Flint's
    hooks. `reductions` lists each DDP instance's _Reduction (for the report)."""

    def __init__(self):
        self.reductions: list[_Reduction] = []
        self._saved: dict = {}
        self.warming_up = False      # set by the capture around its untraced warm-up step

    def __enter__(self):
        cls = DistributedDataParallel
        self._saved = {k: getattr(cls, k) for k in ("__init__", "_pre_forward",
                                                      "_post_forward")}
        init, pre, post = (self._saved[k] for k in ("__init__", "_pre_forward",
                                                      "_post_forward"))
        tracing = self

        def __init__(ddp, module, *args, **kwargs):
            kwargs.update(init_sync=False, device_ids=None, output_device=None)
            if args:       # device_ids, output_device given by position
                args = (None, None) + tuple(args[2:])
                kwargs.pop("device_ids")
                kwargs.pop("output_device")
            try:
                init(ddp, module, *args, **kwargs)
            except FlintError:
                raise
            except Exception as e:
                raise FlintError(f"DistributedDataParallel(...) raised {type(e).__name__}: "
                                 f"{str(e).splitlines()[0] if str(e) else ''}") from None
            if ddp.mixed_precision is not None:
                raise FlintError("DistributedDataParallel(mixed_precision=...) is not "
                                 "modelled; cast with torch.autocast or FSDP2's "
                                 "MixedPrecisionPolicy")

        def _pre_forward(ddp, *inputs, **kwargs):
            reduction = tracing._reduction(ddp)
            if ddp._comm_hooks:
                raise FlintError("DDP communication hooks are not modelled (Flint traces "
                                 "DDP's default all-reduce); remove register_comm_hook")
            reduction.arm(tracing.warming_up)
            if ddp.require_forward_param_sync and ddp.forward_sync_buffers \
                    and torch.is_grad_enabled():
                reduction.sync_buffers()
            flags = ddp.require_backward_grad_sync, ddp.require_forward_param_sync
            ddp.require_backward_grad_sync = ddp.require_forward_param_sync = False
            try:
                return pre(ddp, *inputs, **kwargs)
            finally:
                ddp.require_backward_grad_sync, ddp.require_forward_param_sync = flags

        def _post_forward(ddp, output):
            flags = ddp.require_backward_grad_sync, ddp.require_forward_param_sync
            ddp.require_backward_grad_sync = ddp.require_forward_param_sync = False
            try:
                return post(ddp, output)
            finally:
                ddp.require_backward_grad_sync, ddp.require_forward_param_sync = flags

        cls.__init__, cls._pre_forward, cls._post_forward = (__init__, _pre_forward,
                                                              _post_forward)
        return self

    def __exit__(self, *exc):
        for name, fn in self._saved.items():
            setattr(DistributedDataParallel, name, fn)
        for r in self.reductions:
            for h in r.handles:
                h.remove()

    def _reduction(self, ddp) -> _Reduction:
        r = getattr(ddp, "_flint_reduction", None)
        if r is None:
            r = _Reduction(ddp)
            ddp._flint_reduction = r
            self.reductions.append(r)
        return r

    def finish_backward(self) -> None:
        for r in self.reductions:
            r.finish()

    def report(self) -> list[dict]:
        """Per DDP instance: its buckets (bytes, parameter count) in launch order."""
        return [{"buckets_bytes": r.bucket_sizes(),
                 "bucket_cap_bytes": r.ddp._bucket_config.bucket_bytes_cap,
                 "first_bucket_cap_bytes": r.ddp._bucket_config.first_bucket_bytes_cap,
                 "parameters": len(r.params), "group_size": r.ddp.process_group.size()}
                for r in self.reductions]
