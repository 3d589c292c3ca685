"""A design space: TrainingRun fields (each one value or a list of values) and hardware
what-ifs, expanded into the runs a sweep prices with `flint.engine.predict`.

    space = SearchSpace.from_dict({"model": "llama3-70b", "seq_len": 8192,
                                   "devices": [512, 1024], "tp": [4, 8], "pp": [1, 2, 4],
                                   "global_batch": 512, "precision": ["bf16", "fp8"],
                                   "what_if": [{}, {"nic_bandwidth": "800Gb/s"}]})
    points, skipped = space.expand()

Every axis is a field of flint.run.TrainingRun with that field's default when the space
does not name it, so a sweep point and `flint predict` with the same fields are the same
run and the same number. `what_if` is a list of hardware what-ifs (mappings of spec
figures, `{}` = the spec as it is). Settings: `budget` (price a seeded random subset of
that many points), `seed`, `max_microbatches` (skip points needing more gradient-
accumulation steps; 0 = no limit).
"""
from __future__ import annotations

import hashlib
import itertools
import json
import math
import random
from dataclasses import dataclass, fields

from flint.errors import FlintError
from flint.run import TrainingRun
from flint.run_schema import RunSchema
from flint.schema import did_you_mean, validated

RUN_FIELDS = tuple(f.name for f in fields(TrainingRun))
AXES = RUN_FIELDS + ("what_if",)
SETTINGS = {"budget": 0, "seed": 0, "max_microbatches": 0}
# Bounds that keep a sweep finite: configurations before expansion, values per axis.
MAX_CONFIGURATIONS = 100_000
MAX_AXIS_VALUES = 1000
# names of the earlier sweep schema, and what says the same now
RENAMED = {"microbatch": "micro_batch", "virtual": "vp",
           "fsdp": "zero (3 = FSDP)", "layers": "model ({base: NAME, layers: N})"}


@dataclass(frozen=True)
class SweepPoint:
    """One run of a sweep under one hardware what-if (a tuple of (figure, value))."""

    run: TrainingRun
    what_if: tuple = ()

    def overrides(self) -> list[str]:
        return [f"{k}={v}" for k, v in self.what_if]

    def key(self) -> str:
        return _digest({"run": self.run.to_json(), "what_if": dict(self.what_if)})

    def label(self) -> str:
        wi = ",".join(f"{k}={v}" for k, v in self.what_if)
        return self.run.label() + (f" [{wi}]" if wi else "")


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class SearchSpace:
    axes: dict
    settings: dict

    @classmethod
    def from_dict(cls, doc: dict) -> "SearchSpace":
        if not isinstance(doc, dict):
            raise FlintError("a search space must be a mapping of TrainingRun fields to values")
        for name in sorted(map(str, doc)):
            if name in RENAMED:
                raise FlintError(f"search space: {name!r} is now {RENAMED[name]}")
            if name not in AXES and name not in SETTINGS:
                raise FlintError(f"unknown search-space key {name!r}"
                                 f"{did_you_mean(name, list(AXES) + list(SETTINGS))}")
        axes = {}
        for name in AXES:
            if name not in doc:
                continue
            value = doc[name]
            values = value if isinstance(value, list) else [value]
            if not values:
                raise FlintError(f"empty search space: axis {name!r} has no values")
            if len(values) > MAX_AXIS_VALUES:
                raise FlintError(f"search space: axis {name!r} has {len(values)} values; "
                                 f"the limit is {MAX_AXIS_VALUES}")
            axes[name] = [_checked(name, v) for v in values]
        settings = dict(SETTINGS)
        for name in SETTINGS:
            if name in doc:
                v = doc[name]
                top = MAX_CONFIGURATIONS if name == "budget" else 2**63 - 1
                if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= top:
                    raise FlintError(f"search space: {name} must be an integer in 0..{top}, "
                                     f"got {v!r}")
                settings[name] = v
        for name in ("model", "devices"):
            if name not in axes:
                raise FlintError(f"search space: {name}: missing (the runs' {name})")
        count = math.prod(len(v) for v in axes.values())
        if count > MAX_CONFIGURATIONS:
            raise FlintError(f"search space has {count} configurations before filtering; "
                             f"the limit is {MAX_CONFIGURATIONS} (use fewer values or "
                             f"budget on a smaller space)")
        return cls(axes, settings)

    def expand(self) -> tuple[list[SweepPoint], list[dict]]:
        """(valid points, grouped by stage program then in the space's order; skipped
        points with the reason, e.g. degrees that do not divide). An empty list of valid
        points is not an error: the skipped list says why."""
        names = [n for n in AXES if n in self.axes]
        runs = [n for n in names if n != "what_if"]
        scenarios = [tuple(sorted(w.items())) for w in self.axes.get("what_if", [{}])]
        points, skipped = [], []
        for values in itertools.product(*(self.axes[n] for n in runs)):
            doc = dict(zip(runs, values))
            try:
                run = TrainingRun.from_json(doc, "run")
            except FlintError as e:
                skipped.append({**doc, "reason": str(e).removeprefix("run: ")})
                continue
            limit = self.settings["max_microbatches"]
            if limit and run.microbatches > limit:
                skipped.append({**doc, "reason": f"{run.microbatches} micro-batches exceed "
                                                 f"max_microbatches={limit}"})
                continue
            points.extend(SweepPoint(run, w) for w in scenarios)
        budget = self.settings["budget"]
        if budget and budget < len(points):
            picked = sorted(random.Random(self.settings["seed"]).sample(range(len(points)),
                                                                        budget))
            points = [points[i] for i in picked]
        _check_what_ifs(points)
        return _by_program(points), skipped


def _checked(name: str, value):
    """One axis value, type-checked alone (so a bad value is one error, not a skipped row
    per point)."""
    if name == "what_if":
        if not isinstance(value, dict):
            raise FlintError(f"search space: what_if values are mappings of spec figures, "
                             f"got {value!r}")
        return {str(k): str(v) for k, v in value.items()}
    probe = {"model": "x", "seq_len": 1, "devices": 1, name: value}
    validated(RunSchema, probe, f"search space: {name}")
    try:        # a model or a spec that does not exist is bad input, not a skipped point
        if name == "model":
            from flint.models.describe import resolve_model

            resolve_model(dict(value) if isinstance(value, dict) else value)
        elif name == "hardware":
            from flint.frontends.targets import resolve_target

            resolve_target(value)
    except FlintError as e:
        raise FlintError(f"search space: {name}: {e}") from None
    return value


def _check_what_ifs(points: list[SweepPoint]) -> None:
    """Bad what-if figures or units fail before any work."""
    from flint.hardware_models.spec import load_spec

    seen = set()
    for p in points:
        key = (p.run.hardware, p.what_if)
        if key not in seen:
            seen.add(key)
            load_spec(p.run.hardware, p.overrides())


def _by_program(points: list[SweepPoint]) -> list[SweepPoint]:
    """Points of one stage program together (each is compiled once and kept in memory
    while its points are priced), programs in order of first appearance."""
    from flint.engine import stage_program
    from flint.template_cache import program_key

    groups: dict[str, list[SweepPoint]] = {}
    for p in points:
        groups.setdefault(program_key(stage_program(p.run)), []).append(p)
    return [p for group in groups.values() for p in group]


def program_of(point: SweepPoint) -> str:
    from flint.engine import stage_program
    from flint.template_cache import program_key

    return program_key(stage_program(point.run))
