"""One decoder layer's forward and backward, timed as the run's prediction times them.

    from flint.layer_times import layer_times
    t = layer_times(run)          # LayerTimes: forward_s, backward_s, by class of each

The step a prediction prices is built from a layer template (passes.layer_template): one
forward and one backward block per layer, priced once per run for its cost model and
hardware (hardware_models.composite). These are those two blocks for an interior layer:
what a per-layer measurement (Korthikanti et al. 2022, Table 4: the forward and backward
of one transformer layer) compares with, recompute included where the run recomputes.
"""
from __future__ import annotations

from dataclasses import dataclass

from flint.errors import FlintError
from flint.run import TrainingRun


@dataclass(frozen=True)
class LayerTimes:
    forward_s: float
    backward_s: float
    forward_by_class_s: dict
    backward_by_class_s: dict

    @property
    def combined_s(self) -> float:
        return self.forward_s + self.backward_s

    def as_text(self) -> str:
        return (f"forward {self.forward_s * 1e3:.2f} ms, backward {self.backward_s * 1e3:.2f} "
                f"ms, combined {self.combined_s * 1e3:.2f} ms")


def layer_times(run: TrainingRun, what_if=(), cache=None) -> LayerTimes:
    """An interior layer's forward and backward block of `run` (one micro-batch), priced
    by the built-in cost model with the run's own and the given spec overrides."""
    from flint.engine import _cache, layered_graph, run_overrides
    from flint.hardware_models.composite import LAYER, composite_prices
    from flint.hardware_models.cost_model import default_cost_model

    graph, _ = layered_graph(run, _cache(cache))
    overrides = run_overrides(run) + [str(w) for w in what_if]
    prices = composite_prices(graph, default_cost_model(graph, run.hardware, overrides))
    fwd, bwd = f"F:{LAYER}", f"B:{LAYER}"
    if prices is None or fwd not in prices.seconds:
        raise FlintError(f"{run.label()}: no layer template to time (a one-layer model)")
    return LayerTimes(prices.seconds[fwd], prices.seconds.get(bwd, 0.0),
                      dict(prices.by_class.get(fwd, {})), dict(prices.by_class.get(bwd, {})))
