"""The Ray executor for sweeps that outgrow one machine (`flint sweep --executor ray`).

One Ray task per program: it extracts (or loads from the shared cache directory) the graph
and evaluates every configuration of that program, exactly as the local executor does, so
both give the same rows. The driver appends rows as tasks finish. With no cluster address
in RAY_ADDRESS, a local Ray instance with `workers` CPUs is started and shut down again.
"""
from __future__ import annotations

import os


def run_groups(directory: str, groups, workers: int, record, evaluate_group,
               cost_model=None) -> None:
    """`evaluate_group(directory, configs, cost_model) -> rows` runs in one Ray task per
    group (the caller passes flint.sweep.evaluate_group: this module does not import the
    sweep); `cost_model` goes to every task as given (a `module:factory` name travels best)."""
    try:
        import ray
    except ImportError:
        from flint.errors import FlintError

        raise FlintError("the ray executor needs Ray: pip install 'flint[ray]'") from None
    started = not ray.is_initialized()
    if started:
        if os.environ.get("RAY_ADDRESS"):
            ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False)
        else:
            ray.init(num_cpus=max(workers, 1), include_dashboard=False, log_to_driver=False)
    try:
        task = ray.remote(num_cpus=1)(evaluate_group)
        pending = [task.remote(directory, group, cost_model) for group in groups]
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            for rows in ray.get(ready):
                for row in rows:
                    record(row)
    finally:
        if started:
            ray.shutdown()
