"""`flint predict`: one training configuration (flags or a run YAML) -> its predicted step,
through the library's one engine (flint.engine.predict)."""
from __future__ import annotations

import time
from typing import Optional

import typer

from flint.cli._common import check_output_file, cost_model_option, err, report_out, run


def predict(
    run_file: Optional[str] = typer.Argument(None, help="a run YAML/JSON (TrainingRun "
                                             "fields); flags override its fields"),
    model: Optional[str] = typer.Option(None, help="preset/zoo name (`flint models`), a "
                                        "model YAML or a Hugging Face config.json"),
    seq_len: Optional[int] = typer.Option(None, help="training sequence length (tokens)"),
    devices: Optional[int] = typer.Option(None, "--devices", "-n", help="GPUs in the run"),
    hardware: Optional[str] = typer.Option(None, help="hardware spec (`flint hardware`); "
                                           "default h100-sxm"),
    devices_per_host: Optional[int] = typer.Option(None, help="GPUs per host (default: the "
                                                   "spec's)"),
    tp: Optional[int] = typer.Option(None, help="tensor-parallel degree"),
    sp: Optional[bool] = typer.Option(None, "--sp/--no-sp", help="sequence parallelism "
                                      "(default: on when tp > 1)"),
    cp: Optional[int] = typer.Option(None, help="context-parallel degree"),
    pp: Optional[int] = typer.Option(None, help="pipeline stages"),
    vp: Optional[int] = typer.Option(None, help="virtual stages (model chunks) per "
                                     "pipeline stage"),
    schedule: Optional[str] = typer.Option(None, help="1f1b | interleaved | gpipe (default: "
                                           "interleaved when vp > 1)"),
    pipeline_split: Optional[str] = typer.Option(None, help="time | layers: balance stages "
                                                 "by predicted time or by layer count"),
    pipeline_p2p: Optional[str] = typer.Option(
        None, help="stage sends: posted-ahead | blocking (Megatron's 1F1B) | blocking-serial "
                   "(DeepSpeed's engine) (default: blocking for megatron without vp)"),
    pipeline_scatter_gather: Optional[bool] = typer.Option(
        None, "--pipeline-scatter-gather/--no-pipeline-scatter-gather",
        help="tp without sp: each TP rank sends 1/tp of the boundary, all-gathered on arrival"),
    ep: Optional[int] = typer.Option(None, help="expert-parallel degree (MoE models)"),
    dispatcher: Optional[str] = typer.Option(None, help="MoE token dispatcher: alltoall | "
                                             "deepep"),
    zero: Optional[int] = typer.Option(None, help="0 all-reduce | 1 distributed optimizer | "
                                       "2 + sharded gradients | 3 FSDP (default 1)"),
    hsdp: Optional[int] = typer.Option(None, help="shard over groups of this many ranks, "
                                       "replicate across them (zero 3: HYBRID_SHARD; zero "
                                       "1/2: the optimizer's shard group)"),
    zero_sync: Optional[str] = typer.Option(None, help="zero 1: reduce-scatter (Megatron, "
                                            "DeepSpeed; default) | broadcast (InternEvo: "
                                            "gradients all-reduced, owners broadcast) | "
                                            "all-reduce (DeepSpeed BF16_Optimizer: "
                                            "gradients all-reduced, parameters gathered)"),
    grad_reduce_dtype: Optional[str] = typer.Option(
        None, help="zero 1/2 (megatron): gradients kept and reduced in fp32 (default) | "
                   "bf16 (Megatron-Core grad_reduce_in_fp32=False, NVIDIA's perf recipes)"),
    micro_batch: Optional[int] = typer.Option(None, help="sequences per micro-batch per "
                                              "data-parallel rank"),
    global_batch: Optional[int] = typer.Option(None, help="sequences per step (default: "
                                               "one micro-batch per data-parallel rank)"),
    remat: Optional[str] = typer.Option(None, help="none | selective | full | dots"),
    recompute_layers: Optional[int] = typer.Option(
        None, help="remat full: recompute only this many layers of each pipeline chunk "
                   "(Megatron's block method; default: all)"),
    precision: Optional[str] = typer.Option(None, help="GEMM precision: bf16 | fp8 | mxfp8 | nvfp4"),
    fp8_recipe: Optional[str] = typer.Option(
        None, help="precision fp8: per-tensor scaling from the tensor's current amax (default; "
                   "Transformer Engine's Float8CurrentScaling) | delayed (its DelayedScaling, "
                   "TE 1.x: the amax history of earlier steps)"),
    framework: Optional[str] = typer.Option(None, help="who makes the kernels: megatron | "
                                            "xla | torch-eager | torch-compile"),
    attention: Optional[str] = typer.Option(
        None, help="attention core: flash (the framework's fused kernel for the GPU) | a "
                   "named fused kernel: flash1 (FlashAttention v1) | flash2 | flash3 | cudnn "
                   "(PyTorch SDPA's choice on Hopper/Blackwell in CUDA 12.9+ builds) | unfused"),
    attention_dropout: Optional[float] = typer.Option(
        None, help="attention unfused (megatron or torch frameworks): dropout probability on "
                   "the attention probabilities (Megatron-LM's --attention-dropout; default 0: "
                   "none)"),
    score_path: Optional[str] = typer.Option(
        None, help="attention unfused, megatron: its scale, mask and softmax as one fused "
                   "kernel (default; FusedScaleMaskSoftmax) | eager (one PyTorch kernel each, "
                   "Megatron-LM 2019)"),
    tp_comm_overlap: Optional[bool] = typer.Option(
        None, "--tp-comm-overlap/--no-tp-comm-overlap",
        help="TP collectives pipelined with their GEMMs (default: on for megatron with TP+SP)"),
    tp_grad_overlap: Optional[bool] = typer.Option(
        None, "--tp-grad-overlap/--no-tp-grad-overlap",
        help="the backward's TP input-gradient reduction run beside the weight-gradient GEMM "
             "(default: on for megatron with TP)"),
    collective_matmul: Optional[str] = typer.Option(
        None, help="framework xla on a TPU: XLA's collective matmul (windowed einsum) where "
                   "libtpu chooses, auto (default) | off (MaxText's DISABLE_COLLECTIVE_MATMUL)"),
    launch_blocking: Optional[bool] = typer.Option(
        None, "--launch-blocking/--no-launch-blocking",
        help="CUDA_LAUNCH_BLOCKING=1: each launch waits for its kernel, nothing overlaps "
             "(needs --no-overlap-grad-reduce)"),
    cuda_graphs: Optional[bool] = typer.Option(
        None, "--cuda-graphs/--no-cuda-graphs",
        help="kernels replayed from CUDA graphs: no host launches, no launch gap between "
             "kernels (default: on for xla, whose command buffers are, off otherwise)"),
    xla_emitters: Optional[str] = typer.Option(
        None, help="framework xla: XLA's GPU fusion emitters, mlir (XLA on CUDA since 2024, "
                   "the default) | legacy (the LLVM emitters before them)"),
    reshard_after_forward: Optional[bool] = typer.Option(
        None, "--reshard-after-forward/--no-reshard-after-forward",
        help="zero 3 (torch): FSDP2 regathers parameters for the backward (default "
             "without pp) or keeps them (default with pp, torchtitan's)"),
    overlap_grad_reduce: Optional[bool] = typer.Option(
        None, "--overlap-grad-reduce/--no-overlap-grad-reduce",
        help="reduce gradients bucket by bucket during the backward (default) or after it"),
    grad_accumulation: Optional[str] = typer.Option(
        None, help="where micro-batch gradients are summed: in-gemm (Megatron's fusion, "
                   "XLA) | autograd (PyTorch's AccumulateGrad) | fp32-copy (DeepSpeed's "
                   "BF16 optimizer) (default: autograd for torch-*, else in-gemm)"),
    grad_sync: Optional[str] = typer.Option(
        None, help="when gradients are reduced: every-microbatch (PyTorch DDP/FSDP2's "
                   "default, ZeRO-2) | last-microbatch (no_sync, Megatron, "
                   "torch.distributed.pipelining) (default: every-microbatch for torch-* "
                   "without pp and zero 2, else last-microbatch)"),
    lora_rank: Optional[int] = typer.Option(
        None, help="LoRA fine-tuning: the adapters' rank on a frozen base (default 0: every "
                   "weight trained)"),
    lora_targets: Optional[str] = typer.Option(
        None, help="LoRA: the linears adapted, a comma list of qkv | proj | fc1 | fc2 (or "
                   "attention, mlp) (default: all four, Megatron-Bridge's)"),
    lora_base: Optional[str] = typer.Option(
        None, help="LoRA: the frozen base held in bf16 (default) | fp8 (its linears in FP8, "
                   "NeMo's fp8_params; precision fp8)"),
    routing: Optional[str] = typer.Option(None, help="MoE tokens per expert: balanced | "
                                          "zipf:S | imbalance:F | histogram:..."),
    set_: list[str] = typer.Option([], "--set", help="hardware what-if, e.g. "
                                   "nic_bandwidth=800Gb/s (repeat for more)"),
    cost_model: Optional[str] = typer.Option(None, "--cost-model", metavar="MODULE:FACTORY",
                                             help="a third-party cost model"),
    trace: Optional[str] = typer.Option(None, help="write the predicted timeline "
                                        "(Chrome/Perfetto trace JSON)"),
    save_run: Optional[str] = typer.Option(None, "--save-run", help="write the run as YAML"),
    cache: Optional[str] = typer.Option(None, help="stage-program cache directory "
                                        "(default: $FLINT_CACHE or ~/.cache/flint)"),
    as_json: bool = typer.Option(False, "--json", help="print the prediction as JSON"),
):
    """Predict one training configuration's step: time, MFU, memory, communication."""
    flags = dict(model=model, seq_len=seq_len, devices=devices, hardware=hardware,
                 devices_per_host=devices_per_host, tp=tp, sp=sp, cp=cp, pp=pp, vp=vp,
                 schedule=schedule, pipeline_split=pipeline_split,
                 pipeline_p2p=pipeline_p2p, pipeline_scatter_gather=pipeline_scatter_gather, ep=ep,
                 dispatcher=dispatcher, zero=zero, hsdp=hsdp, zero_sync=zero_sync,
                 grad_reduce_dtype=grad_reduce_dtype, micro_batch=micro_batch,
                 global_batch=global_batch, remat=remat, recompute_layers=recompute_layers,
                 precision=precision, fp8_recipe=fp8_recipe,
                 framework=framework, attention=attention,
                 attention_dropout=attention_dropout, score_path=score_path,
                 overlap_grad_reduce=overlap_grad_reduce, tp_comm_overlap=tp_comm_overlap,
                 tp_grad_overlap=tp_grad_overlap, collective_matmul=collective_matmul,
                 launch_blocking=launch_blocking, cuda_graphs=cuda_graphs,
                 xla_emitters=xla_emitters,
                 reshard_after_forward=reshard_after_forward,
                 grad_accumulation=grad_accumulation, grad_sync=grad_sync,
                 routing=routing, lora_rank=lora_rank, lora_targets=lora_targets,
                 lora_base=lora_base)

    def go():
        from flint.engine import predict as run_predict
        from flint.prediction_report import render_prediction
        from flint.run import TrainingRun, run_document

        for flag, path in (("--trace", trace), ("--save-run", save_run)):
            if path:
                check_output_file(path, flag)
        factory = cost_model_option(cost_model)
        the_run = TrainingRun.from_json(run_document(run_file, flags),
                                        run_file or "flint predict")
        t0 = time.perf_counter()
        note = err.status(f"pricing {the_run.label()}", spinner="dots") \
            if err.is_terminal else None
        if note is not None:
            note.start()
        try:
            p = run_predict(the_run, factory, set_, cache, timeline=bool(trace))
        finally:
            if note is not None:
                note.stop()
        wall = time.perf_counter() - t0
        if trace:
            from flint.exporters.perfetto import write_timeline

            write_timeline(p.timeline, trace)
        if save_run:
            from flint.io import write_atomic

            write_atomic(save_run, the_run.to_yaml())
        report_out(p.to_json(), as_json, render_prediction)
        err.print(f"{'compiled the stage program and priced' if p.extracted else 'priced'} "
                  f"in {wall:.2f} s (stage program {p.program_key})", markup=False,
                  highlight=False)

    run(go)
