"""The training rows of ../shared/tables/more-published.md as fidelity cases
(scripts/fidelity.py prices them; scripts/fidelity_families.py says how their frameworks
run).

What each row states goes into its run fields; where the source is silent, one rule per
section (below), never a per-row choice:

Section 1, BLOOM-176B (BigScience tr11, Megatron-DeepSpeed, Jean Zay A100-80GB):
- Model dims per row (hidden, layers, heads); vocab 250,880 (padded), seq 2048, GeLU MLP of
  4h, LayerNorm, tied embeddings. BLOOM uses ALiBi; the rows run learned positions instead:
  ALiBi adds a [heads, 1, S] bias to the scores the unfused softmax reads anyway and drops
  the [S, h] position table, a negligible cost difference either way.
- Rows without NHEADS (the 02-20 sweep) take 64: the author's note "all NHEADS=64 (above
  too)" (chronicles-prequel.md, "Final round comparison").
- Full activation recompute (--checkpoint-activations: the production script, and the
  TFLOPs formula counts the recompute). ZeRO stage 1 unless the row states 0: the sweep's
  default (line 669, ZS=1, repeats line 608's 37 GB) and the production BF16_Optimizer
  ("implements its own ZeRO Stage 1", tr11 README).
- fp16 before 02-28, bf16 from then on and in the explicit bf16 rows: both run bf16 GEMMs
  at the same A100 tensor rate (datasheet: 312 TFLOP/s dense for FP16 and BF16). The
  optimizers differ (DeepSpeed's fp16 ZeRO-1 vs its BF16_Optimizer): the bf16 rows are
  era megatron-deepspeed-2022-bf16, the same family.
- Network: "8 GPUs per node ..., 4 OmniPath links" (tr11 README): 400 Gb/s of links per
  8-GPU node, of which all-reduce reached 135 Gb/s (measured by the run's engineer, 2021
  and 2022: JEAN_ZAY_OPA_MEASURED below); priced as measured, nic_bandwidth=18.75Gb/s per
  GPU on the a100-80gb-sxm spec (whose default is DGX A100's 200 Gb/s HDR per GPU).
- Not rebuildable: OOM rows and rows with no Sec/it; the CUDA_LAUNCH_BLOCKING hang-debug
  rows (TFLOP/s only); lines 669-670 (the ZeRO-stage table's Sec/it and TFLOPs columns are
  inconsistent: 669 repeats 608 with them exchanged); the degraded-node production line
  (measured on a faulty node; Flint prices healthy hardware).

Section 2, InternEvo 7B (InternLM-7B: 32 layers, hidden 4096, 32 heads, FFN 11008, SwiGLU,
RMSNorm, RoPE, vocab 103168, untied):
- Each micro-batch is micro_bsz sequences of 2048 tokens (packed buffers of micro_bsz x
  2048 tokens; with pack_sample_into_one=False attention stops at document boundaries,
  so the real attention work can only be smaller); global batch = DP x micro_bsz x
  micro_num with DP = GPUs / TP; recompute full when act_ckpt is True, else none; bf16.
- ZeRO: `zero1=-1` shards the optimizer state over all DP ranks: zero 1. `zero1=8` (and 4
  with TP 2) shards it within a node and keeps a replica per node: zero 1 with hsdp 8 (4),
  the shard group the row states. How InternEvo moves the data (gradients all-reduced
  over every DP rank, overlap_sync_grad=True; each owner broadcasting its parameters
  after the step, overlap_sync_param=False; configs/7B_sft.py) is the framework's, a
  mechanism of its era (zero_sync broadcast), not a row field.
- Network: "4 x 100 Gb RoCE between machines" per 8-GPU node: nic_bandwidth=50Gb/s.

Section 3, MT-NLG 530B (arXiv 2201.11990 via llm-analysis): 105 layers, hidden 20480, 128
heads, FFN 81920, vocab 50272, seq 2048, GBS 1920, TP8 x PP35; micro-batch 1 (not stated;
Korthikanti's 530B row runs 1); full recompute and fp16 as the table assumes; Selene DGX
A100 80GB with HDR InfiniBand (the a100-80gb-sxm spec as it is).

Section 4 (nccl-tests curves) holds no training rows: scripts/compare_nccl.py reads it.
"""
from __future__ import annotations

import re
from pathlib import Path

from flint.hardware_models.network import DEFAULT_BUS_EFFICIENCY

from fidelity_families import Case
from fidelity_sections import family_name
from published_rows import REPO
from table_columns import first_number, tables

