"""The rows of ../shared/tables/published.md (or a table in its form) and the configuration
each one states: model, system, precision, parallelism, sharding and recompute as a row
names them, the parsing half of scripts/compare_published.py (whose docstring lists the
assumptions used where a row is silent), shared with scripts/published_moe.py. Reading the
tables and their column names: scripts/table_columns.py."""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from published_maxtext import maxtext_2023, maxtext_offload, no_collective_matmul  # noqa: E402
from table_columns import (WORD_COLUMNS, first_number, published_step,  # noqa: E402
                           stated_sharding)

TABLE = REPO.parent / "shared" / "tables" / "published.md"
WITHIN = 0.10
MOE = re.compile(r"deepseek|qwen3|kimi|gpt.?oss|mixtral|nemotron_3|nemotron v3|llama4|a3b|"
                 r"a22b|moe", re.I)
MODELS = [  # (regex on the row's model name, preset)
    (r"llama3\.1[-_ ]?405b|llama3[-_ ]405b|^405b$", "llama3.1-405b"),
    (r"llama3(\.1)?[-_ ]?70b", "llama3-70b"), (r"llama3(\.1)?[-_ ]?8b|^8b$", "llama3-8b"),
    (r"llama2[-_ ]?70b", "llama2-70b"), (r"llama2[-_ ]?13b", "llama2-13b"),
    (r"llama2[-_ ]?7b", "llama2-7b"), (r"gpt3[-_ ]?175b|^175b", "gpt3-175b"),
    (r"gpt3[-_ ]?5b", "gpt3-5b"), (r"gpt3[-_ ]?20b", "gpt3-20b"),
    (r"nemotron4?[-_ ]?340b", "nemotron-340b"), (r"nemotron[-_ ]?15b", "nemotron-15b"),
    (r"nemotron[-_ ]?22b", "nemotron-22b"), (r"nemotron[-_ ]?8b", "nemotron-8b"),
    (r"mistral[-_ ]?7b", "mistral-7b"), (r"^22b$", "gpt-22b"), (r"^530b", "gpt-530b"),
    (r"^1t$", "gpt-1t"),
]
SYSTEMS = {  # published system -> hardware spec (each spec names its compile target)
    "dgx-h100": "h100-sxm", "h100": "h100-sxm", "dgx-b200": "b200", "dgx-b300": "b300",
    "dgx-gb200": "gb200-nvl72", "dgx-gb300": "gb300-nvl72", "a100": "a100-80gb-sxm",
    "v5p": "tpu-v5p", "v5e": "tpu-v5e", "v4": "tpu-v4", "v6e": "tpu-v6e",
}
# a system named otherwise ("DGX A100 80GB", "8x H200 SXM", "MI300X", "DGX-2H", "GCP A3
# Mega"): the first of these tokens it contains (a V100 is a DGX-1's unless the system is a DGX-2); a PCIe
# card or a 40 GB A100 is another part, not these specs
SYSTEM_TOKENS = (("a3 mega", "a3-mega"), ("a3-mega", "a3-mega"), ("a3mega", "a3-mega"),
                 ("a3-megagpu", "a3-mega"), ("gb300", "gb300-nvl72"), ("gb200", "gb200-nvl72"), ("b300", "b300"),
                 ("b200", "b200"), ("h200", "h200"), ("h100", "h100-sxm"),
                 ("h800", "h800-sxm"), ("a100", "a100-80gb-sxm"), ("a800", "a800-80gb-sxm"),
                 ("mi300x", "mi300x"), ("mi325x", "mi325x"),
                 ("dgx-2h", "v100-dgx2h"), ("dgx2-h", "v100-dgx2h"), ("dgx2h", "v100-dgx2h"),
                 ("dgx-2", "v100-dgx2"), ("dgx2", "v100-dgx2"), ("v100", "v100-sxm2"))


