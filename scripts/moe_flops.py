"""FLOPs of each MoE preset's extracted step vs a hand count (active parameters x tokens).

    python scripts/moe_flops.py [--models mixtral-8x7b,qwen3-30b-a3b,deepseek-v3,gpt-oss-120b]

Each preset is extracted for one compile-only device (host CPU by default) with a few
layers (`--layers`; DeepSeek-V3 keeps one leading dense layer), batch 2 x seq 4096, no
activation recompute, and the graph's executed FLOPs (HLO cost of every node; the fused attention nodes count the causal half,
backward (3 d_qk + 2 d_v) / (d_qk + d_v) x forward) are compared with a count written out here by hand from the public
configuration, independent of flint.models.moe:

    hand = 6 x active matmul weights x tokens + attention
    active = per layer: attention projections + router (d x E) + (top_k + shared) x 3 d f
             (dense layers: 3 d ffn), plus the LM head (d x vocab)
    attention = tokens x layers x heads x (seq / 2) x 2 x ((d_qk + d_v) + (3 d_qk + 2 d_v))

(forward QK^T over d_qk and PV over d_v; backward 3 GEMMs over d_qk and 2 over d_v, 2.5x
the forward when they are equal). MLA runs d_qk = 192, d_v = 128 for DeepSeek-V3, as
FlashAttention-3 and cuDNN do. What the hand count leaves out (norms, activations,
softmax, routing bookkeeping, AdamW's ~10 flops per parameter) is the difference.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# Public configurations (see flint.models.describe PRESETS for the sources):
# (layers_total, d, heads, kv_heads, head_dim, experts, top_k, moe_ffn, shared, vocab, mla)
HAND = {
    "mixtral-8x7b": dict(d=4096, h=32, kv=8, hd=128, e=8, k=2, f=14336, shared=0, vocab=32000),
    "qwen3-30b-a3b": dict(d=2048, h=32, kv=4, hd=128, e=128, k=8, f=768, shared=0,
                          vocab=151936),
    "gpt-oss-120b": dict(d=2880, h=64, kv=8, hd=64, e=128, k=4, f=2880, shared=0,
                         vocab=201088),
    "deepseek-v3": dict(d=7168, h=128, e=256, k=8, f=2048, shared=1, vocab=129280,
                        dense_ffn=18432, mla=(1536, 512, 128, 64, 128)),
}


def hand_count(name: str, layers: int, dense: int, tokens: int, seq: int) -> float:
    c = HAND[name]
    d, h = c["d"], c["h"]
    if "mla" in c:
        q_lora, kv_lora, nope, rope, v = c["mla"]
        attn_w = (d * q_lora + q_lora * h * (nope + rope) + d * (kv_lora + rope)
                  + kv_lora * h * (nope + v) + h * v * d)
        d_qk, d_v = nope + rope, v
    else:
        attn_w = 2 * d * h * c["hd"] + 2 * d * c["kv"] * c["hd"]
        d_qk = d_v = c["hd"]
    moe_w = d * c["e"] + (c["k"] + c["shared"]) * 3 * d * c["f"]
    dense_w = 3 * d * c.get("dense_ffn", 0)
    active = layers * attn_w + (layers - dense) * moe_w + dense * dense_w + d * c["vocab"]
    # causal score pairs x 2 flops per MAC x (forward QK^T + PV, backward 3 over d_qk and
    # 2 over d_v: FlashAttention-2's five GEMMs with S recomputed)
    attention = tokens * layers * h * (seq / 2) * 2 * ((d_qk + d_v) + (3 * d_qk + 2 * d_v))
    return 6 * active * tokens + attention


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(HAND))
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--hardware", default="cpu",
                    help="compile target; the default host-CPU target keeps XLA's GPU "
                         "memory-pressure rematerialization (one device holding every "
                         "expert) out of the count")
    args = ap.parse_args(argv)
    os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
    from flint.frontends.targets import prepare_environment

    prepare_environment()
    from flint.models.describe import resolve_model, to_mapping
    from flint.template_cache import extract_program

    print(f"{'model':16s} {'layers':>6s} {'tokens':>7s} {'graph TFLOP':>12s} "
          f"{'hand TFLOP':>11s} {'diff':>7s}")
    worst = 0.0
    for name in args.models.split(","):
        if name not in HAND:
            print(f"moe_flops: no hand count for {name!r}", file=sys.stderr)
            return 2
        dense = 1 if "dense_ffn" in HAND[name] else 0
        layers = args.layers + dense
        cfg = resolve_model(name).with_(n_layers=layers, first_dense=dense, seq_len=args.seq)
        graph = extract_program({"framework": "jax", "model": to_mapping(cfg), "devices": 1,
                                 "mesh": [["data", 1]], "batch_per_replica": args.batch,
                                 "remat": "none", "sequence_parallel": False, "scan": False,
                                 "seq_len": args.seq, "layers": layers,
                                 "hardware": args.hardware})
        tokens = args.batch * args.seq
        got = sum(n.flops * n.repeat for n in graph.nodes)
        want = hand_count(name, layers, dense, tokens, args.seq)
        diff = got / want - 1
        worst = max(worst, abs(diff))
        print(f"{name:16s} {layers:6d} {tokens:7d} {got / 1e12:12.2f} {want / 1e12:11.2f} "
              f"{diff * 100:+6.2f}%", flush=True)
    print(f"largest difference {worst * 100:.2f}% (goal <= 2%): "
          f"{'met' if worst <= 0.02 else 'MISSED'}")
    return 0 if worst <= 0.02 else 1


if __name__ == "__main__":
    sys.exit(main())
