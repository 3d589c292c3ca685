"""`flint extract`: options -> an ExtractRequest -> flint.frontends.extract -> a summary."""
from __future__ import annotations

import os
from typing import Optional

import typer
from flint.cli._common import check_output_file, err, print_json, run


def extract(
    target: Optional[str] = typer.Argument(
        None, help="SCRIPT.py:FUNCTION of a training step, an XLA dump (DIR[:MODULE] or "
                   "an HLO file); default: the built-in --model"),
    devices: Optional[int] = typer.Option(
        None, "--devices", "-n", help="virtual cluster size (default 4096; an XLA dump: its "
                                       "own count; a decorated step: its decorator's)"),
    mesh: Optional[str] = typer.Option(
        None, help="mesh axes, e.g. data=512,model=8 (default: the preset's recipe, "
                   "llama3-8b: data=N/8,fsdp=8; other zoo models fsdp=N/8,model=8; "
                   "data=N for scripts)"),
    hardware: Optional[str] = typer.Option(
        None, help="hardware spec, compiled for its target (default h100-sxm; an XLA dump: "
                   "its GPU; see `flint hardware`)"),
    model: str = typer.Option("llama3-8b", help="built-in model when no TARGET is given: a "
                              "zoo/preset name, a model YAML or a Hugging Face config.json"),
    model_config: Optional[str] = typer.Option(None, help="model YAML or HF config.json "
                                               "(same as --model FILE)"),
    dims_layers: Optional[int] = typer.Option(None, "--n-layers", help="model: layers"),
    dims_hidden: Optional[int] = typer.Option(None, "--hidden", help="model: hidden size"),
    dims_heads: Optional[int] = typer.Option(None, "--heads", help="model: attention heads"),
    dims_kv: Optional[int] = typer.Option(None, "--kv-heads", help="model: KV heads"),
    dims_ffn: Optional[int] = typer.Option(None, "--ffn", help="model: FFN hidden size"),
    dims_vocab: Optional[int] = typer.Option(None, "--vocab", help="model: vocabulary"),
    dims_norm: Optional[str] = typer.Option(None, "--norm", help="model: rms | layer"),
    dims_act: Optional[str] = typer.Option(None, "--activation", help="model: swiglu | gelu "
                                           "| relu | relu2"),
    dims_pos: Optional[str] = typer.Option(None, "--positional", help="model: rope | learned"),
    gemm_precision: Optional[str] = typer.Option(None, help="zoo: GEMM operands bf16 | fp8 "
                                                 "| fp8-delayed | mxfp8 | nvfp4"),
    attention: Optional[str] = typer.Option(
        None, help="zoo: attention core flash | unfused (S x S scores through memory) | "
                   "unfused-half (those in the compute dtype, as Megatron); the torch twin's "
                   "unfused is eager PyTorch's score path; any torch step: the kernel SDPA "
                   "runs, flash2 (default) | cudnn (Hopper/Blackwell builds for CUDA 12.9+)"),
    attention_dropout: float = typer.Option(
        0.0, help="torch twin, --attention unfused: dropout probability on the attention "
                  "probabilities (Megatron-LM's --attention-dropout; default 0: none)"),
    lora_rank: int = typer.Option(0, help="zoo: LoRA fine-tuning, the adapters' rank on a "
                                  "frozen base (default 0: every weight trained)"),
    lora_targets: str = typer.Option("qkv,proj,fc1,fc2", help="zoo: LoRA's linears, a comma "
                                     "list of qkv | proj | fc1 | fc2 (or attention, mlp)"),
    scan: Optional[bool] = typer.Option(None, "--scan/--unroll", help="zoo: layers in "
                                        "lax.scan or not (default: JAX scans; torch unrolls)"),
    layers: Optional[int] = typer.Option(None, help="zoo: override the layer count"),
    seq_len: Optional[int] = typer.Option(None, help="zoo: override the sequence length"),
    batch_per_replica: int = typer.Option(1, help="zoo: sequences per data-parallel replica"),
    remat: Optional[str] = typer.Option(None, help="zoo: none | full | dots | selective "
                                        "(default: the preset's recipe, llama3-8b: full; "
                                        "else selective)"),
    sequence_parallel: bool = typer.Option(False, help="zoo: shard activations' sequence dim "
                                                       "over the TP axis"),
    devices_per_host: Optional[int] = typer.Option(None, help="devices per host (GPU: 8)"),
    args_fn: str = typer.Option("example_args", help="script: function giving example args"),
    with_estimate: bool = typer.Option(False, "--estimate", help="also predict the step "
                                       "time with the built-in cost model"),
    set_: list[str] = typer.Option([], "--set", help="with --estimate: what-if, e.g. "
                                                     "nic_bandwidth=800Gb/s"),
    passes: str = typer.Option("", help="graph passes to run, e.g. 'expand-loops'"),
    dump_dir: Optional[str] = typer.Option(None, help="dump the graph as text after "
                                                      "lowering and after each pass"),
    out: Optional[str] = typer.Option(None, help="write the graph as JSON to this file"),
    as_json: bool = typer.Option(False, "--json", help="print the summary as JSON"),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="every argument's sharding "
                                 "(default: the largest and the totals)"),
    framework: str = typer.Option("jax", help="jax | torch (TARGET or --model); a .mlir "
                                  "TARGET is StableHLO"),
    fuse: bool = typer.Option(True, "--fuse/--no-fuse", help="torch: fuse pointwise chains "
                              "as torch.compile would"),
):
    """Compile a training step for N compile-only devices and build its workload graph."""
    dims = {k: v for k, v in dict(layers=dims_layers, hidden=dims_hidden, heads=dims_heads,
                                  kv_heads=dims_kv, ffn=dims_ffn, vocab=dims_vocab,
                                  norm=dims_norm, activation=dims_act,
                                  positional=dims_pos).items() if v is not None}
    from flint.frontends.request import ExtractRequest

    request = ExtractRequest(
        target=target, devices=devices, mesh=mesh, hardware=hardware,
        model=model_config or model, framework=framework, devices_per_host=devices_per_host,
        scan=scan, layers=layers, seq_len=seq_len, batch_per_replica=batch_per_replica,
        remat=remat, sequence_parallel=sequence_parallel, dims=dims,
        gemm_precision=gemm_precision, attention=attention,
        attention_dropout=attention_dropout, args_fn=args_fn, fuse=fuse, passes=passes,
        lora=(lora_rank, lora_targets) if lora_rank else ())
    run(lambda: _extract(request, out, as_json, dump_dir, with_estimate, set_, verbose))


