"""Where a published row comes from: its table section's source and framework era, its
accelerator, and the family name (source section x framework x GPU) fidelity reports by.
The eras themselves, and what each one's framework does, are in fidelity_families."""
from __future__ import annotations

import re

from fidelity_eras import ERAS


def family_name(file: str, section: str, source: str, era: str, gpu: str) -> str:
    return f"{'published' if file == 'published' else 'more'} {section} {source} x " \
           f"{ERAS[era][0]} x {gpu}"


def section_of(section: str, heading: str) -> tuple[str, str]:
    """(source in words, era) of a published.md section: as listed below, else what its
    heading says of its framework (a table beyond the shared ones); a heading that names
    none is Megatron-Core's, as every NVIDIA table is."""
    if section in PUBLISHED_SECTIONS:
        return PUBLISHED_SECTIONS[section]
    text = heading.lower()
    source = re.sub(r"^[\w.]+\s*", "", heading.strip("# ")).split("(")[0].strip()[:24].strip()
    nvidia = re.search(r"megatron|nemo|nvidia", text)
    if re.search(r"shoeybi|1909\.08053", text):
        return source, "megatron-lm-2019"
    if re.search(r"narayanan|2104\.04473|megatron-lm[^|]*\b2021\b", text):
        return source, "megatron-lm-2021"
    if re.search(r"korthikanti|2205\.05198", text):
        return source, "megatron-lm-2022"
    # Megatron's layers inside DeepSpeed's PipelineEngine (Megatron-DeepSpeed, GPT-NeoX,
    # MT-NLG, BLOOM), by the year the heading states: 2021's (fp16, ZeRO stage 0 by
    # default) or 2022's; both before flash attention and sequence parallelism, which
    # Megatron-DeepSpeed added later as opt-in flags (--use-flash-attn, --sequence-parallel)
    if re.search(r"megatron[- ]deepspeed|gpt-neox|mt-nlg|\bbloom\b", text):
        years = [int(y) for y in re.findall(r"\b(20[12]\d)\b", text)]
        old = years and min(years) <= 2021
        return source, "megatron-deepspeed-2021" if old else "megatron-deepspeed-2022"
    if not nvidia and re.search(r"maxtext|\btpu\b|\bjax\b|\bxla\b", text):
        return source, "maxtext"
    if not nvidia and re.search(r"fsdp|torchtitan|pytorch|\bddp\b", text):
        return source, "pytorch-compile" if re.search(r"compile", text) else "pytorch"
    return source, "megatron-core"


# published.md: section -> (source in words, era)
PUBLISHED_SECTIONS = {
    "1a": ("Megatron-Bridge", "bridge-perf-recipes"), "1b": ("NeMo 24.07", "megatron-core"),
    # the rows priced are 25.02-25.07's (NeMo 2.0; 24.09's repeat 1b v3 and are not listed)
    "1c": ("NeMo docs 24.09-25.07", "nvidia-perf-recipes"),
    "1d": ("NeMo long-sequence", "megatron-core"),
    "1f": ("Megatron-LM examples", "megatron-core"),
    "1g": ("DeepSeek-V3 ladder", "megatron-core"), "1h": ("NeMo AutoModel", "automodel"),
    "2a": ("MaxText configs", "maxtext"), "2b": ("MaxText README", "maxtext"),
    "2c": ("MaxText tiering", "maxtext"), "2d": ("tpu-recipes", "maxtext"),
    "2e": ("MaxText A3", "maxtext"), "4": ("Korthikanti 2022", "megatron-lm-2022"),
    "5": ("PaLM Table 3", "pathways"), "6b": ("MLPerf LoRA", "megatron-core"),
    "6c": ("MLPerf v5.1", "megatron-core"),
}
# accelerator names as the tables spell them, most specific first
GPUS = (("gb300", "GB300"), ("gb200", "GB200"), ("b300", "B300"), ("b200", "B200"),
        ("h200", "H200"), ("h100", "H100"), ("h800", "H800"), ("a100", "A100"),
        ("a800", "A800"), ("v100", "V100"),
        ("mi325x", "MI325X"), ("mi300x", "MI300X"),
        ("v6e", "TPU v6e"), ("v5p", "TPU v5p"), ("v5e", "TPU v5e"), ("v4", "TPU v4"),
        ("tpu v3", "TPU v3"))
# accelerators a section states in its prose rather than its rows
SECTION_GPU = {"1f": "H100", "1g": "GB200", "1h": "H100", "2e": "H100", "4": "A100"}


def gpu_of(record: dict, section: str, block: int = 0) -> str:
    if section == "1d":         # prose: the first table ran on DGX-H100, the second on B200
        return ("H100", "B200")[min(block, 1)]
    if section in SECTION_GPU:
        return SECTION_GPU[section]
    for col in ("system", "hw", "tpu", "accelerators", "hardware", "model"):
        text = str(record.get(col) or "").lower()
        for token, name in GPUS:
            if re.search(rf"(?<![a-z0-9]){re.escape(token)}(?![0-9])", text):
                return name
    return "unstated"
