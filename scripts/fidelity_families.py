"""Families of published rows and the framework semantics each one runs, as TrainingRun
fields: the part of scripts/fidelity.py that says *how* a row's framework behaves.

A family is (source section x framework x GPU), e.g. "published 1a Megatron-Bridge x
Megatron-Core+TE x H100". Each family belongs to an era (fidelity_eras.ERAS): the framework
lineage the section's prose names. What a row states (model, devices, TP/PP/DP, micro-batch, recompute,
ZeRO stage, precision, the cluster's network) goes into its own fields; how its framework
runs (attention kernel, sequence parallelism, when gradients are reduced, how stages are
split, TP communication overlap) comes from its era, once, through MECHANISMS
(scripts/fidelity_mechanisms.py): each a named
assignment of run fields with the public source it rests on, never chosen per row. M8 is a
rule: a row whose source lists no recompute is rebuilt with the least block recompute that
fits (flint.fit_memory), as the recipes set it.

"before": every family as Flint priced runs before issue 27 (framework megatron, or xla on
a TPU; flash attention; gradient reduction overlapped with the backward; stages balanced by
predicted time; no TP communication overlap, in the GEMMs or beside the backward's wgrad;
pipeline sends posted ahead, each rank sending the whole boundary tensor). "after": before
plus every mechanism of the row's era. fp16 rows run bf16 GEMMs (the same dense tensor rate:
A100 312, H100 989 TFLOP/s).
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field, fields

from fidelity_mechanisms import MECHANISMS, Mechanism  # noqa: F401 (re-exported)


def run_fields() -> set:
    from flint.run import TrainingRun

    return {f.name for f in fields(TrainingRun)}


INCLUDE_BLOCKED = False         # scripts/fidelity.py --include-blocked


def available(m: Mechanism) -> bool:
    return (bool(m.assign) or m.fit_memory) and (not m.needs or m.needs in run_fields()) and (
        INCLUDE_BLOCKED or not m.blocked)


def before_fields(case) -> dict:
    """How Flint priced every row before issue 27."""
    out = {"framework": "xla" if case.era in ("maxtext", "pathways") else "megatron",
           "attention": "flash", "overlap_grad_reduce": True, "pipeline_split": "time"}
    for name in ("tp_comm_overlap", "tp_grad_overlap"):
        if name in run_fields():
            out[name] = False
    if "pipeline_p2p" in run_fields():      # every send posted ahead, the whole boundary
        out["pipeline_p2p"] = "posted-ahead"
    if out["framework"] == "xla" and "xla_emitters" in run_fields():
        # the shared XLA runs on GPUs (MaxText A3, 2024-04) predate XLA's MLIR emitters
        # (populations.XLA_EMITTERS); the TPU rows price no GPU emitter
        out["xla_emitters"] = "legacy"
    return out


def applicable(case) -> list:
    built = variant_fields(case, [])
    return [m for m in MECHANISMS if available(m) and case.era in m.eras and all(
        built.get(name, _run_defaults().get(name)) in values for name, values in m.only)
        and not (m.fit_memory and case.remat_stated)
        and (not m.families or re.search(m.families, case.family, re.I))]


@functools.cache
def _run_defaults() -> dict:
    from flint.run import TrainingRun

    return {f.name: f.default for f in fields(TrainingRun)}


def variant_fields(case, mechanisms) -> dict:
    """The run fields of `case` under the before assignment plus `mechanisms`."""
    out = dict(before_fields(case))
    for m in mechanisms:
        out.update(dict(m.assign))
    out.update(case.fields)         # what the row states always wins
    return out


@dataclass
class Case:
    """One published row: its family, the fields it states, the what-ifs of its cluster."""

    label: str
    file: str                   # "published" | "more-published"
    section: str
    family: str
    era: str
    fields: dict = field(default_factory=dict)
    what_if: tuple = ()
    published_step_s: float = 0.0
    reason: str = ""            # why it cannot be rebuilt ("" = rebuildable)
    remat_stated: bool = False  # the row names its recompute: no rule fits it to memory
    group: str = ""             # BLOOM sweep: the model's dims (rank correlation groups)
    predicted: dict = field(default_factory=dict)   # variant -> result
    runs: dict = field(default_factory=dict)        # variant -> the run's key

    def to_json(self) -> dict:
        d = dict(self.__dict__)
        d["what_if"] = list(self.what_if)
        return d
