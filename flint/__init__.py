"""Flint: a training step becomes the workload graph of a cluster of any size, without it.

    import flint
    step = flint.capture(devices=4096, mesh={"data": 512, "model": 8})(train_step)
    graph = step.workload(params, opt_state, batch)     # nothing runs

    run = flint.TrainingRun(model="llama3-70b", seq_len=8192, devices=1024, tp=8, pp=4)
    flint.predict(run).step_time_s                      # what that configuration costs

Everything is imported lazily: JAX so that Flint can configure compile-only devices before
JAX starts, the rest so that the `flint` command starts (and takes Ctrl-C) at once.
"""
__version__ = "0.1.0"
_LAZY = {"capture": "flint.frontends.jax", "extract": "flint.frontends.jax",
         "Captured": "flint.frontends.jax", "Cluster": "flint.cluster",
         "virtual_mesh": "flint.frontends.virtual_mesh",
         "FlintError": "flint.errors", "TrainingRun": "flint.run",
         "predict": "flint.engine", "Prediction": "flint.engine", **{name: "flint.graph" for name in (
             "Collective", "Communicator", "Loop", "Node", "NodeKind", "WorkloadGraph")}}
__all__ = ["Cluster", "FlintError", "Collective", "Communicator", "Loop", "Node", "NodeKind",
           "WorkloadGraph", *_LAZY]


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'flint' has no attribute {name!r}")
