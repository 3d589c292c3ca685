"""Profile a real run of a built-in model on this machine's host CPU devices.

The step Flint extracts and the step that runs are one executable: it is compiled once for
the host devices, its optimized HLO becomes the WorkloadGraph, and the same executable runs
under `jax.profiler` on zero-filled arguments. So every profiled op has its node.
"""
from __future__ import annotations

from pathlib import Path


def compile_zoo_step(model: str, devices: int, mesh: str, **build_options):
    """(WorkloadGraph, run(args) -> new args, args): the step compiled for the host devices,
    its graph, and zero-filled arguments already run once (first-touch allocations done)."""
    import jax
    import jax.numpy as jnp

    from flint.frontends.jax import capture
    from flint.models.train import build
    from flint.cluster import parse_mesh

    mesh_t = parse_mesh(mesh, devices)
    w = build(model, mesh_t, **build_options)
    step = capture(w.step, devices=devices, mesh=dict(mesh_t), hardware="cpu",
                   in_specs=w.in_specs, out_specs=w.out_specs, donate_argnums=w.donate_argnums)
    compiled = step.lower(*w.args).compile()
    graph = compiled.workload()
    graph.meta["model_flops_per_device"] = w.info["model_flops"] / devices
    run = compiled.compiled
    args = jax.tree.map(lambda sds, sharding: jax.device_put(jnp.zeros(sds.shape, sds.dtype),
                                                             sharding),
                        w.args, run.input_shardings[0])

    def run_step(args):
        out = run(*args)
        jax.block_until_ready(out)
        return (out[0], out[1], args[2])  # new params and optimizer state, same batch

    return graph, run_step, run_step(args)


def profile_zoo_step(model: str, devices: int, mesh: str, log_dir, steps: int = 5,
                     **build_options):
    """(WorkloadGraph of the step, directory of the JAX profiler trace of `steps` runs)."""
    import jax

    graph, step, args = compile_zoo_step(model, devices, mesh, **build_options)
    log_dir = Path(log_dir)
    jax.profiler.start_trace(str(log_dir))
    try:
        for i in range(steps):
            with jax.profiler.StepTraceAnnotation("train", step_num=i):
                args = step(args)
    finally:
        jax.profiler.stop_trace()
    return graph, log_dir