MORE_TABLE = REPO.parent / "shared" / "tables" / "more-published.md"
A100 = "a100-80gb-sxm"
# 4 x 100 Gb/s links per 8-GPU node (InternEvo's train_performance.md: RoCE)
FOUR_100G_PER_NODE = ("nic_bandwidth=50Gb/s",)
# Jean Zay's Omni-Path fabric as measured, not its 4 x 100 Gb/s of links per node: "@Stas
# measured allreduce bandwidth between two nodes as ~135Gbps ... the theoretical max =
# 400Gbps" (bigscience-workshop/bigscience, BigScience's experiments notes, 2021), and of
# BLOOM's own run, "I used this technology at JeanZay HPC in France in 2022. It was only
# 135Gbps and while the vendor tried to fix it a year later it was still the same speed"
# (stas00/ml-engineering, network/README.md, 'Omni-Path'). 135 Gb/s per 8-GPU node is
# 16.875 Gb/s per GPU achieved; Flint's NIC figure is a line rate of which collectives
# achieve the scale-out bus efficiency (hardware_models/network.py, 0.90): 18.75 Gb/s.
JEAN_ZAY_OPA_MEASURED = (
    f"nic_bandwidth={135 / 8 / DEFAULT_BUS_EFFICIENCY['scale_out']:g}Gb/s",)
BLOOM_VOCAB, BLOOM_HEADS_DEFAULT = 250880, 64
INTERNLM_7B = {"name": "internlm-7b", "layers": 32, "hidden": 4096, "heads": 32,
               "ffn": 11008, "vocab": 103168, "seq": 2048, "norm": "rms",
               "activation": "swiglu", "positional": "rope", "tie_embeddings": False}
MT_NLG = {"name": "mt-nlg-530b", "layers": 105, "hidden": 20480, "heads": 128, "ffn": 81920,
          "vocab": 50272, "seq": 2048, "norm": "layer", "activation": "gelu",
          "positional": "learned", "tie_embeddings": True}


def bloom_model(hidden: int, layers: int, heads: int) -> dict:
    return {"name": "bloom-tr11", "layers": layers, "hidden": hidden, "heads": heads,
            "ffn": 4 * hidden, "vocab": BLOOM_VOCAB, "seq": 2048, "norm": "layer",
            "activation": "gelu", "positional": "learned", "tie_embeddings": True}


def more_cases(path: Path = MORE_TABLE) -> list[Case]:
    """Every training row of more-published.md, in table order."""
    out: list[Case] = []
    for heading, records in tables(path):
        section = heading.split(".")[0].strip()
        if not records:
            continue
        cols = set(records[0])
        if section == "1" and "phase" in cols:
            out += [_bloom_production(k, r) for k, r in enumerate(records)]
        elif section == "1" and "date" in cols:
            out += [_bloom_sweep(r) for r in records]
        elif section == "2":
            out += [_internevo(k, r) for k, r in enumerate(records)]
        elif section == "3":
            out += [_mt_nlg(k, r) for k, r in enumerate(records)]
    return out


BLOOM_FAMILY = family_name("more", "1", "BigScience tr11", "megatron-deepspeed-2022", "A100")


def _bloom_case(label: str, r: dict, hidden: int, layers: int, heads: int, zero: int,
                group: str, bf16: bool) -> Case:
    gpus, tp, pp = (int(first_number(r.get(c)) or 0) for c in ("gpus", "tp", "pp"))
    dp, mbs, gbs = (int(first_number(r.get(c)) or 0) for c in ("dp", "mbs", "gbs"))
    # fp16 rows ran DeepSpeed's fp16 ZeRO optimizer, bf16 rows its BF16_Optimizer
    era = "megatron-deepspeed-2022-bf16" if bf16 else "megatron-deepspeed-2022"
    case = Case(label, "more-published", "1", BLOOM_FAMILY, era,
                what_if=JEAN_ZAY_OPA_MEASURED, group=group)
    if dp * tp * pp != gpus:
        case.reason = f"DP {dp} x TP {tp} x PP {pp} is not the {gpus} GPUs of the row"
        return case
    case.fields = {"model": bloom_model(hidden, layers, heads), "devices": gpus,
                   "seq_len": 2048, "hardware": A100, "tp": tp, "pp": pp, "micro_batch": mbs,
                   "global_batch": gbs, "remat": "full", "zero": zero}
    return case


