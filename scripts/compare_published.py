"""Rebuild every dense-model row of the published training tables and compare Flint's
predicted step time with the published one.

    python scripts/compare_published.py                         # every rebuildable row
    python scripts/compare_published.py --rows 'LLAMA3_8B|GPT3-5B' --json out.json
    python scripts/compare_published.py --cached-only       # rows already extracted

Rows come from ../shared/tables/published.md (each ```csv block under its heading). A row
is rebuilt from its stated configuration with the zoo decoder (flint.models.describe
presets) and estimated with the default cost model; the comparison is tokens/s/GPU
(equivalently step time, derived_step_s = GBS*seq / (tokens/s/GPU * GPUs)) or the
published step time, never TFLOP/s (FLOP conventions differ between releases; see the
table's caveats). Each row's program is a layer template (TEMPLATE_LAYERS unrolled layers
on one pipeline stage's data x tensor-parallel mesh), cached under --cache/templates, widened
to the model's layers by passes.layer_template and pipelined by passes.pipeline; a rerun
only estimates.

Assumptions (the same for every row, never chosen per row):
- Model shapes: the presets of flint.models.describe (public configs); GPT-style rows use
  Megatron's GPT (LayerNorm, GeLU 4h MLP, learned positions, vocab 51200).
- Precision: BF16 -> bf16 GEMMs; FP8, FP8-CS, FP8 hybrid -> per-tensor-scaled FP8 GEMMs
  (forward E4M3, output gradient E5M2); MXFP8 / FP8-MX -> 1x32 block-scaled FP8 GEMMs,
  at the FP8 tensor rate. Attention runs as a bf16 flash kernel in every row.
- Activation recompute: Megatron-family rows use "selective" (recompute the attention
  core only, Megatron's documented default with flash attention, which stores no S x S
  activations); rows that state "full" use full layer recompute.
- Data parallelism: FSDP column > 0 -> ZeRO-3 sharding (fsdp axis); otherwise data
  parallel with the distributed optimizer (below). Tensor parallelism with sequence parallelism on (Megatron-Core's default
  with TP > 1).
- Context parallelism (CP > 1): the zoo's all-gather CP (keys and values gathered over the
  context axis, load-balanced causal chunks); Megatron runs ring attention (the same
  bytes as point-to-point steps overlapped with the attention blocks).
- Microbatch and gradient accumulation as stated: GA = GBS / (DP * MBS); pipeline rows
  use 1F1B, or interleaved 1F1B with VP chunks when VP > 1, with the pipeline pass.
- Kernels: the rows ran Megatron-Core with Transformer Engine, so layers are unrolled
  (no lax.scan stacking copies), and elementwise, norm and cast kernels are library
  kernels (hand-vectorized: the stream share of HBM), not XLA-generated ones (which the
  cost model caps per SM): node meta `kernel_source: library`.
- Pipeline stages are balanced by predicted time, embedding and loss included (Megatron's
  uneven layouts and --account-for-embedding/loss-in-pipeline-split), for every PP row.
- Optimizer: Megatron's distributed optimizer (NeMo/Megatron-Bridge recipes and MLPerf
  submissions use it) on every non-FSDP row: passes.distributed_optimizer turns the
  once-per-step f32 gradient all-reduce into a reduce-scatter (overlapped with the last
  microbatch's backward), divides the Adam update by DP, and all-gathers bf16 parameters
  at the start of the step (overlapped with the forward, --overlap-param-gather).
- Hardware: DGX-H100 -> h100-sxm; DGX-B200 -> b200; DGX-B300 -> b300 spec (compiled for
  the b200 target, same SM generation); DGX-GB200 / GB300 -> gb200-nvl72 / gb300-nvl72
  specs (72-GPU NVLink domains; compiled for b200); A100 -> a100-80gb-sxm; TPU v4/v5e/v5p
  through libtpu compile-only targets when the `tpu` extra is installed.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

from published_rows import (REPO, SYSTEMS, TABLE, WITHIN, Row, print_not_rebuildable,
                            rows_of, tables)

TEMPLATE_LAYERS = 3
# Bumped whenever the zoo's workload changes (cached templates of older versions are
# not reused): 2 = MLP hidden activations constrained to the tensor-parallel split;
# 3 = vocab-parallel embedding lookup and LM head.
WORKLOAD_VERSION = 3


def template_program(row: Row) -> dict:
    """The program a row's layer template is extracted from: one pipeline stage's data x
    tensor-parallel mesh, TEMPLATE_LAYERS unrolled layers of the row's model."""
    from flint.models.describe import resolve_model, to_mapping

    compile_target, _ = SYSTEMS[row.system]
    dp = row.gpus // (row.tp * row.pp * row.cp)
    # Megatron's rank order: TP innermost, then CP, then DP (the mesh's last axis is
    # innermost)
    mesh = ([["fsdp" if row.fsdp else "data", dp]] + ([["context", row.cp]] if row.cp > 1
            else []) + ([["model", row.tp]] if row.tp > 1 else []))
    return {"framework": "jax", "model": to_mapping(resolve_model(row.model).with_(
                seq_len=row.seq)), "devices": dp * row.cp * row.tp, "mesh": mesh,
            "batch_per_replica": row.mbs, "remat": row.remat, "sequence_parallel": row.tp > 1,
            "scan": False, "seq_len": row.seq, "layers": TEMPLATE_LAYERS,
            "hardware": compile_target, "workload_version": WORKLOAD_VERSION,
            **({"gemm_precision": row.precision} if row.precision != "bf16" else {})}