def system_spec(system: str) -> str:
    """The hardware spec a published system names; "" when Flint has none for it."""
    text = system.lower()
    if text in SYSTEMS:
        return SYSTEMS[text]
    if "pcie" in text or ("nvl" in text and not re.search(r"gb[23]00", text)):
        return ""                       # PCIe cards and H100 NVL: other parts
    if "a100" in text and re.search(r"\b40\s*g", text):
        return "a100-40gb-sxm"
    if "a800" in text and re.search(r"\b40\s*g", text):
        return ""                       # the A800 40GB: another part
    for token, spec in SYSTEM_TOKENS:
        if re.search(rf"(?<![a-z0-9]){token}(?![0-9])", text):
            return spec
    tpu = re.search(r"\btpu[\s_-]*(v4|v5e|v5p|v6e)\b", text)   # "TPU v5p", "tpu-v5e"
    return f"tpu-{tpu.group(1)}" if tpu else ""


# FP16 (mixed precision with loss scaling, the A100-era default) runs its GEMMs at the
# BF16 tensor rate: the A100 and H100 datasheets list the same dense FP16 and BF16 figure
PRECISION = {"bf16": "bf16", "fp16": "bf16", "fp8": "fp8", "fp8-cs": "fp8", "mxfp8": "mxfp8",
             "fp8-mx": "mxfp8", "nvfp4": "nvfp4",
             # mixed-precision names of training frameworks (Composer's amp_*, Lightning's
             # *-mixed, dtype names): the GEMMs run in the half type
             "amp_bf16": "bf16", "bf16-mixed": "bf16", "bfloat16": "bf16",
             "amp_fp16": "bf16", "16-mixed": "bf16", "float16": "bf16", "amp_fp8": "fp8"}
# the model dims a row may state (tables of custom GPTs), flint.models.describe's keys
SHAPE_KEYS = ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab")


@dataclass
class Row:
    label: str
    reason: str = ""                  # why it cannot be rebuilt ("" = rebuildable)
    moe: bool = False
    model: str | tuple = ""           # a preset's name, or the dims the row states
    system: str = ""
    gpus: int = 0
    precision: str = "bf16"
    gbs: int = 0
    mbs: int = 1
    seq: int = 0
    tp: int = 1
    pp: int = 1
    cp: int = 1
    vp: int = 1
    fsdp: bool = False
    # what the row states of its data parallelism (stated_sharding): ZeRO stage, FSDP's
    # SHARD_GRAD_OP (parameters kept from forward to backward), HYBRID_SHARD (sharded
    # within a host, replicated across hosts); None: the table's silent default
    zero: int | None = None
    reshard_after_forward: bool = True
    hybrid: bool = False
    hsdp: int = 0                     # data-parallel ranks per FSDP shard group (0: all)
    # the data-parallel wrapper a row states (a `ddp` column): PyTorch's DDP overlaps its
    # bucketed all-reduces with the backward, Megatron's local DDP reduces after it; None:
    # not stated (the framework's era decides)
    overlap_grad_reduce: bool | None = None
    recompute_layers: int = 0         # remat full: this many blocks per stage (0: all)
    remat_stated: bool = False        # the row names its recompute (none is assumed then)
    remat: str = "selective"
    fp8_recipe: str = ""              # the FP8 scaling the table states ("": not stated)
    what_if: tuple = ()               # spec overrides the row's cluster states (TPU slices)
    # XLA's collective matmul as the row's config sets it (TrainingRun.collective_matmul)
    collective_matmul: str = "auto"
    # Megatron's TP communication overlap as the row's config sets it (a `tp_comm_overlap`
    # column: NeMo's ub_tp_comm_overlap); None: not stated (the framework's era decides)
    tp_comm_overlap: bool | None = None
    # LoRA fine-tuning (TrainingRun.lora_rank / lora_targets): 0 trains every weight
    lora_rank: int = 0
    lora_targets: str = ""
    lora_base: str = "bf16"
    published_step_s: float = 0.0
    result: dict = field(default_factory=dict)


def rows_of(heading: str, records: list[dict]) -> list[Row]:
    section = heading.split(".")[0]
    out = []
    for k, r in enumerate(records):
        label = f"{section}#{k + 1} " + " ".join(str(r.get(c, "")) for c in (
            "release", "version", "round", "model", "task", "system", "hw", "tpu", "gpus",
            "chips", "accelerators", "precision") if r.get(c))
        row = Row(label.strip())
        out.append(row)
        name = str(r.get("model", ""))
        if MOE.search(name) or section == "1g":     # 1g: the DeepSeek-V3 ladder
            row.moe, row.reason = True, "MoE model (not a dense decoder)"
            continue
        why = _not_rebuildable(section, r, name)
        if why:
            row.reason = why
            continue
        _fill(row, section, r, name)
    return out