def _bloom_production(k: int, r: dict) -> Case:
    phase = str(r.get("phase", ""))
    label = f"1-P{k + 1} production {phase}"
    case = _bloom_case(label, r, 14336, 70, 112, 1, "14336x70x112", bf16=True)
    if "degraded" in phase:
        case.reason = "measured with a degraded node (the log says so); Flint prices " \
                      "healthy hardware"
    case.published_step_s = first_number(r.get("sec_per_it")) or 0.0
    return case


def _bloom_sweep(r: dict) -> Case:
    line = str(r.get("line", "")).strip()
    heads = first_number(r.get("heads"))
    hidden, layers = int(first_number(r.get("hidden"))), int(first_number(r.get("layers")))
    heads = int(heads) if heads else BLOOM_HEADS_DEFAULT
    zero = first_number(r.get("zero"))
    label = f"1-L{line} {r.get('date')} {r.get('size')} h{hidden} L{layers} a{heads} " \
            f"tp{r.get('tp')} pp{r.get('pp')} dp{r.get('dp')} mbs{r.get('mbs')} " \
            f"gbs{r.get('gbs')}"
    # the table's note: fp16 before 02-28, bf16 from then on and in the "bf16" sections
    bf16 = "bf16" in str(r.get("section", "")).lower() or str(r.get("date", "")) >= "02-28"
    case = _bloom_case(label, r, hidden, layers, heads, int(zero) if zero is not None else 1,
                       f"{hidden}x{layers}x{heads}", bf16)
    step = first_number(r.get("sec_per_it"))
    mem = str(r.get("mem") or "")
    if str(r.get("cuda_launch_blocking") or "").strip():
        case.reason = "hang-debug table (CUDA_LAUNCH_BLOCKING runs): TFLOP/s only, no Sec/it"
    elif line in ("669", "670"):
        case.reason = "the ZeRO-stage table's Sec/it and TFLOPs columns are inconsistent " \
                      "(line 669 repeats line 608 with them exchanged)"
    elif "oom" in mem.lower():
        case.reason = "OOM in the source: no step time"
    elif not step:
        case.reason = "no Sec/it published"
    case.published_step_s = step or 0.0
    return case


INTERNEVO_FAMILY = family_name("more", "2", "InternEvo train_performance", "internevo",
                               "A100")


def _internevo(k: int, r: dict) -> Case:
    tp, gpus = int(first_number(r["tp"])), int(first_number(r["n_gpus"]))
    mbs, num = int(first_number(r["micro_bsz"])), int(first_number(r["micro_num"]))
    zero1 = re.search(r"zero1=(-?\d+)", str(r.get("parallel", "")))
    ckpt = str(r.get("act_ckpt", "")).strip().lower() == "true"
    label = f"2#{k + 1} {r.get('table')} tp{tp} zero1={zero1.group(1) if zero1 else '?'} " \
            f"{gpus} GPUs mbs{mbs}x{num}{' ckpt' if ckpt else ''}"
    case = Case(label, "more-published", "2", INTERNEVO_FAMILY, "internevo",
                what_if=FOUR_100G_PER_NODE,
                published_step_s=first_number(r.get("derived_step_s")) or 0.0)
    dp = gpus // tp
    case.fields = {"model": INTERNLM_7B, "devices": gpus, "seq_len": 2048, "hardware": A100,
                   "tp": tp, "micro_batch": mbs, "global_batch": dp * mbs * num,
                   "remat": "full" if ckpt else "none", "zero": 1}
    if zero1 and int(zero1.group(1)) > 0:           # the optimizer's shard group
        case.fields["hsdp"] = min(int(zero1.group(1)), dp)
    if not case.published_step_s:
        case.reason = "no TGS published"
    return case


MT_NLG_FAMILY = family_name("more", "3", "MT-NLG", "megatron-deepspeed-2021", "A100")


def _mt_nlg(k: int, r: dict) -> Case:
    gpus, tp, pp = (int(first_number(r[c])) for c in ("gpus", "tp", "pp"))
    label = f"3#{k + 1} MT-NLG 530B {gpus} GPUs tp{tp} pp{pp} dp{r.get('dp')}"
    case = Case(label, "more-published", "3", MT_NLG_FAMILY, "megatron-deepspeed-2021",
                published_step_s=first_number(r.get("iter_time_s")) or 0.0)
    case.fields = {"model": MT_NLG, "devices": gpus, "seq_len": 2048, "hardware": A100,
                   "tp": tp, "pp": pp, "micro_batch": 1,
                   "global_batch": int(first_number(r["gbs"])), "remat": "full"}
    return case
