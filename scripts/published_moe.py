"""Rebuild the mixture-of-experts rows of the published training tables and compare
Flint's predicted step time with the published one.

    python scripts/published_moe.py                          # every rebuildable MoE row
    python scripts/published_moe.py --rows 'Qwen3_30B' --json out.json
    python scripts/compare_published.py --moe [--rows REGEX] # the same, from the dense script

Rows come from ../shared/tables/published.md (the ```csv blocks). A row is a MoE row when
its model is one of the MoE families below; it becomes a flint.run.TrainingRun priced by
flint.engine.predict (see scripts/moe_step.py for how MoE runs are built) and compared on
step time
(derived_step_s = GBS x seq / (tokens/s/GPU x GPUs), or the printed step time), never on
TFLOP/s.

Assumptions (the same for every row, never chosen per row):
- Model shapes: flint.models.describe presets (DeepSeek-V3 with MLA, Qwen3-30B-A3B,
  Qwen3-235B-A22B, GPT-OSS-120B, Mixtral-8x7B; public configs). Leading dense layers
  are priced as MoE layers (see moe_step.py). GPT-OSS's sliding-window layers run full
  causal attention. DeepSeek-V3 without multi-token prediction.
- Routing: forced balanced and dropless, as the tables' footnotes say ("we force-balance
  the token distribution among experts"; "Fake balanced gate is enabled").
- Parallelism: EP carved out of data parallelism (Megatron-Core's default expert layout;
  with CP > 1 each context rank routes its own sequence chunk inside its EP group);
  expert tensor parallelism = TP; sequence parallelism on with TP > 1; FSDP columns > 0
  (NeMo AutoModel's FSDP2) are modelled as data parallelism (gradient all-reduce).
- Precision: BF16 -> bf16 GEMMs; FP8 / FP8-CS -> per-tensor-scaled FP8; MXFP8 / FP8-MX ->
  1x32 block-scaled FP8 at the FP8 tensor rate. Attention is a bf16 flash kernel; the
  dispatch/combine all-to-alls move bf16 tokens.
- Token dispatcher: the one the row names (NeMo AutoModel's "TE + DeepEP": DeepEP, a
  token sent once per remote node), else Megatron-Core's default `alltoall` (NCCL all-to-
  all, every top-k copy sent; NCCL may still route via NVLink to the rail-local GPU).
  This only matters when EP spans nodes (H100/B200 rows; NVL72 racks hold their EP).
- Recompute: selective (attention core only). Microbatch and GA as stated; pipeline rows
  use 1F1B, or interleaved 1F1B with VP chunks when VP > 1.
- Hardware: the same system mapping as scripts/compare_published.py (DGX-H100 ->
  h100-sxm; DGX-B200 -> b200; DGX-B300 -> b300; DGX-GB200/GB300 -> gb200-nvl72 /
  gb300-nvl72, compiled for the b200 target).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from moe_step import REPO  # noqa: E402

TABLE = REPO.parent / "shared" / "tables" / "published.md"
MODELS = [  # (regex on the row's model name, preset)
    (r"deepseek[-_ ]?v3|deepseek v3 671b", "deepseek-v3"),
    (r"qwen3[-_ ]?30b|qwen3 moe 30b", "qwen3-30b-a3b"),
    (r"qwen3[-_ ]?235b", "qwen3-235b-a22b"), (r"gpt[-_ ]?oss[-_ ]?120b", "gpt-oss-120b"),
    (r"mixtral[-_ ]?8x7b", "mixtral-8x7b"), (r"mixtral[-_ ]?8x22b", "mixtral-8x22b"),
]
MOE_NAMES = re.compile(r"deepseek|qwen3|kimi|gpt.?oss|mixtral|nemotron_3|nemotron v3|llama4|"
                       r"a3b|a22b|moe", re.I)
SYSTEMS = {"dgx-h100": "h100-sxm", "dgx-b200": "b200", "dgx-b300": "b300",
           "dgx-gb200": "gb200-nvl72", "dgx-gb300": "gb300-nvl72"}
PRECISION = {"bf16": "bf16", "fp8": "fp8", "fp8-cs": "fp8", "mxfp8": "mxfp8", "fp8-mx": "mxfp8"}


@dataclass
class MoeRow:
    label: str
    reason: str = ""
    run: object = None          # a flint.run.TrainingRun
    published_step_s: float = 0.0
    result: dict = field(default_factory=dict)


def csv_blocks(path: Path):
    """(section id, rows as dicts) for every ```csv block (compare_published's reader)."""
    from table_columns import tables

    return [(heading.split(" ")[0].rstrip("."), records) for heading, records in tables(path)]


def num(cell) -> float | None:
    from table_columns import first_number

    return first_number(cell)


def moe_rows(path: Path) -> list[MoeRow]:
    rows, blocks = [], {}
    for section, records in csv_blocks(path):
        blocks[section] = blocks.get(section, 0) + 1
        if blocks[section] > 1:          # a section's later tables: 1c.2, 1c.3, ...
            section = f"{section}.{blocks[section]}"
        for k, r in enumerate(records):
            name = str(r.get("model", ""))
            if not (MOE_NAMES.search(name) or section.startswith("1g")):
                continue
            label = f"{section}#{k + 1} " + " ".join(str(r.get(c, "")) for c in (
                "release", "model", "task", "system", "tpu", "gpus", "chips", "precision",
                "feature_added") if r.get(c))
            row = MoeRow(label.strip())
            row.reason = _build(row, section, r, name)
            rows.append(row)
    return rows


def _build(row: MoeRow, section: str, r: dict, name: str) -> str:
    if section.startswith("1g"):
        return "TFLOP/s under the write-up's own FLOP count, no tokens/s or step time"
    if section.startswith("2"):
        return ("TPU row: this script rebuilds the GPU rows' Megatron-Core MoE recipes; "
                "MaxText's TPU MoE configurations are not rebuilt")
    preset = next((p for rx, p in MODELS if re.search(rx, name, re.I)), "")
    if not preset:
        return f"no public MoE shape for {name!r} in flint.models.describe"
    prec = str(r.get("precision") or ("FP8-CS" if section.startswith("1c") else "BF16")).split()[0]
    if prec.lower().startswith("n/s"):
        return "precision not stated"
    if prec.lower() not in PRECISION:
        return f"precision {prec!r} not modelled"
    system = str(r.get("system") or "dgx-h100").lower()   # 1h: the page says DGX-H100
    if system not in SYSTEMS:
        return f"no hardware spec for system {system!r}"
    if "tokendrop" in name.lower():
        return "token-dropping variant (capacity not stated)"
    ep = num(r.get("ep"))
    if ep is None:
        return "EP not stated"
    gpus, tp, pp = int(num(r.get("gpus"))), int(num(r.get("tp")) or 1), int(num(r.get("pp")) or 1)
    vp = int(num(r.get("vp")) or 1)
    gbs, mbs, seq = int(num(r.get("gbs"))), int(num(r.get("mbs")) or 1), int(num(r.get("seq")))
    # the dispatcher the row names (1h: "TE + DeepEP"; HybridEP sends a token once per
    # remote node as DeepEP does), else Megatron-Core's default
    stated = " ".join(str(v) for v in r.values()).lower()
    dispatcher = "deepep" if ("deepep" in stated or "hybridep" in stated) else "alltoall"
    from flint.errors import FlintError
    from flint.run import TrainingRun

    try:
        row.run = TrainingRun(model=preset, seq_len=seq, devices=gpus, hardware=SYSTEMS[system],
                              tp=tp, cp=int(num(r.get("cp")) or 1), pp=pp, vp=vp, ep=int(ep),
                              dispatcher=dispatcher, micro_batch=mbs, global_batch=gbs,
                              precision=PRECISION[prec.lower()])
    except FlintError as err:
        why = str(err)
        return (why + " (EP spanning tensor- or context-parallel ranks is not built)"
                if why.startswith("ep") else why)
    step = num(r.get("step_time_s"))
    tok = num(r.get("tok_s_gpu"))
    if not step and not tok:
        return "no step time or tokens/s published"
    row.published_step_s = step if step else gbs * seq / (tok * gpus)
    return ""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", default=str(TABLE))
    ap.add_argument("--rows", default="", help="regex: only rebuild rows whose label matches")
    ap.add_argument("--json", dest="json_out", default=None)
    ap.add_argument("--cache", default=str(REPO / "build" / "moe"))
    args = ap.parse_args(argv)
    from flint.errors import FlintError
    from flint.frontends.targets import prepare_environment

    path = Path(args.table)
    if not path.is_file():
        print(f"published_moe: table not found: {path}", file=sys.stderr)
        return 2
    prepare_environment()
    rows = moe_rows(path)
    pick = re.compile(args.rows) if args.rows else None
    todo = [r for r in rows if not r.reason and (pick is None or pick.search(r.label))]
    # one extraction per program: group rows that share a stage program
    todo.sort(key=lambda r: (r.run.stage_devices, r.run.model, r.run.hardware, r.run.tp,
                             r.run.ep, r.run.micro_batch, r.run.precision, r.label))
    print(f"{'row':60s} {'published':>10s} {'predicted':>10s} {'error':>8s}", flush=True)
    done = []
    from moe_step import routed_rows

    for r in todo:
        try:
            res = routed_rows(r.run, ["balanced"], Path(args.cache))[0]
        except FlintError as err:
            r.reason = f"Flint could not rebuild it: {err}"
            continue
        r.result = {**res, "error": res["step_s"] / r.published_step_s - 1}
        done.append(r)
        print(f"{r.label[:60]:60s} {r.published_step_s:9.3f}s {res['step_s']:9.3f}s "
              f"{r.result['error'] * 100:+7.1f}%{'  OOM' if res['oom'] else ''}", flush=True)
    from published_rows import print_not_rebuildable

    print_not_rebuildable(rows, "MoE")
    if done:
        errs = sorted(abs(r.result["error"]) for r in done)
        print(f"MoE rows rebuilt: {len(done)}; |error| median {errs[len(errs) // 2] * 100:.1f}%,"
              f" within 10%: {sum(e <= 0.10 for e in errs)}, within 25%: "
              f"{sum(e <= 0.25 for e in errs)}")
    if args.json_out:
        from flint.io import write_atomic

        out = [{"label": r.label, "reason": r.reason, "published_step_s": r.published_step_s,
                "run": r.run.to_json() if r.run else None, "result": r.result} for r in rows]
        write_atomic(args.json_out, json.dumps(out, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
