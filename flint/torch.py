"""PyTorch front end: the same workload graph JAX users get, from your model and your
parallelism code, with no GPUs and no real memory.

    import flint.torch as ft
    graph = ft.extract(model_factory, (tokens,), targets=(targets,), loss_fn=F.cross_entropy,
                       optimizer="adamw", world_size=4096, mesh={"fsdp": 512, "tp": 8},
                       parallelize=my_parallelize_fn)     # DTensor TP/SP, FSDP2
    captured = ft.capture(...)          # staged: .as_text() (aten graph), .workload()
    graph = ft.zoo("llama3-8b", world_size=4096)      # torch twins of Flint's JAX zoo

`model` is an nn.Module or, better for big models, a zero-argument factory (it is called
on the meta device). Example inputs are ONE rank's batch; meta tensors are fine.
"""
from __future__ import annotations

from flint.frontends.torch_capture import CapturedTorch, TorchStep
from flint.frontends.torch_capture import capture as _capture
from flint.frontends.torchtitan import torchtitan_parallelize  # noqa: F401


def _mesh(mesh, world_size):
    from flint.cluster import parse_mesh

    if isinstance(mesh, (tuple, list)):
        return tuple((str(n), int(s)) for n, s in mesh)
    return parse_mesh(mesh, world_size)


def capture(model, example_inputs, *, world_size: int, targets=(), loss_fn=None,
            optimizer="adamw", parallelize=None, mesh=None, context=None, step_fn=None,
            hardware: str = "h100-sxm") -> CapturedTorch:
    step = TorchStep(model, tuple(example_inputs), tuple(targets), loss_fn, optimizer,
                     parallelize, context, step_fn)
    return _capture(step, world_size, _mesh(mesh, world_size), hardware)


def extract(model, example_inputs, *, world_size: int, fuse: bool = True, **kw):
    """Trace the training step for rank 0 of `world_size` ranks -> WorkloadGraph."""
    return capture(model, example_inputs, world_size=world_size, **kw).workload(fuse=fuse)


def zoo(name: str, world_size: int, mesh=None, *, batch_per_replica: int = 1,
        seq_len: int | None = None, layers: int | None = None, hardware: str = "h100-sxm",
        fuse: bool = True, sequence_parallel: bool = False, remat: str = "none",
        dims: dict | None = None, reshard_after_forward: bool = True,
        attention: str = "flash", attention_dropout: float = 0.0,
        gemm_precision: str = "bf16"):
    """The torch twin of a zoo model (same shapes as the JAX one) -> WorkloadGraph with
    meta["model_flops_per_device"] for MFU. `remat`: none | full | dots | selective
    (flint.models.REMAT_POLICIES); `dims`: model dims by user key (layers, hidden, ...);
    `attention`: flash (SDPA's fused kernel) | eager (unfused, one aten op per step of the
    score path, with `attention_dropout` on the probabilities); `gemm_precision`: bf16 |
    fp8 (the blocks' linears as torchao's Float8Linear, tensorwise dynamic scaling)."""
    from flint.frontends.program_checks import warn_config_sequence
    from flint.models.decoder import model_flops
    from flint.models.torch_decoder import zoo_step
    from flint.models.torch_parallel import TP_AXES

    warn_config_sequence(name, seq_len, dims)
    step, cfg = zoo_step(name, batch_per_replica, seq_len, layers,
                         sequence_parallel=sequence_parallel, remat=remat, dims=dims,
                         reshard_after_forward=reshard_after_forward,
                         attention=attention, attention_dropout=attention_dropout,
                         gemm_precision=gemm_precision, compiled=fuse)
    mesh_t = _mesh(mesh, world_size)
    captured = _capture(step, world_size, mesh_t, hardware)
    graph = captured.workload(fuse=fuse)
    dp = 1
    for axis, size in mesh_t:
        if axis not in TP_AXES:
            dp *= size
    graph.meta.update(model=f"{name} (torch)",
                      model_flops_source="model config (PaLM appendix B)",
                      model_flops_per_device=model_flops(
        cfg, batch_per_replica * dp * cfg.seq_len) / world_size, timings=captured.timings,
                      training={"seq_len": cfg.seq_len, "global_batch": batch_per_replica * dp,
                                "batch_per_replica": batch_per_replica, "remat": remat,
                                "gemm_precision": gemm_precision, "layers": cfg.n_layers})
    return graph


__all__ = ["TorchStep", "CapturedTorch", "capture", "extract", "zoo"]