def _extract(request, out, as_json, dump_dir=None, with_estimate=False, overrides=(),
             verbose=False):
    from flint.frontends.request import extract

    request.check()
    if with_estimate or overrides:
        from flint.hardware_models.spec import load_spec
        from flint.hardware_models.topology import topology_for

        # bad --set values, or a cluster the devices do not fit, fail before compiling
        topology_for(load_spec(request.target_hardware, overrides), request.device_count)
    for path in filter(None, (out, dump_dir and os.path.join(dump_dir, "x"))):
        check_output_file(path)
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  console=err, transient=True, disable=not err.is_terminal) as progress:
        task = progress.add_task("starting JAX", total=None)

        def stage(text):
            progress.update(task, description=text)

        graph, timings = extract(request, stage, _dumper(dump_dir))
        if out:
            stage(f"writing {out}")
            graph.save(out)
    summary = graph.summary()
    predicted = None
    if with_estimate:
        from flint.hardware_models.estimate import estimate as run_estimate

        predicted = run_estimate(graph, None, overrides).to_json()
    if as_json:
        report = {"summary": summary, "timings_s": timings}
        if predicted is not None:
            report["estimate"] = predicted
        print_json(report)
    else:
        from flint.render import render_estimate, render_summary, report_console

        console = report_console()
        render_summary(summary, console, timings, verbose=verbose)
        if predicted is not None:
            render_estimate(predicted, console)
        if out:
            err.print(f"wrote {out} ({os.path.getsize(out) / 2**20:.2f} MiB)",
                      markup=False)


def _dumper(dump_dir):
    """Callback writing `00-lower-hlo.txt`, `01-<pass>.txt`, ... into dump_dir."""
    from flint.io import write_atomic

    count = [0]

    def dump(p, graph):
        if dump_dir:
            name = p.name if p is not None else "lower-hlo"
            write_atomic(os.path.join(dump_dir, f"{count[0]:02d}-{name}.txt"), graph.as_text())
        count[0] += 1

    return dump
