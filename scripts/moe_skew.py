"""Step time vs routing skew for a DeepSeek-V3-shaped model on 256 GPUs: a table and a PNG.

    python scripts/moe_skew.py [--out build/moe_skew] [--json]

The configuration is the Megatron-Bridge 26.06 DeepSeek-V3 GB200 pretraining row of
../shared/tables/published.md (256 GB200 in NVL72 racks, TP1 PP4 VP4 EP64, MBS 1, GBS 4096,
seq 4096, MXFP8), whose published figure used forced balanced routing. Each line re-prices
the same extracted program (scripts/moe_step.py) for another distribution of tokens over
the 256 routed experts (passes/moe_routing.py): balanced, a load-imbalance factor (hottest
expert / mean, the "MaxVio + 1" of arXiv 2408.15664) and Zipf popularity. Columns: the
hottest expert over the mean, the straggler EP rank's tokens over a balanced rank's, the
dispatch (= combine) all-to-all bytes per rank per layer and microbatch (balanced and on
the straggler), the predicted step and its slowdown over balanced routing.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from moe_step import REPO, routed_rows  # noqa: E402

POINTS = ("balanced", "imbalance:1.1", "imbalance:1.25", "imbalance:1.5", "imbalance:2",
          "imbalance:3", "zipf:0.5", "zipf:0.8", "zipf:1.0", "zipf:1.2")
def _run():
    from flint.run import TrainingRun

    return TrainingRun(model="deepseek-v3", seq_len=4096, devices=256, tp=1, pp=4, vp=4,
                       ep=64, micro_batch=1, global_batch=4096, hardware="gb200-nvl72",
                       precision="mxfp8")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(REPO / "build" / "moe_skew"))
    ap.add_argument("--points", default=",".join(POINTS),
                    help="routing distributions, comma-separated (see passes/moe_routing.py)")
    ap.add_argument("--json", action="store_true", help="also print the rows as JSON")
    args = ap.parse_args(argv)
    from flint.errors import FlintError
    from flint.frontends.targets import prepare_environment
    from flint.io import write_atomic

    prepare_environment()
    points = [p for p in _split(args.points) if p]
    try:
        RUN = _run()
        rows = routed_rows(RUN, points)
    except FlintError as err:
        print(f"moe_skew: {err}", file=sys.stderr)
        return 2
    base = rows[0]["step_s"]
    head = (f"{'routing':15s} {'max/mean':>8s} {'straggler':>9s} {'a2a MB/rank':>11s} "
            f"{'(balanced)':>10s} {'step s':>8s} {'tok/s/GPU':>9s} {'slowdown':>8s}")
    lines = [f"DeepSeek-V3 shape, {RUN.devices} x {RUN.hardware}, TP{RUN.tp} PP{RUN.pp} "
             f"VP{RUN.vp} EP{RUN.ep}, MBS{RUN.micro_batch} GBS{RUN.global_batch} seq "
             f"{RUN.seq_len}, {RUN.precision}", head]
    for r in rows:
        lines.append(f"{r['distribution']:15s} {r['max_over_mean_expert']:7.2f}x "
                     f"{r['straggler_factor']:8.2f}x "
                     f"{r['a2a_straggler_bytes_per_rank'] / 1e6:11.1f} "
                     f"{r['a2a_balanced_bytes_per_rank'] / 1e6:10.1f} {r['step_s']:8.2f} "
                     f"{r['tokens_s_gpu']:9.0f} {r['step_s'] / base:7.2f}x")
    from flint.models.describe import resolve_model

    cfg = resolve_model(RUN.model)
    closed = RUN.micro_batch * RUN.seq_len // RUN.tp * cfg.top_k * cfg.d_model * 2
    lines.append(f"closed form, dispatch = combine bytes per rank per MoE layer and microbatch "
                 f"(balanced): MBS x seq / TP x top_k x d_model x 2 B = {RUN.micro_batch} x "
                 f"{RUN.seq_len} / {RUN.tp} x {cfg.top_k} x {cfg.d_model} x 2 = "
                 f"{closed / 1e6:.1f} MB; "
                 f"extracted graph: {rows[0]['a2a_balanced_bytes_per_rank'] / 1e6:.1f} MB; "
                 f"(ep-1)/ep of it leaves the rank")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(str(out / "moe_skew.txt"), text)
    write_atomic(str(out / "moe_skew.json"), json.dumps(rows, indent=1, sort_keys=True) + "\n")
    _plot(rows, RUN, out / "moe_skew.png")
    if args.json:
        print(json.dumps(rows, indent=1, sort_keys=True))
    print(f"wrote {out / 'moe_skew.txt'}, moe_skew.json, moe_skew.png")
    return 0


def _split(text: str) -> list[str]:
    """Distributions separated by commas (a histogram's own commas stay with it)."""
    if text.startswith("histogram:"):
        return [text]
    return [p.strip() for p in text.split(",")]


def _plot(rows, RUN, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from flint.io import write_atomic

    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    for family, marker in (("imbalance", "o"), ("zipf", "s")):
        pts = [r for r in rows if r["distribution"].startswith(family)
               or r["distribution"] == "balanced"]
        pts.sort(key=lambda r: r["straggler_factor"])
        ax.plot([r["straggler_factor"] for r in pts], [r["step_s"] for r in pts],
                marker=marker, label=family)
        last = 0.0
        for r in pts:
            # points closer than ~15% on the log axis share their neighbour's label room
            if r["straggler_factor"] < last * 1.15 or (
                    family != "zipf" and r["distribution"] == "balanced"):
                continue
            last = r["straggler_factor"]
            ax.annotate(r["distribution"], (r["straggler_factor"], r["step_s"]), fontsize=6,
                        xytext=(3, 3 if family == "zipf" else -9), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_xlabel("straggler EP rank's tokens / balanced rank's (x)")
    ax.set_ylabel("predicted step time (s)")
    ax.set_title(f"DeepSeek-V3 shape, {RUN.devices} x {RUN.hardware}, EP{RUN.ep}: step vs "
                 f"routing skew", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    plt.close(fig)
    write_atomic(str(path), buf.getvalue())


if __name__ == "__main__":
    sys.exit(main())
