"""PyTorch FSDP runs published with their step throughput, against Flint's torch frameworks.

The shared tables hold no PyTorch family (scripts/fidelity.py: M16/M17 untested), so this
script checks the torch-eager population on two public tables. None of their figures sets
a constant of the model; they are read after the mechanisms were built from the
frameworks' source (SDPA's FlashAttention-2, torchtitan's selective op policy, FSDP2).

- torchtitan docs/performance.md @04133643: Llama 3 8B/70B (seq 8192, local batch 1) and
  Llama 2 13B/70B (seq 4096, local batch 1-2) with FSDP2 on 64 A100 80GB; WPS (tokens/s
  per GPU). Step = local batch x seq / WPS. Activation checkpointing: "selective op" is
  torchtitan's op policy (Flint's `selective` for the torch frameworks), "selective layer"
  checkpoints every second block (`remat full` with half the layers recomputed), "full",
  "no".
- mosaicml/llm-foundry scripts/train/benchmarking/README.md @061f2c7c: MPT models, FSDP
  FULL_SHARD, amp_bf16 (PURE: bf16 parameters), on H100 80GB and A100 80GB. Step = global
  batch tokens / throughput (tokens/s). MPT dims from llm-foundry's yamls (d_model,
  n_heads, n_layers; MLP 4x with GELU, LayerNorm, vocab 50368); ALiBi is priced as learned
  positions (a bias the fused kernel adds per score: no GEMM or pass of its own).

    python scripts/compare_pytorch.py [--json]
"""
from __future__ import annotations

import argparse
import json
import statistics

# (d_model, n_layers, n_heads) of llm-foundry's MPT yamls
MPT = {"125m": (768, 12, 12), "1b": (2048, 24, 16), "3b": (2560, 32, 20),
       "7b": (4096, 32, 32), "13b": (5120, 40, 40), "30b": (7168, 48, 64),
       "70b": (8192, 80, 64)}
# model, seq, gpus, local batch, global batch (sequences), AC, tokens/s per GPU (WPS)
TORCHTITAN = (
    ("llama3-8b", 8192, 64, 1, 64, "selective layer", 2904),
    ("llama3-8b", 8192, 64, 1, 64, "selective op", 2973),
    ("llama3-70b", 8192, 64, 1, 64, "full", 331),
    ("llama2-13b", 4096, 64, 2, 128, "no", 2162),
    ("llama2-13b", 4096, 64, 2, 128, "selective layer", 1914),
    ("llama2-13b", 4096, 64, 2, 128, "selective op", 1904),
    ("llama2-70b", 4096, 64, 1, 64, "selective op", 355),
    ("llama2-70b", 4096, 64, 2, 128, "full", 353),
)
# model, seq, gpus, micro batch, global batch (sequences), activation checkpointing,
# throughput (tokens/s, all GPUs), hardware
LLM_FOUNDRY = (
    ("7b", 2048, 8, 6, 48, False, 85144, "h100-sxm"),
    ("1b", 2048, 8, 14, 112, False, 363645, "h100-sxm"),
    ("3b", 2048, 16, 10, 480, False, 386285, "h100-sxm"),
    ("13b", 2048, 8, 2, 16, False, 38336, "h100-sxm"),
    ("13b", 4096, 8, 10, 240, True, 37740, "h100-sxm"),
    ("30b", 2048, 32, 14, 1344, True, 73860, "h100-sxm"),
    ("70b", 2048, 64, 8, 2048, True, 66523, "h100-sxm"),
    ("7b", 8192, 8, 8, 128, True, 55481, "h100-sxm"),
    ("7b", 2048, 8, 6, 96, False, 37130, "a100-80gb-sxm"),
    ("13b", 2048, 8, 2, 48, False, 18097, "a100-80gb-sxm"),
    ("3b", 2048, 8, 10, 160, False, 86491, "a100-80gb-sxm"),
    ("1b", 2048, 8, 14, 448, False, 164109, "a100-80gb-sxm"),
    ("30b", 2048, 8, 3, 504, True, 7330, "a100-80gb-sxm"),
    ("7b", 16384, 8, 4, 64, True, 19629, "a100-80gb-sxm"),
)


