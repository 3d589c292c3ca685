"""The training-step parts of scripts/capture_gpu.py (jax_step, torch_step): the two
example steps run on the GPU, timed, their peak memory read, and profiled (XLA's dump and a
jax.profiler trace; a Kineto trace). Run through capture_gpu.py, which owns the helpers.
"""
from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

from capture_gpu import ROOT, _device, _export, _tar, _write


def jax_llama_inputs(model):
    """(state, batch) of examples/gpu_llama_jax.py on one device: parameters drawn at
    0.02 scale, zero AdamW moments, random token ids."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
    state_shape, batch_shape = model.example_args(mesh)
    keys = iter(jax.random.split(jax.random.key(0), 64))

    def real(s):
        if s.dtype == jnp.int32 and s.shape:
            return jax.random.randint(next(keys), s.shape, 0, model.VOCAB, jnp.int32)
        if not s.shape:
            return jnp.zeros(s.shape, s.dtype)
        return 0.02 * jax.random.normal(next(keys), s.shape, s.dtype)

    state = jax.tree.map(real, state_shape)
    state["m"] = jax.tree.map(jnp.zeros_like, state["params"])
    state["v"] = jax.tree.map(jnp.zeros_like, state["params"])
    return state, jax.tree.map(real, batch_shape)


def part_jax_step(out: Path, small: bool) -> None:
    dump = out / "jax_dump"
    os.environ["XLA_FLAGS"] = (f"--xla_dump_to={dump} --xla_dump_hlo_as_text "
                               "--xla_dump_hlo_as_proto --xla_dump_hlo_module_re=.*train_step.*")
    os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    import jax

    sys.path.insert(0, str(ROOT / "examples"))
    import gpu_llama_jax as model

    if small:
        model.VOCAB, model.D, model.HEADS, model.KV_HEADS = 512, 128, 4, 2
        model.FFN, model.LAYERS, model.SEQ, model.SEQS_PER_REPLICA = 256, 2, 128, 2
        model.HEAD_DIM = model.D // model.HEADS
    state, batch = jax_llama_inputs(model)
    t = time.time()
    if small:   # the host CPU has no cuDNN: the same program with XLA's attention
        model.ATTENTION = None
    step = model.train_step
    try:
        state, loss = step(state, batch)
    except Exception as e:      # noqa: BLE001 - recorded: the same step with XLA's attention
        print(f"capture_gpu: cuDNN attention failed ({type(e).__name__}: "
              f"{str(e).splitlines()[0][:200]}); XLA's attention instead", flush=True)
        model.ATTENTION = None
        step = jax.jit(model.train_step.__wrapped__, donate_argnums=0)
        state, loss = step(state, batch)
    loss.block_until_ready()
    result = {"device": str(jax.devices()[0]), "first_step_s": time.time() - t,
              "attention": model.ATTENTION}
    for _ in range(3):
        state, loss = step(state, batch)
    loss.block_until_ready()
    times = []
    for _ in range(10):
        t = time.perf_counter()
        state, loss = step(state, batch)
        loss.block_until_ready()
        times.append(time.perf_counter() - t)
    result.update(step_s=times, loss=float(loss))
    stats = jax.devices()[0].memory_stats() or {}
    result["memory_stats"] = {k: v for k, v in stats.items() if isinstance(v, int)}
    trace_dir = out / "jax_trace"
    with jax.profiler.trace(str(trace_dir), create_perfetto_trace=True):
        for _ in range(3):
            state, loss = step(state, batch)
            loss.block_until_ready()
    _write(out, "jax_step", result)
    kept = ("after_optimizations", "before_optimizations", "gpu_target_config",
            "buffer-assignment")
    _tar(out / "jax_dump.tar.gz", [(f, f"dump/{f.name}") for f in sorted(dump.iterdir())
                                   if any(k in f.name for k in kept)])
    _tar(out / "jax_trace.tar.gz", [(f, f"trace/{f.relative_to(trace_dir)}")
                                    for f in sorted(trace_dir.rglob("*")) if f.is_file()])
    shutil.rmtree(dump)
    shutil.rmtree(trace_dir)


def part_torch_step(out: Path, small: bool) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    sys.path.insert(0, str(ROOT / "examples"))
    import gpu_llama_torch as model

    device = _device(small)
    if small:
        model.VOCAB, model.D, model.HEADS, model.KV_HEADS = 512, 128, 4, 2
        model.FFN, model.LAYERS, model.SEQ, model.SEQS_PER_REPLICA = 256, 2, 128, 2
        model.HEAD_DIM = model.D // model.HEADS
    fields = model.llama(device)
    net = fields["model"]().to(device)
    opt = torch.optim.AdamW(net.parameters(), lr=3e-4)
    tokens = torch.randint(0, model.VOCAB, fields["example_inputs"][0].shape, device=device)

    def step():
        loss = fields["loss_fn"](net(tokens), tokens)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(3):
        step()
    sync()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(8):
        t = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t)
    result = {"device": str(device), "step_s": times}
    if device.type == "cuda":
        result.update(max_allocated=torch.cuda.max_memory_allocated(),
                      max_reserved=torch.cuda.max_memory_reserved())
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA]
                                           if device.type == "cuda" else [])
    with profile(activities=activities, record_shapes=True,
                 schedule=schedule(wait=1, warmup=1, active=1)) as prof:
        for _ in range(3):
            step()
            sync()
            prof.step()
    _write(out, "torch_step", result)
    _export(prof, out / "torch_step_trace.json.gz")
