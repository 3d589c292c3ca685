"""Pipeline bubble of GPipe, 1F1B and interleaved 1F1B against the closed form.

    python scripts/check_bubble.py [--hardware h100-sxm]

A model of identical layers (no embedding or head: the setting of the closed form), each
forward layer one 1e14-FLOP GEMM and its backward twice that, split into p stages (v
chunks each when interleaved) and run for m microbatches through `PipelineParallel`; the
estimate's schedule bubble (compute idle inside the pipelined part when communication
is free, averaged over devices) over the ideal time (a device's F+B work) is set against
(p-1)/(v*m) (GPipe: Huang et al. 2019; 1F1B: Narayanan et al. 2021; interleaved:
Narayanan et al., SC'21, section 2.2), and the communication wait (SEND/RECV of
activations and gradients on the link each stage boundary crosses) beside it.
Exit 1 when any row is more than 1 point (absolute) away from the closed form.
"""
from __future__ import annotations

import argparse
import sys

def uniform_model(layers: int):
    from flint.cluster import Cluster
    from flint.models.synthetic import uniform_layers

    return uniform_layers(layers, Cluster(8, (("model", 8),), "h100-sxm"), "bf16[4,2048,4096]")


CASES = [("gpipe", 4, 16, 1), ("gpipe", 8, 32, 1), ("1f1b", 4, 16, 1), ("1f1b", 8, 32, 1),
         ("1f1b", 16, 64, 1), ("interleaved", 4, 16, 2), ("interleaved", 8, 32, 2),
         ("interleaved", 4, 16, 4), ("interleaved", 2, 48, 2)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hardware", default="h100-sxm")
    args = ap.parse_args()
    from flint.hardware_models.estimate import estimate
    from flint.passes.pipeline import PipelineParallel

    print(f"{'schedule':<12}{'p':>4}{'m':>5}{'v':>3}{'bubble/ideal':>14}{'(p-1)/(vm)':>12}"
          f"{'diff':>10}{'bubble/step':>13}{'comm wait':>11}{'pipelined':>11}")
    worst = 0.0
    for schedule, p, m, v in CASES:
        layers = 2 * p * v
        piped = PipelineParallel(p, m, schedule, v).run(uniform_model(layers))
        pipe = estimate(piped, args.hardware).pipeline
        got, closed = pipe["bubble_over_ideal"], (p - 1) / (v * m)
        worst = max(worst, abs(got - closed))
        print(f"{schedule:<12}{p:>4}{m:>5}{v:>3}{100 * got:>13.2f}%{100 * closed:>11.2f}%"
              f"{100 * (got - closed):>+7.2f} pt{100 * pipe['bubble_fraction']:>12.2f}%"
              f"{100 * pipe['comm_wait_fraction']:>10.2f}%"
              f"{pipe['pipelined_s']:>9.2f} s")
    ok = worst <= 0.01
    print(f"largest distance from (p-1)/(v*m): {100 * worst:.2f} points (goal <= 1 point): "
          f"{'met' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
