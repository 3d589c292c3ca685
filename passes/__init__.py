"""Graph passes: each is a frozen dataclass with a `name: ClassVar[str]`, its options as
fields, and `run(graph) -> graph`.

A pipeline is a tuple of passes built from a string such as
`"expand-loops{max_nodes=500000},place{devices=4,memory_limit=40GB}"`: option values are
converted by the field's type hint (int, float, str, bool, optional ones taking `none`),
and a field with `metadata={"unit": KIND}` takes a quantity with its unit
(hardware_models.units). `run_pipeline` checks the graph after every pass, records the
pipeline (`pipeline_text`, which parses back to the same passes) in `graph.meta["passes"]`
and calls an optional callback after every pass (to dump the graph while debugging).
"""
from __future__ import annotations

import dataclasses
import re
import types
import typing
from typing import Callable, ClassVar, Protocol

from flint.errors import FlintError
from flint.graph import WorkloadGraph


class GraphPass(Protocol):
    name: ClassVar[str]

    def run(self, graph: WorkloadGraph) -> WorkloadGraph: ...


def registry() -> dict[str, type]:
    """Every graph -> graph pass, by name."""
    from flint.passes.amax_scope import AmaxScope
    from flint.passes.anonymize import Anonymize
    from flint.passes.attention import CollapseAttention
    from flint.passes.distributed_optimizer import DistributedOptimizer
    from flint.passes.expand_loops import ExpandLoops
    from flint.passes.fuse import FusePointwise
    from flint.passes.kernel_population import KernelPopulation
    from flint.passes.layer_template import LayerTemplate
    from flint.passes.nvfp4_storage import Nvfp4Storage
    from flint.passes.pipeline import PipelineParallel
    from flint.passes.place import Place
    from flint.passes.rescale import Rescale
    from flint.passes.score_path import ScorePath
    from flint.passes.tp_comm_overlap import TpCommOverlap
    from flint.passes.tp_grad_overlap import TpGradOverlap

    return {cls.name: cls for cls in (AmaxScope, Anonymize, CollapseAttention,
                                      DistributedOptimizer, ExpandLoops, FusePointwise,
                                      KernelPopulation, LayerTemplate, Nvfp4Storage,
                                      PipelineParallel, Place, Rescale, ScorePath,
                                      TpCommOverlap, TpGradOverlap)}


_ITEM = re.compile(r"\s*([\w\-]+)\s*(?:\{([^}]*)\})?\s*(?:,|$)")
_TEXT_TYPES = (int, float, str, bool)
_TRUE, _FALSE = ("1", "true", "yes"), ("0", "false", "no")
# how pass_text writes a quantity back, in the base unit parse_quantity returns
_SYMBOL = {"bytes": "B", "bandwidth": "B/s", "time": "s", "flops": "FLOP/s", "frequency": "Hz"}


def options(cls) -> dict[str, tuple[type, bool, dataclasses.Field]]:
    """The options a pipeline string can set: name -> (type, optional, field). Fields of
    other types (a cost model object) are for Python callers only."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        hint, optional = hints[f.name], False
        if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
            args = [a for a in typing.get_args(hint) if a is not type(None)]
            optional = len(args) < len(typing.get_args(hint))
            hint = args[0] if len(args) == 1 else None
        if hint in _TEXT_TYPES:
            out[f.name] = (hint, optional, f)
    return out


def _convert(pass_name: str, key: str, text: str, option) -> object:
    kind, optional, f = option
    if optional and text.lower() == "none":
        return None
    unit = f.metadata.get("unit")
    if unit:
        from flint.hardware_models.units import parse_quantity

        return kind(parse_quantity(text, unit, f"pass {pass_name!r} option {key}"))
    if kind is bool:
        if text.lower() not in _TRUE + _FALSE:
            raise FlintError(f"pass {pass_name!r}: {key} takes true or false, not {text!r}")
        return text.lower() in _TRUE
    try:
        return kind(text)
    except ValueError:
        raise FlintError(f"pass {pass_name!r}: bad value {text!r} for {key}") from None


def parse_pipeline(text: str) -> tuple[GraphPass, ...]:
    """`"expand-loops{max_nodes=1000}"` -> (ExpandLoops(max_nodes=1000),)."""
    known = registry()
    passes = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _ITEM.match(text, pos)
        if not m or m.end() == pos:
            raise FlintError(f"bad pass pipeline near {text[pos:pos + 30]!r}")
        name, given = m.group(1), m.group(2)
        if name not in known:
            raise FlintError(f"unknown pass {name!r}; known: {', '.join(sorted(known))}")
        settable = options(known[name])
        kwargs = {}
        for item in filter(None, (o.strip() for o in (given or "").split(","))):
            key, eq, value = item.partition("=")
            key = key.strip()
            if not eq or key not in settable:
                raise FlintError(f"pass {name!r} has no option {key!r}")
            kwargs[key] = _convert(name, key, value.strip(), settable[key])
        passes.append(known[name](**kwargs))
        pos = m.end()
    return tuple(passes)


def pass_text(p: GraphPass) -> str:
    """One pass as the pipeline string that builds it: its name and non-default options."""
    items = []
    for key, (_, _, f) in options(type(p)).items():
        value = getattr(p, key)
        if value != f.default:
            unit = _SYMBOL.get(f.metadata.get("unit"), "")
            items.append(f"{key}={'none' if value is None else repr(value) + unit if unit else value}")
    return p.name + ("{" + ",".join(items) + "}" if items else "")


def pipeline_text(passes) -> str:
    """The pipeline string of `passes`; parse_pipeline(pipeline_text(ps)) == ps for passes
    built from a string."""
    return ",".join(pass_text(p) for p in passes)


def run_pipeline(graph: WorkloadGraph, passes, callback: Callable | None = None) -> WorkloadGraph:
    """Run `passes` in order; every pass's output must pass `graph.check()`. The graph
    that comes out records the pipeline in meta["passes"] (after any it already had)."""
    before = graph.meta.get("passes", "")
    ran = []
    for p in passes:
        graph = p.run(graph)
        graph.check(f"the graph after pass {p.name!r}")
        ran.append(pass_text(p))
        graph.meta["passes"] = ",".join(filter(None, (before, *ran)))
        if callback is not None:
            callback(p, graph)
    return graph
