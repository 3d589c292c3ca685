"""A design space: the axes a sweep varies, the configurations it expands to, and the keys
that decide what must be re-extracted (the program) versus only re-estimated (hardware).

    space = SearchSpace.from_dict({"model": "llama3-8b", "devices": [64, 4096],
                                   "tp": [8], "pp": [1, 4], "global_batch": 256,
                                   "what_if": [{}, {"nic_bandwidth": "800Gb/s"}]})
    configs, skipped = space.expand()

A configuration's program is what the compiler sees: model shape, the mesh of one pipeline
stage (devices / pp), the microbatch, remat, sequence parallelism. Two configurations with
the same program share one extracted graph; pipeline depth, microbatch count, schedule and
hardware what-ifs only change the graph passes and the cost model run on it.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import math
import random
from dataclasses import asdict, dataclass, field
from typing import Literal, Union

from pydantic import Field
from typing_extensions import Annotated

from flint.cluster import MAX_DEVICES
from flint.errors import FlintError
from flint.models import REMAT_POLICIES
from flint.schema import Bool, Number, PositiveInt, Str, Strict, did_you_mean, validated

# Axis -> default values. Scalars become one-element lists.
AXES = {
    "devices": [64], "tp": [1], "pp": [1], "ep": [1], "fsdp": [True], "sp": [False],
    "microbatch": [1], "schedule": ["1f1b"], "virtual": [1], "remat": ["none"],
    "hardware": ["h100-sxm"], "what_if": [{}],
}
# `model` is a zoo/preset name, a model YAML or HF config.json path, or a mapping of dims
# (layers, hidden, heads, kv_heads, ffn, vocab, seq, norm, activation, positional, base).
SETTINGS = {"model": "llama3-8b", "framework": "jax", "global_batch": 0, "seq_len": 0,
            "layers": 0, "budget": 0, "seed": 0, "pipeline_split": "layers",
            "max_microbatches": 64}
# Bounds that keep a sweep finite: configurations before expansion, and each setting.
MAX_CONFIGURATIONS = 100_000
MAX_AXIS_VALUES = 1000
SCHEDULES = ("gpipe", "1f1b", "interleaved")


def _axis(t):
    """An axis: one value or a non-empty list of at most MAX_AXIS_VALUES values."""
    return Union[t, Annotated[list[t], Field(min_length=1, max_length=MAX_AXIS_VALUES)]]


def _bounded(limit: int):
    return Annotated[int, Field(strict=True, ge=0, le=limit)]


_Degree = Annotated[PositiveInt, Field(le=MAX_DEVICES)]


class SpaceSchema(Strict):
    """The search-space YAML (and the flags that fill it): types, ranges, enums."""

    devices: _axis(_Degree) = AXES["devices"]
    tp: _axis(_Degree) = AXES["tp"]
    pp: _axis(_Degree) = AXES["pp"]
    ep: _axis(_Degree) = AXES["ep"]
    fsdp: _axis(Bool) = AXES["fsdp"]
    sp: _axis(Bool) = AXES["sp"]
    microbatch: _axis(Annotated[PositiveInt, Field(le=2**16)]) = AXES["microbatch"]
    schedule: _axis(Literal[SCHEDULES]) = AXES["schedule"]
    virtual: _axis(Annotated[PositiveInt, Field(le=1024)]) = AXES["virtual"]
    remat: _axis(Literal[REMAT_POLICIES]) = AXES["remat"]
    hardware: _axis(Str) = AXES["hardware"]
    what_if: _axis(dict[Str, Union[Str, Number]]) = AXES["what_if"]
    model: Str = SETTINGS["model"]
    framework: Literal["jax"] = "jax"
    global_batch: _bounded(2**24) = 0
    seq_len: _bounded(2**20) = 0
    layers: _bounded(10_000) = 0
    budget: _bounded(MAX_CONFIGURATIONS) = 0
    seed: _bounded(2**63 - 1) = 0
    pipeline_split: Literal["layers", "time"] = "layers"
    max_microbatches: _bounded(2**16) = 64


@dataclass(frozen=True)
class Config:
    model: object                 # zoo name, or a mapping of dims (flint.models.describe)
    devices: int
    tp: int
    pp: int
    dp: int
    fsdp: bool
    sp: bool
    microbatch: int               # sequences per microbatch per data-parallel replica
    microbatches: int             # per step (gradient accumulation / pipeline depth)
    schedule: str
    virtual: int
    remat: str
    hardware: str
    what_if: tuple                # ((field, value), ...)
    seq_len: int = 0
    layers: int = 0
    framework: str = "jax"
    pipeline_split: str = "layers"
    gemm_precision: str = "bf16"  # bf16 | fp8 | mxfp8 (flint.models.layers.matmul)
    ep: int = 1                   # expert parallelism (MoE models): an `expert` mesh axis

    @property
    def stage_devices(self) -> int:
        return self.devices // self.pp

    @property
    def scan(self) -> bool:
        """Layers in a scan compile fastest; splitting into stages needs them unrolled."""
        return self.pp == 1

    def mesh(self) -> tuple[tuple[str, int], ...]:
        axes = [("fsdp" if self.fsdp else "data", self.dp // self.ep)]
        if self.ep > 1:      # EP ranks are data-parallel ranks for all but the experts
            axes.append(("expert", self.ep))
        if self.tp > 1:
            axes.append(("model", self.tp))
        return tuple(axes)

    def program(self) -> dict:
        """Everything the extracted graph depends on (and nothing else): the hardware is
        the compile target (XLA fuses per GPU); what-ifs only change the cost model."""
        return {"framework": self.framework, "model": self.model, "devices": self.stage_devices,
                "mesh": [list(a) for a in self.mesh()], "batch_per_replica": self.microbatch,
                "remat": self.remat, "sequence_parallel": self.sp, "scan": self.scan,
                "seq_len": self.seq_len, "layers": self.layers, "hardware": self.hardware,
                **({"gemm_precision": self.gemm_precision}
                   if self.gemm_precision != "bf16" else {}),
                **({"ep": self.ep} if self.ep > 1 else {})}

    def program_key(self) -> str:
        return _digest(self.program())

    def key(self) -> str:
        return _digest(self.to_json())

    def to_json(self) -> dict:
        d = asdict(self)
        d["what_if"] = {k: v for k, v in self.what_if}
        if d["ep"] == 1:
            del d["ep"]        # dense configurations keep the keys they always had
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Config":
        """The configuration of a `to_json` dict (or of a result row, which holds one)."""
        return cls(**{**{k: d[k] for k in cls.__dataclass_fields__ if k in d},
                      "what_if": tuple(sorted(d["what_if"].items()))})

    def overrides(self) -> list[str]:
        return [f"{k}={v}" for k, v in self.what_if]

    def label(self) -> str:
        wi = ",".join(f"{k}={v}" for k, v in self.what_if) or "baseline"
        return (f"{self.devices} dev dp{self.dp}{'(fsdp)' if self.fsdp else ''} tp{self.tp} "
                f"pp{self.pp} mb{self.microbatch}x{self.microbatches} remat={self.remat} "
                f"{self.hardware} {wi}")


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class SearchSpace:
    axes: dict = field(default_factory=dict)
    settings: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, doc: dict) -> "SearchSpace":
        if not isinstance(doc, dict):
            raise FlintError("a search space must be a mapping of axes to values")
        known = sorted(AXES) + sorted(SETTINGS)
        unknown = sorted(map(str, set(doc) - set(AXES) - set(SETTINGS)))
        if unknown:
            raise FlintError(f"unknown search-space key {unknown[0]!r}"
                             f"{did_you_mean(unknown[0], known)}")
        for name in AXES:
            if doc.get(name) == []:
                raise FlintError(f"empty search space: axis {name!r} has no values")
        checked = validated(SpaceSchema, doc, "search space")
        axes = {}
        for name in AXES:
            value = doc.get(name, AXES[name])
            axes[name] = value if isinstance(value, list) else [value]
        settings = {k: getattr(checked, k) for k in SETTINGS}
        count = math.prod(len(v) for v in axes.values())
        if count > MAX_CONFIGURATIONS:
            raise FlintError(f"search space has {count} configurations before filtering; "
                             f"the limit is {MAX_CONFIGURATIONS} (use fewer values or "
                             f"--budget on a smaller space)")
        return cls(axes, settings)

    def expand(self) -> tuple[list[Config], list[dict]]:
        """(valid configurations in a fixed order, skipped ones with the reason). Raises
        FlintError when an axis value can never work for the model, or nothing is left."""
        shape = _model_shape(self.settings)
        self._check_against_model(shape)
        configs, skipped = [], []
        names = list(AXES)
        for values in itertools.product(*(self.axes[n] for n in names)):
            point = dict(zip(names, values))
            cfg, why = self._config(point, shape)
            if cfg is None:
                skipped.append({**{k: v for k, v in point.items() if k != "what_if"},
                                "reason": why})
            else:
                configs.append(cfg)
        if not configs:
            reason = skipped[0]["reason"] if skipped else "no axis values"
            raise FlintError(f"empty search space: no configuration is valid (e.g. {reason})")
        budget = self.settings["budget"]
        if budget and budget < len(configs):
            picked = sorted(random.Random(self.settings["seed"]).sample(range(len(configs)),
                                                                        budget))
            configs = [configs[i] for i in picked]
        return configs, skipped

    def _check_against_model(self, shape: dict) -> None:
        from flint.hardware_models.spec import load_spec

        name = shape["name"]
        for tp in self.axes["tp"]:
            for what, n in (("attention heads", shape["heads"]), ("KV heads", shape["kv_heads"])):
                if n % tp:
                    raise FlintError(f"tp={tp} does not divide {name}'s {n} {what}")
        for pp in self.axes["pp"]:
            if pp > shape["layers"]:
                raise FlintError(f"pp={pp} exceeds {name}'s {shape['layers']} layers")
        for ep in self.axes["ep"]:
            if ep > 1 and not shape.get("experts"):
                raise FlintError(f"ep={ep}: {name} has no experts to shard")
            if ep > 1 and shape["experts"] % ep:
                raise FlintError(f"ep={ep} does not divide {name}'s {shape['experts']} experts")
        for hw in self.axes["hardware"]:
            for wi in self.axes["what_if"]:
                load_spec(hw, [f"{k}={v}" for k, v in wi.items()])   # bad units fail here

        bad = [r for r in self.axes["remat"] if r not in REMAT_POLICIES]
        if bad:
            raise FlintError(f"unknown remat policy {bad[0]!r}; use {' | '.join(REMAT_POLICIES)}")
        if self.settings["framework"] != "jax":
            raise FlintError("sweeps extract with the JAX front end (framework: jax)")
        if self.settings["pipeline_split"] not in ("layers", "time"):
            raise FlintError("pipeline_split must be layers or time")

    def _config(self, pt: dict, shape: dict) -> tuple[Config | None, str]:
        devices, tp, pp, mb = pt["devices"], pt["tp"], pt["pp"], pt["microbatch"]
        if devices % (tp * pp):
            return None, f"{devices} devices do not divide into tp={tp} x pp={pp}"
        dp = devices // (tp * pp)
        gb = self.settings["global_batch"] or dp * mb
        if gb % (dp * mb):
            return None, f"global batch {gb} is not a multiple of dp={dp} x microbatch={mb}"
        m = gb // (dp * mb)
        if self.settings["max_microbatches"] and m > self.settings["max_microbatches"]:
            return None, (f"{m} microbatches exceed max_microbatches="
                          f"{self.settings['max_microbatches']}")
        if pt["schedule"] == "interleaved":
            if pt["virtual"] < 2 or m % pp or pp == 1:
                return None, "interleaved needs virtual >= 2, pp > 1 and microbatches % pp == 0"
            if pp * pt["virtual"] > shape["layers"]:
                return None, f"{pp}x{pt['virtual']} virtual stages exceed the layers"
        elif pt["virtual"] != 1:
            return None, f"virtual stages need the interleaved schedule, not {pt['schedule']}"
        plain = [s for s in self.axes["schedule"] if s != "interleaved"]
        if pp == 1 and pt["schedule"] != plain[0]:   # one pp=1 run, whatever the schedules
            return None, "pipeline schedules only differ when pp > 1"
        if pt["sp"] and tp == 1:
            return None, "sequence parallelism needs tp > 1"
        if dp % pt["ep"]:
            return None, f"ep={pt['ep']} does not divide dp={dp}"
        return Config(self.settings["model"], devices, tp, pp, dp, bool(pt["fsdp"]),
                      bool(pt["sp"]), mb, m, pt["schedule"], pt["virtual"], pt["remat"],
                      pt["hardware"], tuple(sorted(pt["what_if"].items())),
                      self.settings["seq_len"], self.settings["layers"],
                      self.settings["framework"], self.settings["pipeline_split"],
                      ep=pt["ep"]), ""


def _model_shape(settings: dict) -> dict:
    from flint.frontends.targets import prepare_environment, quiet_native_stderr

    prepare_environment()
    with quiet_native_stderr():   # the CUDA plugin's probes when JAX is first imported
        from flint.models import decoder

    from flint.models.describe import resolve_model, to_mapping

    cfg = resolve_model(settings["model"])
    # the program carries the model's dims, so a YAML/JSON model or a mapping of dims
    # keys the extraction cache by what it describes
    settings["model"] = settings["model"] if isinstance(settings["model"], str) and \
        settings["model"] in decoder.ZOO else to_mapping(cfg)
    return {"heads": cfg.n_heads, "kv_heads": cfg.n_kv_heads,
            "layers": settings["layers"] or cfg.n_layers, "experts": cfg.n_experts,
            "name": cfg.name,
            "seq_len": cfg.seq_len}
