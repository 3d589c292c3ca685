"""Capture a PyTorch training step at any world size, with no GPU and no real memory.

The step (forward, loss, backward, optimizer update) is traced by `make_fx` into one aten
graph. Why make_fx and not torch.export / AOTAutograd: FSDP2's all-gathers and
reduce-scatters live in module hooks and autograd hooks, and the optimizer update is eager
Python; make_fx records what actually dispatches (including DTensor's functional
collectives and FSDP2's in-place c10d calls), where torch.export sees neither the backward
nor the optimizer.

How no memory is spent: the model is built on the meta device, parallelized there
(DTensor TP/SP, FSDP2 `fully_shard`) against a DeviceMesh of a fake process group of the
requested world size (`torch.testing._internal.distributed.fake_pg`, the backend PyTorch's
own tests use), then materialized as fake tensors (`to_empty` under FakeTensorMode) just
before tracing. Parallelism code therefore runs exactly as written, for rank 0.

Module paths and phases are recorded by `record_function` ranges: forward hooks on every
submodule, and `flint::backward` / `flint::optimizer` around those parts of the step.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.distributed as dist

from flint.cluster import Cluster, validate_mesh
from flint.errors import FlintError
from flint.frontends.torch_autocast import record_requests
from flint.frontends.torch_regions import (_compiled_regions_eager, _ModuleRegions, _phases,
                                           _quiet)
from flint.frontends.torch_sac import rematerialize_selective

record_requests()   # what each torch.autocast asked for (torch drops it without CUDA)


@dataclass
class TorchStep:
    """What to train. `model`: an nn.Module or a zero-argument factory (called on the meta
    device, so an 8B model costs nothing). `example_inputs`: ONE rank's inputs to
    `model(*example_inputs)` (real, meta or fake tensors; only shapes and dtypes matter).
    `loss_fn(output, *targets)` -> scalar (default: output.float().mean()).
    `optimizer`: "adamw" | "sgd" | None | a callable(params) -> torch.optim.Optimizer.
    `parallelize(model, mesh)`: your DTensor / FSDP2 code, given a DeviceMesh with the
    named dimensions of `mesh`; it may return a new module. `context(model)`: a context
    manager around forward, loss and backward (e.g. DTensor's `loss_parallel`)."""

    model: Any
    example_inputs: tuple
    targets: tuple = ()
    loss_fn: Callable | None = None
    optimizer: Any = "adamw"
    parallelize: Callable | None = None
    context: Callable | None = None
    step_fn: Callable | None = None
    on_materialize: Callable | None = None
    model_flops: float | None = None   # per step, whole cluster, for MFU (else from the graph)


@dataclass
class CapturedTorch:
    gm: torch.fx.GraphModule
    cluster: Cluster
    groups: dict                      # process-group name -> ranks of rank 0's group
    state: dict = field(default_factory=dict)   # per-rank bytes: flint.frontends.torch_state
    model_flops: float | None = None   # per step, whole cluster (MFU); else from the graph
    timings: dict = field(default_factory=dict)
    notes: dict = field(default_factory=dict)   # what the capture saw (_capture_notes)

    def as_text(self) -> str:
        return str(self.gm.graph)

    def workload(self, fuse: bool = True):
        from flint.passes.lower_fx import lower_fx

        t = time.perf_counter()
        graph = lower_fx(self.gm, self.cluster, self.groups, fuse=fuse)
        graph.meta.update(source="torch", torch_version=torch.__version__)
        if self.state:
            from flint.frontends.torch_state import record_state

            record_state(graph, self.state)
        from flint.frontends.model_flops import set_model_flops

        set_model_flops(graph, self.model_flops)
        graph.meta["capture"] = dict(self.notes)
        from flint.frontends.program_checks import record_and_warn
        from flint.frontends.training_facts import record_training

        record_and_warn(graph)
        record_training(graph)
        self.timings["graph_s"] = time.perf_counter() - t
        return graph


def fake_world(world_size: int) -> None:
    """A fake process group of `world_size` ranks, this process being rank 0."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        if dist.get_world_size() == world_size and dist.get_backend() == "fake":
            return
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)


def capture(step: TorchStep, world_size: int, mesh=None,
            hardware: str = "h100-sxm", devices_per_host: int = 8) -> CapturedTorch:
    """Trace `step` for rank 0 of `world_size` ranks (see the module docstring)."""
    from flint.frontends.torch_autocast import gpu_autocast, quiet_cuda_autocast_warning
    from flint.frontends.torch_ddp import DataParallelTracing

    mesh = tuple(mesh) if mesh else (("dp", world_size),)
    validate_mesh(mesh, world_size)
    notes: dict = {}
    with quiet_cuda_autocast_warning(), gpu_autocast(notes), DataParallelTracing() as ddp:
        gm, model, optimizer, example, timings = _trace(step, world_size, mesh, ddp)
        notes["ddp"] = ddp.report()
    cluster = Cluster(world_size, mesh, hardware, "gpu", min(devices_per_host, world_size))
    from flint.frontends.torch_state import state_bytes

    with example["fake"]:
        state = state_bytes(model, optimizer, example["inputs"] + example["targets"])
    captured = CapturedTorch(gm, cluster, _group_ranks(gm), timings=timings, state=state,
                             model_flops=step.model_flops)
    captured.notes = _capture_notes(notes, model, example["inputs"], example["backward_calls"])
    if example["sac_recomputed"]:
        captured.notes["sac_recomputed_ops"] = example["sac_recomputed"]
    return captured


def _trace(step: TorchStep, world_size: int, mesh, ddp):
    """(graph module, model, optimizer, example tensors, timings) of one steady-state
    training step, traced under fake tensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.device_mesh import init_device_mesh
    from torch.fx.experimental.proxy_tensor import make_fx

    timings = {}
    t = time.perf_counter()
    fake_world(world_size)
    device_mesh = init_device_mesh("cpu", tuple(s for _, s in mesh),
                                   mesh_dim_names=tuple(n for n, _ in mesh))
    model = _build(step.model)
    if step.parallelize is not None:
        try:
            model = step.parallelize(model, device_mesh) or model
        except FlintError:
            raise
        except Exception as e:
            raise FlintError(f"the parallelize function raised {type(e).__name__}: "
                             f"{_first_line(e)}") from None
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    ties = _shared_parameters(model)
    with fake:
        model.to_empty(device="cpu")
        _retie(model, ties)
        if step.on_materialize is not None:
            step.on_materialize(model, device_mesh)
        inputs = tuple(_fake(x, fake) for x in step.example_inputs)
        targets = tuple(_fake(x, fake) for x in step.targets)
        optimizer = _optimizer(step.optimizer, model)
    timings["build_s"] = time.perf_counter() - t

    tracker = _ModuleRegions(model)
    loss_fn = step.loss_fn or (lambda out, *_: out.float().mean())

    def train_step(*args):
        with (step.context(model) if step.context else contextlib.nullcontext()):
            if step.step_fn is not None:
                return step.step_fn(model, optimizer, *args)
            out = model(*args[: len(inputs)])
            loss = loss_fn(out, *args[len(inputs):])
            loss.backward()
        if optimizer is not None:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return loss

    backward_calls = [0]

    def after_backward():
        backward_calls[0] += 1
        ddp.finish_backward()

    t = time.perf_counter()
    try:
        # One untraced step first (with an optimizer), so the traced one is a steady-state
        # step: optimizer state exists (no zeros_like initialization) as in every step
        # after the first, and DDP's buckets are the ones it rebuilds after its first
        # iteration (without a warm-up: in reverse parameter order, as DDP starts).
        if optimizer is not None:
            ddp.warming_up = True
            with fake, tracker, _phases(optimizer, after_backward), _quiet(), \
                    _compiled_regions_eager():
                train_step(*inputs, *targets)
            ddp.warming_up = False
        backward_calls[0] = 0
        timings["warmup_s"] = time.perf_counter() - t
        t = time.perf_counter()
        with fake, tracker, _phases(optimizer, after_backward), _quiet(), \
                _compiled_regions_eager():
            gm = make_fx(train_step)(*inputs, *targets)
        # selective activation checkpointing: make_fx tags, the recompute is Flint's
        recomputed = rematerialize_selective(gm)
    except FlintError:
        raise
    except Exception as e:
        where = f" in module {tracker.failed_in!r}" if tracker.failed_in else ""
        raise FlintError(f"the training step failed to trace{where}: {type(e).__name__}: "
                         f"{_first_line(e)}") from None
    timings["trace_s"] = time.perf_counter() - t
    example = {"fake": fake, "inputs": inputs, "targets": targets,
               "backward_calls": backward_calls[0], "sac_recomputed": recomputed}
    return gm, model, optimizer, example, timings


def _shared_parameters(model) -> list[list[tuple]]:
    """Parameters held by several modules (tied embedding and LM head): each as its
    (module, attribute) holders. Materializing (`to_empty`) gives each holder its own
    tensor, which would count a tied weight twice in memory, gradients and optimizer."""
    holders: dict[int, list[tuple]] = {}
    for module in model.modules():
        for name, p in module._parameters.items():
            if p is not None:
                holders.setdefault(id(p), []).append((module, name))
    return [h for h in holders.values() if len(h) > 1]


def _retie(model, ties) -> None:
    for holders in ties:
        first_module, first_name = holders[0]
        shared = first_module._parameters[first_name]
        for module, name in holders[1:]:
            module._parameters[name] = shared


def _capture_notes(notes: dict, model, inputs, backward_calls: int = 1) -> dict:
    """Facts of the capture for the report and the checks: autocast regions entered,
    FSDP2 mixed precision, DDP buckets, the batch and sequence of one rank's inputs, and
    the micro-batches of the step (its backward calls: a step that accumulates gradients
    over k micro-batches of these inputs trains on k times their batch)."""
    out = {"autocast": sorted(f"{d}:{t.replace('torch.', '')}"
                              for d, t in notes.get("autocast", ()))}
    low = {torch.bfloat16, torch.float16}
    policies = set()
    for module in model.modules():
        state = getattr(module, "_get_fsdp_state", None)
        policy = None
        if state is not None:
            try:
                policy = state()._mp_policy
            except Exception:  # noqa: BLE001 - not an FSDP2 module after all
                policy = None
        if policy is not None and policy.param_dtype in low:
            policies.add(str(policy.param_dtype).replace("torch.", ""))
    out["fsdp_param_dtype"] = sorted(policies)
    out["low_precision_parameters"] = any(p.dtype in low for p in model.parameters())
    if notes.get("ddp"):
        out["ddp"] = notes["ddp"]
    tokens = next((x for x in inputs if isinstance(x, torch.Tensor) and x.dim() >= 1), None)
    out["micro_batches"] = max(backward_calls, 1)
    if tokens is not None:
        out["batch_per_rank"] = int(tokens.shape[0]) * out["micro_batches"]
        if tokens.dim() == 2 and not tokens.is_floating_point():
            out["seq_len"] = int(tokens.shape[1])     # token ids: [batch, sequence]
    return out


def _build(model):
    if isinstance(model, torch.nn.Module):
        return model.to(device="meta")
    if not callable(model):
        raise FlintError(f"model must be an nn.Module or a factory, not {type(model).__name__}")
    try:
        with torch.device("meta"):
            built = model()
    except Exception as e:
        raise FlintError(f"building the model raised {type(e).__name__}: {_first_line(e)}") from None
    if not isinstance(built, torch.nn.Module):
        raise FlintError(f"the model factory returned {type(built).__name__}, not an nn.Module")
    return built


def _fake(x, mode):
    if not isinstance(x, torch.Tensor):
        return x
    if x.device.type == "meta":
        return torch.empty(x.shape, dtype=x.dtype, device="cpu")   # fake under `mode`
    return mode.from_tensor(x)


def _optimizer(kind, model):
    params = [p for p in model.parameters() if p.requires_grad]
    if kind is None:
        return None
    # One kernel per parameter (foreach=False): the per-parameter update ops then appear
    # in the graph with their own sizes, as the non-fused optimizer runs them.
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1,
                                 foreach=False, fused=False)
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9, foreach=False)
    if callable(kind):
        return kind(params)
    raise FlintError(f"unknown optimizer {kind!r}: use adamw, sgd, None or a callable")


def _group_ranks(gm: torch.fx.GraphModule) -> dict:
    """For every process group the graph names -> ranks of rank 0's group. Functional
    collectives name a group by string; in-place c10d calls hold the ProcessGroup as a
    TorchScript object in a get_attr node (keyed here by that attribute's name)."""
    from torch._C._distributed_c10d import ProcessGroup
    from torch.distributed.distributed_c10d import _resolve_process_group

    out = {}
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            obj = getattr(gm, node.target, None)
            if isinstance(obj, torch.ScriptObject):
                try:
                    out[node.target] = dist.get_process_group_ranks(ProcessGroup.unbox(obj))
                except RuntimeError:
                    continue    # a ReduceOp or another TorchScript class
        elif node.op == "call_function" and "_c10d_functional" in str(node.target):
            for a in node.args:
                if isinstance(a, str) and a not in out:
                    try:
                        out[a] = dist.get_process_group_ranks(_resolve_process_group(a))
                    except (ValueError, RuntimeError, KeyError):
                        continue
    return out


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:300] if text else type(e).__name__
