"""The rows of ../shared/tables/published.md as fidelity cases: the configuration
compare_published.training_run states for each dense row (its docstring lists the
assumptions where a row is silent), its family, and why a row cannot be rebuilt.

Section 4 (Korthikanti et al. 2022) publishes two iteration times per configuration: with
sequence parallelism and selective recompute (the row compare_published rebuilds) and
the baseline with full recompute and no sequence parallelism; the baseline is a second
case of the same row here ("... full-recompute").
"""
from __future__ import annotations

from pathlib import Path

from fidelity_eras import TORCH_ERAS, UNSHARDED_OPTIMIZER_ERAS
from fidelity_families import Case
from fidelity_sections import family_name, gpu_of, section_of
from published_rows import TABLE, rows_of
from table_columns import first_number, tables

# what compare_published.training_run states for a row; every other field is derived
# from these or set by the family's semantics (a default such as grad_reduce_dtype fp32 or
# grad_sync must not pass for the row's statement and override its framework's)
STATED = ("model", "seq_len", "devices", "hardware", "tp", "cp", "pp", "vp", "zero",
          "micro_batch", "global_batch", "remat", "recompute_layers", "precision", "hsdp")


def published_cases(path: Path = TABLE) -> list[Case]:
    from compare_published import training_run

    from flint.errors import FlintError

    out: list[Case] = []
    blocks: dict[str, int] = {}
    for heading, records in tables(path):
        section = heading.split(".")[0].split(" ")[0]
        block = blocks.get(section, 0)
        blocks[section] = block + 1
        source, era = section_of(section, heading)
        for record, row in zip(records, rows_of(heading, records)):
            family = family_name("published", section, source, era,
                                 gpu_of(record, section, block))
            case = Case(row.label, "published", section, family, era,
                        what_if=tuple(row.what_if),
                        published_step_s=row.published_step_s, reason=row.reason,
                        remat_stated=row.remat_stated)
            if row.moe and not row.reason.startswith("MoE"):
                case.reason = row.reason
            elif row.moe:
                case.reason = "MoE model (scripts/published_moe.py rebuilds these rows)"
            if not case.reason:
                try:
                    run = training_run(row)
                except FlintError as err:
                    case.reason = str(err)
                else:
                    case.fields = {k: v for k, v in run.to_json().items() if k in STATED}
                    if not row.remat_stated:    # the framework's recipe says (its era)
                        for name in ("remat", "recompute_layers"):
                            case.fields.pop(name)
                    if row.fp8_recipe:          # FP8-CS: the scaling is stated
                        case.fields["fp8_recipe"] = row.fp8_recipe
                    if row.overlap_grad_reduce is not None:     # the DDP wrapper stated
                        case.fields["overlap_grad_reduce"] = row.overlap_grad_reduce
                    if row.collective_matmul != "auto":     # the config's XLA flags
                        case.fields["collective_matmul"] = row.collective_matmul
                    if row.tp_comm_overlap is not None:     # the config's userbuffers
                        case.fields["tp_comm_overlap"] = row.tp_comm_overlap
                    if row.lora_rank:                   # LoRA fine-tuning's adapters
                        case.fields.update(lora_rank=row.lora_rank,
                                           lora_targets=run.lora_targets,
                                           lora_base=run.lora_base)
                    if not row.reshard_after_forward:   # SHARD_GRAD_OP: FSDP's option,
                        case.fields["reshard_after_forward"] = False   # checked per era
                    if era in TORCH_ERAS and not row.fsdp and row.zero is None:
                        case.fields["zero"] = 0     # PyTorch DDP: gradients all-reduced
                    if era in UNSHARDED_OPTIMIZER_ERAS and row.zero is None:
                        case.fields.pop("zero")     # its era's optimizer (a mechanism)
            out.append(case)
            if section == "4" and not case.reason:
                out.append(_full_recompute(case, record))
    return out


def _full_recompute(selective: Case, record: dict) -> Case:
    """Korthikanti's baseline of the same configuration: full recompute, no SP."""
    case = Case(f"{selective.label} full-recompute", "published", "4", selective.family,
                selective.era, published_step_s=first_number(
                    record.get("iter_s_full_recompute")) or 0.0)
    case.fields = dict(selective.fields, remat="full", sp=False)
    if not case.published_step_s:
        case.reason = "no full-recompute iteration time"
    return case