def torchtitan_rows():
    for model, seq, gpus, local, gbs, ac, wps in TORCHTITAN:
        layers = {"llama3-8b": 32, "llama2-13b": 40}.get(model, 80)
        remat = {"no": {"remat": "none"}, "full": {"remat": "full"},
                 "selective op": {"remat": "selective"},
                 "selective layer": {"remat": "full", "recompute_layers": layers // 2}}[ac]
        fields = dict(model=model, seq_len=seq, devices=gpus, micro_batch=local,
                      global_batch=gbs, zero=3, hardware="a100-80gb-sxm", **remat)
        yield (f"torchtitan {model} seq {seq} batch {local} AC {ac}", "torchtitan x A100",
               fields, local * seq / wps)


def llm_foundry_rows():
    for name, seq, gpus, mb, gbs, ac, tput, hw in LLM_FOUNDRY:
        d, layers, heads = MPT[name]
        model = (("layers", layers), ("hidden", d), ("heads", heads), ("kv_heads", heads),
                 ("ffn", 4 * d), ("vocab", 50368), ("seq", seq), ("norm", "layer"),
                 ("activation", "gelu"), ("positional", "learned"))
        fields = dict(model=model, seq_len=seq, devices=gpus, micro_batch=mb, global_batch=gbs,
                      zero=3, hardware=hw, remat="full" if ac else "none")
        gpu = "H100" if hw.startswith("h100") else "A100"
        yield (f"llm-foundry MPT-{name} seq {seq} {gpus}x {gpu} AC {'on' if ac else 'off'}",
               f"llm-foundry x {gpu}", fields, gbs * seq / tput)


def main() -> None:
    from flint.engine import predict
    from flint.run import TrainingRun

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows, rows_list = [], list(torchtitan_rows()) + list(llm_foundry_rows())
    for i, (label, family, fields, published) in enumerate(rows_list):
        p = predict(TrainingRun(framework="torch-eager", **fields))
        rows.append({"row": label, "family": family, "published_step_s": published,
                     "predicted_step_s": p.step_time_s, "mfu": p.mfu,
                     "memory_gib": p.memory_bytes / 2**30, "oom": p.oom,
                     "error": p.step_time_s / published - 1})
        if not args.json:
            print(f"[{i + 1}/{len(rows_list)}] {label:58s} published {published:8.3f} s  "
                  f"Flint {p.step_time_s:8.3f} s  {100 * rows[-1]['error']:+6.1f} %  "
                  f"MFU {100 * p.mfu:4.1f} %  {rows[-1]['memory_gib']:6.1f} GiB"
                  f"{'  OOM' if p.oom else ''}", flush=True)
    families = {}
    for r in rows:
        families.setdefault(r["family"], []).append(r["error"])
    summary = {f: {"rows": len(e), "median_signed": statistics.median(e),
                   "median_abs": statistics.median(abs(x) for x in e),
                   "within_10": sum(abs(x) <= 0.10 for x in e),
                   "within_15": sum(abs(x) <= 0.15 for x in e)} for f, e in families.items()}
    if args.json:
        print(json.dumps({"rows": rows, "families": summary}, indent=1))
        return
    print(f"\n{'family':26s} rows  median  |median|  <=10%  <=15%")
    for f, s in summary.items():
        print(f"{f:26s} {s['rows']:4d}  {100 * s['median_signed']:+5.1f} %  "
              f"{100 * s['median_abs']:5.1f} %   {s['within_10']:2d}/{s['rows']:<2d}  "
              f"{s['within_15']:2d}/{s['rows']}")


if __name__ == "__main__":
    main()