# The LoRA adapters behind each table's LoRA rows, where the table is silent: the
# framework's default. Megatron-Bridge (1a): LoRA(dim=32, target_modules=['linear_qkv',
# 'linear_proj', 'linear_fc1', 'linear_fc2']) (src/megatron/bridge/peft/lora.py), which its
# llama3_70b_finetune_config(peft="lora") uses; NeMo 24.07 (1b, NeMo 1.x fine-tuning):
# lora_tuning target_modules ['attention_qkv'], adapter_dim 32
# (examples/nlp/language_modeling/tuning/conf/megatron_gpt_finetuning_config.yaml); MLPerf
# Llama 2 70B LoRA (6b): rank 16 on attention, as the section states from its configs,
# whose FP8 runs hold the frozen base in FP8 (conf/megatron_gpt_peft_tuning_config.yaml:
# `fp8_params: ${FP8}`, Transformer Engine's fp8_model_init); the others' defaults do not
LORA = {"1a": (32, "qkv,proj,fc1,fc2", "bf16"), "1b": (32, "qkv", "bf16"),
        "6b": (16, "attention", "fp8")}


def _not_rebuildable(section: str, r: dict, name: str) -> str:
    if _is_lora(section, r) and section not in LORA and not (
            first_number(r.get("lora_rank")) and r.get("lora_targets")):
        return ("LoRA fine-tuning with adapters the table does not state (a row states "
                "them in lora_rank and lora_targets columns)")
    if section in ("1d",):
        return "TFLOP/s only, and the non-CP configurations are not published"
    if section in ("1g", "2b", "2c", "2e"):
        return "published figure is TFLOP/s or MFU with an uncertain FLOP convention"
    if section == "5":
        return "no per-step configuration (batch ramp, pods, parallel blocks) is published"
    prec = str(r.get("precision", "")).lower()
    if prec.startswith("n/s"):
        return "precision not stated"
    hw = str(r.get("system") or r.get("tpu") or r.get("hw") or "").lower()
    if "int8" in str(r.get("config_name", "")).lower():
        return "int8-quantized training is not modelled"
    if section == "2d":
        if (first_number(r.get("slices")) or 1) > 1:
            return "multi-slice (DCN) job"
    if section != "2a" and not _preset(name, section) and not stated_shape(r, 2048) \
            and section != "6b":
        return f"no public dense shape for {name!r} in flint.models.describe"
    return ""


def _is_lora(section: str, r: dict) -> bool:
    """A LoRA fine-tuning row: its task says so, or its section is MLPerf's LoRA."""
    return "lora" in str(r.get("task", "")).lower() or section == "6b"


def _lora_targets(text) -> str:
    """A row's LoRA targets in Megatron's names ("linear_qkv linear_proj", NeMo's
    "attention_qkv" or "attention"); the run checks the words."""
    text = str(text).lower().replace("linear_", "").replace("attention_qkv", "qkv").replace(
        "attention_dense", "proj").replace("mlp_fc", "fc")
    words = (w.strip("[]'\" ") for w in re.split(r"[\s,;|/+]+", text))
    return ",".join(w for w in words if w)


def _preset(name: str, section: str) -> str:
    # "Llama 2 70B", "LLaMA-3.1-8B", "GPT-3 175B", "Nemotron-4 340B": the family name
    # joined to its version, as the patterns write it
    name = re.sub(r"(llama|gpt|nemotron)[-_ ]+(\d)", r"\1\2", name.strip(), flags=re.I)
    for rx, preset in MODELS:
        if re.search(rx, name, re.I):
            return preset
    # "GPT 39.1B", "gpt-1.7b", "145.6B": a Megatron GPT preset named by its size
    m = re.fullmatch(r"(?:gpt[-_ ]?)?(\d+(?:\.\d+)?)\s*b", name.strip().lower())
    from flint.models.describe import known_models

    size = m and {"529.6": "530", "1008": "1t", "1008.0": "1t"}.get(m.group(1), m.group(1))
    preset = size and (f"gpt-{size}" if size == "1t" else f"gpt-{size}b")
    return preset if preset in known_models() else ""


