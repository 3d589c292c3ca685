"""Third-party cost models: how every consumer (estimate, validate, place, the time-split
pipeline, the Chakra export, sweeps) gets the CostModel that prices a graph.

A cost model prices the nodes of one graph (its network half needs the graph's cluster),
so what travels through Flint is a *factory*:

    def my_factory(graph, hardware=None, overrides=()) -> CostModel: ...
    estimate(graph, cost_model=my_factory)       # or a CostModel already built for graph
    flint sweep space.yaml --out d --cost-model my_package.my_module:my_factory

`default_cost_model` is the built-in factory. A factory named on the command line is
imported by module name (it must be importable: installed, or on PYTHONPATH); no file
path is ever executed.
"""
from __future__ import annotations

import importlib
import re
from typing import Callable

from flint.errors import FlintError
from flint.graph import WorkloadGraph
from flint.hardware_models.cost_model import CostModel, default_cost_model

CostModelFactory = Callable[..., CostModel]
_SPEC = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")


def cost_model_for(graph: WorkloadGraph, hardware: str | None = None, overrides=(),
                   cost_model=None, algorithm: str = "auto") -> CostModel:
    """The CostModel that prices `graph`: `cost_model` itself when it is one (it has
    node_time), what a factory builds for this graph, or the built-in model."""
    if cost_model is None:
        return default_cost_model(graph, hardware, overrides, algorithm)
    if hasattr(cost_model, "node_time"):
        return cost_model
    model = cost_model(graph, hardware, overrides)
    if not hasattr(model, "node_time") or not hasattr(model, "spec"):
        raise FlintError(f"cost model factory {cost_model_name(cost_model)} returned "
                         f"{type(model).__name__}, not a CostModel (spec, node_time)")
    return model


def load_cost_model_factory(spec: str) -> CostModelFactory:
    """`package.module:factory` -> the factory (one-line FlintError when it is not one)."""
    if not _SPEC.match(spec or ""):
        raise FlintError(f"--cost-model {spec!r} must look like package.module:factory")
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise FlintError(f"--cost-model {spec}: cannot import {module_name} ({e})") from None
    except Exception as e:   # the module itself failed while importing
        raise FlintError(f"--cost-model {spec}: importing {module_name} failed: "
                         f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                         ) from None
    factory = getattr(module, attr, None)
    if factory is None or not callable(factory):
        raise FlintError(f"--cost-model {spec}: {module_name} has no callable {attr!r}")
    return factory


def cost_model_name(cost_model) -> str | None:
    """`module:name` of a factory (or of a CostModel's class); None for the built-in."""
    if cost_model is None or cost_model is default_cost_model:
        return None
    if isinstance(cost_model, str):
        return cost_model
    # a function or class names itself; an instance (a callable object, a built model)
    # goes by its class
    obj = cost_model if hasattr(cost_model, "__qualname__") else type(cost_model)
    return f"{obj.__module__}:{obj.__qualname__}"


def resolve_cost_model(cost_model):
    """A factory, a CostModel or None as given, or a `module:factory` string imported."""
    return load_cost_model_factory(cost_model) if isinstance(cost_model, str) else cost_model
