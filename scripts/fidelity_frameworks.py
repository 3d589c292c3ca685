"""One model under two frameworks on one cluster: MT-NLG 530B as DeepSpeed's pipeline
engine ran it (more-published.md section 3) and as Megatron-LM ran it in Korthikanti et
al.'s full-recompute baseline (published.md 4#3: TP8 PP35, no sequence parallelism), both
on Selene's A100s. Their steps differ in GPUs and micro-batches, so each is brought to the
time of one micro-batch slot of the pipeline: step / (m + (p - 1) / v), with m micro-batches
per pipeline, p stages and v virtual stages (the 1F1B schedule's m slots plus its fill and
drain). The measured ratio of the two frameworks' slots against Flint's says how much of a
family's miss is the framework's own speed on the same model, which no kernel of the model
accounts for. A function of the priced cases of scripts/fidelity.py; returns (text, JSON)."""
from __future__ import annotations


def _slot(case, step_s: float) -> float:
    f = case.fields
    dp = f["devices"] // (f["tp"] * f["pp"])
    m = f["global_batch"] // (dp * f.get("micro_batch", 1))
    return step_s / (m + (f["pp"] - 1) / f.get("vp", 1))


def _priced(cases, keep) -> list:
    return [c for c in cases if keep(c) and not c.reason
            and c.predicted.get("after", {}).get("step_s")]


def same_model_table(cases) -> tuple[str, dict]:
    deepspeed = _priced(cases, lambda c: c.file == "more-published" and c.section == "3")
    megatron = _priced(cases, lambda c: c.file == "published" and c.section == "4"
                       and c.label.startswith("4#3") and "full-recompute" in c.label)
    if not deepspeed or not megatron:
        return "", {}
    base = megatron[0]
    base_measured = _slot(base, base.published_step_s)
    base_flint = _slot(base, base.predicted["after"]["step_s"])
    lines = ["", "MT-NLG 530B under two frameworks on Selene A100s: seconds per micro-batch "
             "slot, step / (m + (p - 1) / v)",
             f"{'run':46s} {'measured':>9s} {'Flint':>9s} {'measured/Megatron':>18s} "
             f"{'Flint/Megatron':>15s}"]
    rows = []
    for c in [base, *deepspeed]:
        measured = _slot(c, c.published_step_s)
        flint = _slot(c, c.predicted["after"]["step_s"])
        rows.append({"label": c.label, "measured_slot_s": measured, "flint_slot_s": flint,
                     "measured_ratio": measured / base_measured,
                     "flint_ratio": flint / base_flint})
        lines.append(f"{c.label[:46]:46s} {measured:>8.3f}s {flint:>8.3f}s "
                     f"{measured / base_measured:>17.2f}x {flint / base_flint:>14.2f}x")
    return "\n".join(lines), {"megatron": base.label, "rows": rows}