def stated_shape(r: dict, seq: int) -> tuple:
    """The model dims a row states in its own columns (layers, hidden, heads at least), as
    Megatron's GPT (LayerNorm, GeLU MLP of 4h, learned positions, vocab 51200) where the
    row is silent; () when it states none."""
    dims = {key: int(first_number(r[key])) for key in SHAPE_KEYS
            if first_number(r.get(key)) is not None}
    if not {"layers", "hidden", "heads"} <= dims.keys():
        return ()
    dims = {"kv_heads": dims["heads"], "ffn": 4 * dims["hidden"], "vocab": 51200,
            "norm": "layer", "activation": "gelu", "positional": "learned",
            "tie_embeddings": True, **dims, "seq": seq}
    return tuple(sorted(dims.items()))


def model_config(model):
    """The DecoderConfig of a row's model: a preset's name or the dims it states."""
    from flint.models.describe import resolve_model

    return resolve_model(dict(model) if isinstance(model, tuple) else model)


def _fill(row: Row, section: str, r: dict, name: str) -> None:
    num = lambda *cols, default=None: next(  # noqa: E731
        (first_number(r[c]) for c in cols if first_number(r.get(c)) is not None), default)
    row.model = _preset(name, section)
    if section == "6b":      # the section's one model (Llama 2 70B) at seq 8192
        row.model = "llama2-70b"
    system = str(r.get("system") or r.get("tpu") or r.get("hw") or "").lower()
    if not system:         # 1f: no system column; the README's script is the H100 one
        system = "dgx-h100"
    if section == "4":
        system = "a100"
        # the source: interleaved pipeline with 3 stages per rank for 175B and 530B
        row.vp = 3 if row.model in ("gpt3-175b", "gpt-530b") else 1
    if section in ("6b", "6c"):    # "512 GB200 (8x NVL72)" in the accelerators column
        acc = str(r.get("accelerators", "")).lower()
        system = next((f"dgx-{gpu}" for gpu in ("gb300", "gb200", "h200", "h100")
                       if gpu in acc), system)
    row.system = system
    # how the row's accelerator differs from the spec its system names, as its source
    # states it (spec overrides: "hbm_bandwidth=2.4TB/s; hbm_capacity=96GB")
    row.what_if = tuple(w.strip() for w in str(r.get("what_if") or "").split(";")
                        if w.strip())
    gpus = num("gpus", "chips", "accelerators")
    if gpus is None:
        row.reason = "no GPU count in the row"
        return
    row.gpus = int(gpus)
    # 6c: "seq 8192" is stated in the section heading, not per row
    seq = num("seq", "packed_seq", default=8192 if section in ("6b", "6c") else None)
    gbs = num("gbs", "gbs_seqs")
    if seq is None or gbs is None:
        row.reason = "no sequence length or global batch in the row"
        return
    row.gbs = int(gbs)
    row.mbs = int(num("mbs", "per_device_batch", default=1))
    row.seq = int(seq)
    row.model = row.model or stated_shape(r, row.seq)    # a preset's name wins
    row.tp, row.pp = int(num("tp", default=1)), int(num("pp", default=1))
    row.cp = int(num("cp", default=1))
    row.vp = row.vp if section == "4" else int(num("vp", default=1))
    # word columns: what the row's config says of an overlap (a word it does not know is
    # one reason, not a guess)
    for column, meanings, name, refusal in WORD_COLUMNS:
        word = str(r.get(column) or "").strip().lower()
        if word and meanings.get(word) is None:
            row.reason = refusal.format(repr(word))
            return
        if word:
            setattr(row, name, meanings[word])
    row.fsdp = (num("fsdp", default=0) or 0) > 0
    stated = stated_sharding(r)
    for key, value in stated.items():
        setattr(row, key, value)
    row.fsdp = row.fsdp or stated.get("zero") == 3
    # 1c's tables without a precision column are the 25.04/25.07 pages, which say "FP8
    # current scaling"; 1b's page and 1f's README say FP8 and nothing of the scaling
    prec = str(r.get("precision") or ("FP8-CS" if section == "1c" else
                                      "FP8" if section in ("1b", "1f") else "BF16"))
    row.precision = PRECISION.get(prec.split()[0].lower().replace("_hybrid", ""), "")
    if row.precision == "fp8" and prec.split()[0].lower() == "fp8-cs":
        row.fp8_recipe = "current"
    if not row.precision:
        row.reason = f"precision {prec!r} not modelled"
    # the recompute a row states, under the column names tables use for it
    stated = " ".join(str(r.get(c) or "") for c in (
        "remat", "recompute", "activation_recompute", "activation_checkpointing", "ac",
        "activation_checkpoint", "gradient_checkpointing")).lower()
    row.remat_stated = bool(stated.strip())
    if re.search(r"selective[\s_-]*layer|every (second|2nd|other) (layer|block)", stated):
        # torchtitan's "selective layer" (ac_freq 2): every second block checkpointed
        layers = model_config(row.model).n_layers
        row.remat, row.recompute_layers = "full", max(1, layers // row.pp // 2)
    elif "full" in stated or re.search(r"^\s*(true|yes|on)\s*$", stated):
        row.remat = "full"         # a yes/no column checkpoints whole blocks
    elif re.search(r"^\s*minimal(_flash)?\s*$", stated):
        # MaxText's remat_policy minimal (the dots without batch dimensions saved) and
        # minimal_flash (those and the attention output): with a fused attention kernel
        # both keep what Flint's `dots` keeps (published_maxtext.maxtext_2023 says why)
        row.remat = "dots"
    elif re.search(r"\bnone\b|\bno\b|\boff\b|false", stated):
        row.remat = "none"
    if section == "2d":
        row.gbs = int(num("gbs_seqs"))
        row.fsdp = True
        row.remat = maxtext_offload(stated) or row.remat
        if no_collective_matmul(str(r.get("config_name", ""))):
            row.collective_matmul = "off"
    if section == "2a":
        maxtext_2023(row, r, system_spec(row.system))
    if _is_lora(section, r):   # the adapters the row states, else its framework's default
        rank, targets, base = LORA.get(section, (0, "", "bf16"))
        row.lora_rank = int(first_number(r.get("lora_rank")) or rank)
        row.lora_targets = _lora_targets(r["lora_targets"]) if r.get("lora_targets") \
            else targets
        row.lora_base = base if row.precision == "fp8" else "bf16"
    if section == "6b":          # "no activation checkpointing (v4.0 conf)"
        row.remat, row.remat_stated = "none", True
    row.published_step_s = published_step(r, row)
    if not row.published_step_s:
        row.reason = ("no step time, tokens/s or samples/s in the row (a TFLOP/s or MFU "
                      "figure's FLOP convention is not the table's to guess)")
        return
    spec = system_spec(system)
    if not spec:
        row.reason = f"no hardware spec for system {system!r}"
    elif spec.startswith("tpu") and not _have_libtpu():
        row.reason = "TPU target needs libtpu (pip install 'flint[tpu]'), not installed"


# the columns a table states its data-parallel flavour in: "sharding_strategy",
# "fsdp_mode", "zero_stage", "dp_type", "data_parallel", "strategy", ...
def _have_libtpu() -> bool:
    try:
        import libtpu  # noqa: F401
        return True
    except ImportError:
        return False


def print_not_rebuildable(rows, kind: str) -> list:
    """Print the rows that could not be rebuilt, grouped by reason; return them."""
    skipped = [r for r in rows if r.reason]
    print(f"\nnot rebuildable ({len(skipped)} {kind} rows):")
    reasons: dict[str, list[str]] = {}
    for r in skipped:
        reasons.setdefault(r.reason, []).append(r.label.split(" ")[0])
    for why, labels in sorted(reasons.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        print(f"  {len(labels):4d} rows: {why} ({', '.join(labels[:6])}"
              f"{', ...' if len(labels) > 6 else ''})")
    return skipped
