"""How much of FSDP's all-gather time overlaps compute: PyTorch FSDP2 vs JAX (XLA) FSDP.

    python scripts/bench_fsdp_overlap.py [--layers 4] [--devices 64] [--hardware h100-sxm]

The Llama-3-8B-shaped zoo model (a few layers, sequence 2048, one sequence per rank) with
every parameter sharded over `fsdp` ranks, extracted twice: the torch twin (FSDP2
`fully_shard`, make_fx under fake tensors) and the JAX step (XLA SPMD, compile-only
GPUs). Each is estimated; the share of all-gather time during which the compute stream
is busy is printed for the torch graph without FSDP2's prefetch streams (all-gathers
issued in program order, as before), with them (FSDP2's all-gather stream, one all-gather
ahead), and for XLA's own schedule.
"""
from __future__ import annotations

import argparse
import os
import sys


def overlap_fraction(graph, estimate, kind: str = "all-gather") -> tuple[float, float]:
    """(all-gather seconds, share of them with device 0's compute stream busy)."""
    tl = estimate.timeline
    busy = sorted((s, f) for s, f, st, d in zip(tl.start, tl.finish, tl.stream, tl.device)
                  if st == "compute" and d == 0 and f > s)
    merged: list[list[float]] = []
    for s, f in busy:
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], f)
        else:
            merged.append([s, f])
    total = covered = 0.0
    for node, s, f, d in zip(tl.graph.nodes, tl.start, tl.finish, tl.device):
        c = node.collective
        if c is None or c.type != kind or d != 0 or f <= s:
            continue
        total += f - s
        covered += sum(max(0.0, min(f, hi) - max(s, lo)) for lo, hi in merged)
    return total, (covered / total if total else 0.0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--devices", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--hardware", default="h100-sxm")
    args = ap.parse_args()
    os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
    import copy

    import flint.torch as ft
    from flint.hardware_models.estimate import estimate
    from flint.template_cache import extract_program

    n, hw = args.devices, args.hardware
    torch_graph = ft.zoo("llama3-8b", n, f"fsdp={n}", layers=args.layers,
                         seq_len=args.seq_len, hardware=hw)
    in_order = copy.deepcopy(torch_graph)
    for node in in_order.nodes:
        node.meta.pop("stream", None)
    jax_graph = extract_program({"framework": "jax", "model": "llama3-8b", "devices": n,
                                 "mesh": [["fsdp", n]], "batch_per_replica": 1,
                                 "remat": "none", "sequence_parallel": False, "scan": False,
                                 "seq_len": args.seq_len, "layers": args.layers,
                                 "hardware": hw})
    print(f"llama3-8b shape, {args.layers} layers, seq {args.seq_len}, FSDP over {n} "
          f"ranks, {hw}")
    print(f"{'graph':<44}{'all-gather':>12}{'overlapped':>12}{'step':>12}")
    for label, g in (("torch FSDP2, all-gathers in program order", in_order),
                     ("torch FSDP2, prefetch on its all-gather stream", torch_graph),
                     ("JAX FSDP (XLA schedule)", jax_graph)):
        e = estimate(g, hw)
        total, share = overlap_fraction(g, e)
        print(f"{label:<44}{total * 1e3:>9.2f} ms{100 * share:>11.1f}%"
              f"{e.step_time_s * 1e3:>9.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
