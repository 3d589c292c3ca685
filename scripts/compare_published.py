"""Rebuild every dense-model row of the published training tables and compare Flint's
predicted step time with the published one.

    python scripts/compare_published.py                         # every rebuildable row
    python scripts/compare_published.py --rows 'LLAMA3_8B|GPT3-5B' --json out.json
    python scripts/compare_published.py --cached-only       # rows already extracted

Rows come from ../shared/tables/published.md (each ```csv block under its heading). A row
becomes a flint.run.TrainingRun (its stated configuration; the assumptions below where it
is silent) and is priced by flint.engine.predict, the engine `flint predict` and `flint
sweep` use (one pipeline stage's program compiled once and cached under --cache, widened
to the model's layers, pipelined, estimated); the comparison is tokens/s/GPU
(equivalently step time, derived_step_s = GBS*seq / (tokens/s/GPU * GPUs)) or the
published step time, never TFLOP/s (FLOP conventions differ between releases; see the
table's caveats). A rerun only re-prices.

Columns: the names published.md uses, or the other names Megatron's logs and other
tables give them (table_columns.COLUMN_ALIASES: num_gpus, tensor_model_parallel_size,
micro_batch_size, global_batch_size, seq_length, dtype, gpu_type, ...); the published
figure as a step time (s or ms), tokens/s (per GPU or in all) or samples/s
(table_columns.STEP_FIGURES).

Assumptions (the same for every row, never chosen per row):
- Model shapes: the presets of flint.models.describe (public configs), or the layers /
  hidden / heads (ffn, vocab, kv heads) a row states in its own columns; GPT-style rows use
  Megatron's GPT (LayerNorm, GeLU 4h MLP, learned positions, vocab 51200) where silent.
- Precision: BF16, and FP16 (the same dense tensor rate on A100 and H100) -> bf16 GEMMs;
  FP8, FP8-CS, FP8 hybrid -> per-tensor-scaled FP8 GEMMs (forward E4M3, output gradient E5M2); MXFP8 / FP8-MX -> 1x32 block-scaled FP8 GEMMs,
  at the FP8 tensor rate; NVFP4 -> Transformer Engine's NVFP4BlockScaling (E2M1 with
  16-element E4M3 block scales, all three GEMMs at the FP4 tensor rate). Attention runs as a bf16 flash kernel in every row.
- Activation recompute: Megatron-family rows use "selective" (recompute the attention
  core only, Megatron's documented default with flash attention, which stores no S x S
  activations); rows that state "full" use full layer recompute.
- Data parallelism: what a row states in words (table_columns.stated_sharding: FSDP's
  FULL_SHARD / HYBRID_SHARD / NO_SHARD, DDP, a ZeRO stage; SHARD_GRAD_OP's parameters kept
  from forward to backward are FSDP2's option, which scripts/fidelity.py applies to the
  PyTorch families); else FSDP column > 0 -> ZeRO-3 sharding (fsdp axis); otherwise data
  parallel with the distributed optimizer (below). Tensor parallelism with sequence
  parallelism on (Megatron-Core's default with TP > 1).
- Context parallelism (CP > 1): the zoo's all-gather CP (keys and values gathered over the
  context axis, load-balanced causal chunks); Megatron runs ring attention (the same
  bytes as point-to-point steps overlapped with the attention blocks).
- Microbatch and gradient accumulation as stated: GA = GBS / (DP * MBS); pipeline rows
  use 1F1B, or interleaved 1F1B with VP chunks when VP > 1, with the pipeline pass.
- Kernels: the rows ran Megatron-Core with Transformer Engine (run framework
  `megatron`): elementwise, norm and cast kernels are library kernels (hand-vectorized:
  the stream share of HBM), not XLA-generated ones (which the cost model caps per SM).
- Pipeline stages are balanced by predicted time, embedding and loss included (Megatron's
  uneven layouts and --account-for-embedding/loss-in-pipeline-split), for every PP row.
- Optimizer: Megatron's distributed optimizer (NeMo/Megatron-Bridge recipes and MLPerf
  submissions use it) on every non-FSDP row (run zero 1: the once-per-step gradient
  all-reduce becomes a reduce-scatter overlapped with the last microbatch's backward, the
  Adam update divides by DP, bf16 parameters are all-gathered at the start of the step,
  overlapped with the forward, --overlap-param-gather); FSDP rows run zero 3.
- Hardware: DGX-H100 -> h100-sxm; DGX-B200 -> b200; DGX-B300 -> b300; DGX-GB200 / GB300
  -> gb200-nvl72 / gb300-nvl72 (72-GPU NVLink domains); A100 -> a100-80gb-sxm (each spec
  names its compile target); TPU v4/v5e/v5p through libtpu compile-only targets when the
  `tpu` extra is installed (framework xla).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from dataclasses import replace
from pathlib import Path

from published_rows import (REPO, TABLE, WITHIN, Row, model_config, print_not_rebuildable,
                            rows_of, system_spec)
from table_columns import tables

def training_run(row: Row):
    """The row's configuration as a TrainingRun (raises FlintError when it cannot be)."""
    from flint.run import TrainingRun

    from flint.engine import devices_per_host

    spec = system_spec(row.system)
    zero = row.zero if row.zero is not None else 3 if row.fsdp else 1
    run = TrainingRun(model=row.model, seq_len=row.seq, devices=row.gpus, hardware=spec,
                      tp=row.tp, cp=row.cp, pp=row.pp, vp=row.vp, zero=zero,
                      micro_batch=row.mbs, global_batch=row.gbs, remat=row.remat,
                      recompute_layers=row.recompute_layers,
                      precision=row.precision, fp8_recipe=row.fp8_recipe or "current",
                      framework="xla" if spec.startswith("tpu") else "megatron")
    if row.overlap_grad_reduce is not None:
        run = replace(run, overlap_grad_reduce=row.overlap_grad_reduce)
    if row.collective_matmul != "auto":
        run = replace(run, collective_matmul=row.collective_matmul)
    if row.tp_comm_overlap is not None:
        run = replace(run, tp_comm_overlap=row.tp_comm_overlap)
    if row.lora_rank:
        run = replace(run, lora_rank=row.lora_rank, lora_targets=row.lora_targets,
                      lora_base=row.lora_base)
    # HYBRID_SHARD: one shard group per host (the GPUs a host holds on its NVLink)
    if row.hsdp:
        return replace(run, hsdp=row.hsdp)
    return replace(run, hsdp=devices_per_host(run)) if row.hybrid else run