def rebuild(row: Row, cache: Path, cached_only: bool = False) -> None:
    """Estimate one row: extract (or load) its layer template, widen it to the model's
    layers (passes.layer_template), pipeline it over the row's stages and microbatches,
    and estimate it on the row's hardware spec."""
    from flint.errors import FlintError
    from flint.graph import WorkloadGraph
    from flint.hardware_models.estimate import estimate
    from flint.models.decoder import model_flops
    from flint.models.describe import resolve_model
    from flint.passes.distributed_optimizer import DistributedOptimizer
    from flint.passes.layer_template import LayerTemplate
    from flint.passes.pipeline import PipelineParallel
    from flint.sweep import extract_program
    from flint.sweep_space import _digest

    _, spec = SYSTEMS[row.system]
    cfg = resolve_model(row.model).with_(seq_len=row.seq)
    if row.gpus % row.pp or (row.gpus // row.pp) % (row.tp * row.cp):
        row.reason = (f"{row.gpus} GPUs do not split into tp={row.tp} x cp={row.cp} x "
                      f"pp={row.pp}")
        return
    dp = row.gpus // (row.tp * row.pp * row.cp)
    if row.gbs % (dp * row.mbs):
        row.reason = f"GBS {row.gbs} is not a multiple of DP {dp} x MBS {row.mbs}"
        return
    if cfg.n_layers < row.pp * row.vp:
        row.reason = f"{cfg.n_layers} layers cannot fill PP {row.pp} x VP {row.vp} chunks"
        return
    program = template_program(row)
    path = cache / "templates" / f"{_digest(program)}.json"
    extracted = not path.is_file()
    if extracted and cached_only:
        return
    t0 = time.perf_counter()
    try:
        if extracted:
            template = extract_program(program)
            path.parent.mkdir(parents=True, exist_ok=True)
            template.save(path)
        else:
            template = WorkloadGraph.load(path)
        for n in template.nodes:        # Megatron-Core + Transformer Engine kernels
            n.meta["kernel_source"] = "library"
        layered = LayerTemplate(cfg.n_layers, spec).run(template)
        # one microbatch of the stage's data-parallel group, per device of the stage
        if not row.fsdp:
            layered = DistributedOptimizer().run(layered)
        layered.meta["model_flops_per_device"] = model_flops(cfg, row.mbs * dp * row.seq) / (
            dp * row.cp * row.tp)
        microbatches = row.gbs // (dp * row.mbs)
        # stages balanced by predicted time (embedding and loss included), as Megatron's
        # uneven pipeline layouts and --account-for-embedding/loss-in-pipeline-split do
        piped = PipelineParallel(row.pp, microbatches, "interleaved" if row.vp > 1 else "1f1b",
                                 row.vp, split="time" if row.pp > 1 else "layers",
                                 hardware=spec).run(layered)
        e = estimate(piped, spec)
    except FlintError as err:
        row.reason = f"Flint could not rebuild it: {err}"
        return
    row.result = {"predicted_step_s": e.step_time_s, "mfu": e.mfu,
                  "exposed_communication_s": e.exposed_communication_s,
                  "bubble_fraction": e.pipeline.get("bubble_fraction", 0.0),
                  "extracted": extracted, "seconds": time.perf_counter() - t0,
                  "error": e.step_time_s / row.published_step_s - 1}


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
    from flint.models.describe import resolve_model

    size = {r.model: param_count(resolve_model(r.model)) for r in todo}
    todo.sort(key=lambda r: (size[r.model] / r.pp, r.model, r.system, r.tp, r.pp,
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
