"""What a `--framework torch` ExtractRequest traces: the torch twin of a zoo model (with the
request's dims, sequence, batch, remat and precision), or a user's SCRIPT.py:FUNCTION,
which either returns a flint.torch.TorchStep or is a step decorated with
`@flint.capture(parallelize=...)`, `fn(model, optimizer, *batch)`, whose arguments come
from the script's `example_args()` as for a JAX script."""
from __future__ import annotations

from flint.errors import FlintError


def torch_graph(request, stage):
    """(graph, timings) of a torch ExtractRequest."""
    from flint.cluster import parse_mesh
    from flint.frontends.steps import default_zoo_mesh, load_step

    devices, mesh, model = request.device_count, request.mesh, request.model
    hardware, per_host = request.target_hardware, request.devices_per_host or 8
    if request.target is None:
        import flint.torch as ft

        stage(f"tracing the torch twin of {model} for rank 0 of {devices} (fake tensors)")
        graph = ft.zoo(model, devices, parse_mesh(mesh or default_zoo_mesh(devices, model),
                                                  devices),
                       batch_per_replica=request.batch_per_replica, seq_len=request.seq_len,
                       layers=request.layers, hardware=hardware, fuse=request.fuse,
                       sequence_parallel=bool(request.sequence_parallel),
                       remat=request.remat or "none", dims=request.dims or None,
                       reshard_after_forward=request.reshard_after_forward,
                       attention="eager" if request.attention == "unfused" else "flash",
                       attention_dropout=request.attention_dropout,
                       gemm_precision=request.gemm_precision or "bf16")
        return graph, dict(graph.meta.pop("timings", {}))
    from flint.frontends.torch_autocast import quiet_cuda_autocast_warning

    with quiet_cuda_autocast_warning():   # a script's module-level autocast("cuda")
        import flint.frontends.torch_capture  # noqa: F401  (records autocast requests)

        module, fn_name, fn = load_step(request.target)
    from flint.frontends.jax import Captured

    if isinstance(fn, Captured):
        return _decorated(request, module, fn_name, fn, stage)
    try:
        step = fn()
    except FlintError:
        raise
    except Exception as e:
        raise FlintError(f"{fn_name}() failed: {type(e).__name__}: {e}") from None
    import flint.torch as ft

    if isinstance(step, dict):
        step = ft.TorchStep(**step)
    if not isinstance(step, ft.TorchStep):
        raise FlintError(f"{fn_name}() must return a flint.torch.TorchStep (or a dict of its "
                         f"fields), or be a step decorated with flint.capture, not "
                         f"{type(step).__name__}")
    stage(f"tracing {fn_name} for rank 0 of {devices} (fake tensors)")
    from flint.frontends.torch_capture import capture

    captured = capture(step, devices, parse_mesh(mesh, devices), hardware, per_host)
    graph = captured.workload(fuse=request.fuse)
    graph.meta["model"] = fn_name
    return graph, captured.timings


def _decorated(request, module, fn_name, fn, stage):
    """A `@flint.capture(parallelize=...)` step `fn(model, optimizer, *batch)`: its
    arguments from the script's example_args(), its cluster from the decorator unless
    the request gives one."""
    from flint.cluster import parse_mesh
    from flint.frontends.jax import _is_torch_call
    from flint.frontends.steps import example_args, rescaled_mesh
    from flint.frontends.torch_capture import TorchStep, capture

    devices = request.devices or fn.cfg.devices
    hardware = request.hardware or fn.cfg.hardware
    mesh = parse_mesh(request.mesh, devices) if request.mesh else tuple(
        rescaled_mesh(fn.cfg.mesh, devices).items())
    args = example_args(module, request.args_fn, request.target, mesh, torch=True)
    if not _is_torch_call(args):
        raise FlintError(f"{request.args_fn}() of {request.target.split(':')[0]} must return "
                         f"the arguments of {fn_name}(model, optimizer, *batch): a model "
                         f"(an nn.Module, its class or a factory), an optimizer (\"adamw\", "
                         f"\"sgd\", None or a factory) and the batch")
    step = TorchStep(args[0], tuple(args[2:]), optimizer=args[1],
                     parallelize=fn.cfg.parallelize, step_fn=fn.fn,
                     model_flops=fn.cfg.model_flops or getattr(module, "model_flops", None))
    stage(f"tracing {fn_name} for rank 0 of {devices} (fake tensors)")
    captured = capture(step, devices, mesh, hardware, request.devices_per_host or
                       fn.cfg.devices_per_host)
    graph = captured.workload(fuse=request.fuse)
    graph.meta["model"] = fn_name
    return graph, captured.timings
