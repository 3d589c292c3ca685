"""Graph passes: each is a frozen dataclass with a `name` and `run(graph) -> graph`.

A pipeline is a tuple of passes built from a string such as
`"expand-loops{max_nodes=500000}"`, run with an optional callback after every pass (to dump
the graph while debugging).
"""
from __future__ import annotations

import dataclasses
import re
from typing import Callable, Protocol

from flint.errors import FlintError
from flint.graph import WorkloadGraph


class GraphPass(Protocol):
    name: str

    def run(self, graph: WorkloadGraph) -> WorkloadGraph: ...


def registry() -> dict[str, type]:
    from flint.passes.anonymize import Anonymize
    from flint.passes.expand_loops import ExpandLoops
    from flint.passes.layer_template import LayerTemplate
    from flint.passes.pipeline import PipelineParallel
    from flint.passes.place import Place
    from flint.passes.rescale import Rescale

    return {cls.name: cls for cls in (Anonymize, ExpandLoops, LayerTemplate, PipelineParallel,
                                      Place, Rescale)}


_ITEM = re.compile(r"\s*([\w\-]+)\s*(?:\{([^}]*)\})?\s*(?:,|$)")


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
        name, options = m.group(1), m.group(2)
        if name not in known:
            raise FlintError(f"unknown pass {name!r}; known: {', '.join(sorted(known))}")
        cls = known[name]
        fields = {f.name: f for f in dataclasses.fields(cls) if f.name != "name"}
        kwargs = {}
        for item in filter(None, (o.strip() for o in (options or "").split(","))):
            key, eq, value = item.partition("=")
            if not eq or key.strip() not in fields:
                raise FlintError(f"pass {name!r} has no option {key.strip()!r}")
            kind = type(fields[key.strip()].default)
            try:
                kwargs[key.strip()] = kind(value.strip()) if kind is not bool else \
                    value.strip().lower() in ("1", "true", "yes")
            except ValueError:
                raise FlintError(f"pass {name!r}: bad value {value.strip()!r} for "
                                 f"{key.strip()}") from None
        passes.append(cls(**kwargs))
        pos = m.end()
    return tuple(passes)


def run_pipeline(graph: WorkloadGraph, passes, callback: Callable | None = None) -> WorkloadGraph:
    for p in passes:
        graph = p.run(graph)
        if callback is not None:
            callback(p, graph)
    return graph