def rebuild(row: Row, cache: Path, cached_only: bool = False) -> None:
    """Price one row with the engine; `row.reason` says why it could not be."""
    from flint.engine import predict, stage_program
    from flint.errors import FlintError
    from flint.template_cache import TemplateCache

    try:
        run = training_run(row)
    except FlintError as err:
        row.reason = str(err)
        return
    store = TemplateCache(cache)
    if cached_only and not store.has(stage_program(run)):
        return
    t0 = time.perf_counter()
    try:
        p = predict(run, cache=store, what_if=row.what_if)
    except FlintError as err:
        row.reason = f"Flint could not rebuild it: {err}"
        return
    row.result = {"predicted_step_s": p.step_time_s, "mfu": p.mfu,
                  "exposed_communication_s": p.exposed_communication_s,
                  "bubble_fraction": p.bubble_fraction, "extracted": p.extracted,
                  "seconds": time.perf_counter() - t0,
                  "error": p.step_time_s / row.published_step_s - 1}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--table", default=str(TABLE))
    ap.add_argument("--rows", default="", help="regex: only rebuild rows whose label matches")
    ap.add_argument("--cache", default=str(REPO / "build" / "compare_published"),
                    help="graph cache directory (extractions are reused across runs)")
    ap.add_argument("--json", dest="json_out", default=None, help="also write rows as JSON")
    ap.add_argument("--cached-only", action="store_true", help="only rows whose extracted "
                    "graph is already in --cache (a bounded-time rerun)")
    ap.add_argument("--moe", action="store_true", help="rebuild the MoE rows instead "
                    "(scripts/published_moe.py)")
    args = ap.parse_args(argv)
    if args.moe:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import published_moe

        return published_moe.main(["--table", args.table] + ["--rows", args.rows] * bool(
            args.rows) + ["--json", args.json_out] * bool(args.json_out))
    from flint.frontends.targets import prepare_environment

    prepare_environment()
    path = Path(args.table)
    if not path.is_file():
        print(f"compare_published: table not found: {path}", file=sys.stderr)
        return 2
    rows = [row for heading, recs in tables(path) for row in rows_of(heading, recs)]
    pick = re.compile(args.rows) if args.rows else None
    Path(args.cache).mkdir(parents=True, exist_ok=True)
    dense = [r for r in rows if not r.moe]
    todo = [r for r in dense if not r.reason and (pick is None or pick.search(r.label))]
    # cheapest extractions first (a partial run covers the most rows), one program's rows
    # together (the evaluator keeps one graph in memory)
    from flint.models.decoder import param_count

    size = {r.model: param_count(model_config(r.model)) for r in todo}
    todo.sort(key=lambda r: (size[r.model] / r.pp, str(r.model), r.system, r.tp, r.pp,
                             r.mbs, r.precision, r.remat, r.label))
    print(f"{'row':58s} {'published':>10s} {'predicted':>10s} {'error':>8s}  note", flush=True)
    done = []
    for r in todo:
        rebuild(r, Path(args.cache), args.cached_only)
        if not r.result:
            continue
        done.append(r)
        res = r.result
        note = (f"MFU {res['mfu'] * 100:.1f}%, exposed comm "
                f"{res['exposed_communication_s'] * 1e3:.0f} ms"
                + (f", bubble {res['bubble_fraction'] * 100:.1f}%" if r.pp > 1 else ""))
        print(f"{r.label[:58]:58s} {r.published_step_s:9.3f}s {res['predicted_step_s']:9.3f}s "
              f"{res['error'] * 100:+7.1f}%  {note}", flush=True)
    skipped = print_not_rebuildable(dense, "dense")
    not_run = len(dense) - len(skipped) - len(done)
    print(f"MoE rows: {sum(r.moe for r in rows)} (rebuilt by --moe); rebuildable dense rows not "
          f"run (--rows / --cached-only): {not_run}")
    if args.json_out:
        from flint.io import write_atomic

        write_atomic(args.json_out, json.dumps([r.__dict__ for r in dense], indent=1,
                                               sort_keys=True) + "\n")
    within = sum(abs(r.result["error"]) <= WITHIN for r in done)
    print(f"published rows: {within} within 10% of {len(done)} rebuilt "
          f"({len(skipped)} not rebuildable)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
