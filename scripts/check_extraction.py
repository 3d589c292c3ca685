"""Print the extraction figures the test suite asserts, measured in one run.

- loop-free step: Flint's total flops vs XLA's `compiled.cost_analysis()["flops"]` (CPU);
- scanned step vs its unrolled twin (CPU and compile-only H100);
- pure data parallel MLP: gradient all-reduce bytes vs parameter bytes;
- Megatron TP MLP: all-reduces per layer, group size and mesh axis.

    python scripts/check_extraction.py
"""
from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from flint.frontends.jax import capture  # noqa: E402
from flint.models.train import build  # noqa: E402
from flint.graph import collective_size_bytes  # noqa: E402


def compiled(model, mesh, hardware, **kw):
    w = build(model, mesh, **kw)
    step = capture(w.step, devices=8, mesh=dict(mesh), hardware=hardware, in_specs=w.in_specs,
                   out_specs=w.out_specs, donate_argnums=w.donate_argnums)
    return w, step.lower(*w.args).compile()


def main() -> None:
    console = Console()
    t = Table(title="Flops: Flint vs XLA cost_analysis, and scan vs unrolled (gpt2-small shape, "
                    "seq 256)")
    for col in ("check", "mesh", "target", "flint", "reference", "ratio"):
        t.add_column(col, justify="right" if col in ("flint", "reference", "ratio") else "left")
    for mesh in [(("fsdp", 8),), (("fsdp", 2), ("model", 4))]:
        _, c = compiled("gpt2-small", mesh, "cpu", scan=False, layers=2, seq_len=256)
        flint, xla = c.workload().total_flops(), c.cost_analysis()["flops"]
        t.add_row("loop-free vs XLA", str(dict(mesh)), "cpu", f"{flint:.6g} FLOP",
                  f"{xla:.6g} FLOP", f"{flint / xla:.6f}")
    for hw in ("cpu", "h100-sxm"):
        mesh = (("fsdp", 2), ("model", 4))
        totals = {s: compiled("gpt2-small", mesh, hw, scan=s, layers=4, seq_len=256)[1]
                  .workload().total_flops() for s in (True, False)}
        t.add_row("scan vs unrolled", str(dict(mesh)), hw, f"{totals[True]:.6g} FLOP",
                  f"{totals[False]:.6g} FLOP", f"{totals[True] / totals[False]:.6f}")
    console.print(t)

    c2 = Table(title="Collectives of a 4-block MLP (d=1024, f=4096, float32)")
    for col in ("case", "target", "figure", "expected"):
        c2.add_column(col)
    for hw in ("cpu", "h100-sxm"):
        w, c = compiled("mlp", (("data", 8),), hw, layers=4)
        g = c.workload()
        got = sum(collective_size_bytes(n) for n in g.collectives())
        c2.add_row("DP=8 gradient all-reduce", hw,
                   f"{got} B in {len(g.collectives())} all-reduce(s), group size "
                   f"{sorted({g.communicator(n).size for n in g.collectives()})}",
                   f"{w.info['params'] * 4} B params + 4 B loss")
        w, c = compiled("mlp", (("data", 2), ("model", 4)), hw, layers=4, batch_per_replica=8)
        g = c.workload()
        tp = [n for n in g.collectives() if g.communicator(n).mesh_axes == ("model",)]
        fwd = sum(1 for n in tp if n.meta.get("phase") == "forward")
        bwd = sum(1 for n in tp if n.meta.get("phase") == "backward")
        c2.add_row("TP=4 Megatron all-reduces", hw,
                   f"{fwd} forward + {bwd} backward, group size "
                   f"{sorted({g.communicator(n).size for n in tp})}, axis model, "
                   f"{sorted({collective_size_bytes(n) for n in tp})} B each",
                   "4 forward + 3 backward (block 0's input has no gradient), size 4")
    console.print(c2)


if __name__ == "__main__":
    main()
