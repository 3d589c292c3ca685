"""A prediction as tables for a terminal or a log (every number with its unit)."""
from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from flint.hardware_models.units import fmt_bytes, fmt_seconds


WIDTH = 120


# how each gradient-accumulation mode sums the micro-batches (passes.grad_accumulation)
_ACCUMULATION = {"in-gemm": "in-gemm: inside the weight-gradient GEMMs (no kernel of its own)",
                 "autograd": "autograd: PyTorch's in-place add into .grad per micro-batch",
                 "fp32-copy": "fp32-copy: bf16 gradients cast and added to fp32 per "
                              "micro-batch (DeepSpeed BF16 optimizer)"}

# when the data-parallel reduction runs in a step of several micro-batches (run.GRAD_SYNC)
_SYNC = {"every-microbatch": "every micro-batch's backward (PyTorch DDP/FSDP2 default, ZeRO-2)",
         "last-microbatch": "the last micro-batch's backward only (no_sync: Megatron, "
                            "torch.distributed.pipelining)"}


# how a stage's boundary sends and receives run beside its compute (passes.pipeline)
_P2P = {"posted-ahead": "posted ahead (the stage computes on while they move)",
        "blocking": "blocking: each step's sends and receives waited on together "
                    "(Megatron's 1F1B)",
        "blocking-serial": "blocking, one send or receive at a time (DeepSpeed's "
                           "PipelineEngine)"}


def wide(console: Console, width: int = WIDTH) -> Console:
    """Off a terminal (a log, a pipe) tables get `width` columns instead of 80, so that
    their names and numbers are not cut."""
    if not console.is_terminal and console.width < width:
        return Console(width=width, file=console.file)
    return console


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def render_prediction(p: dict, console: Console) -> None:
    """`p`: Prediction.to_json()."""
    console = wide(console)
    run = p["run"]
    step = p["step_time_s"]
    t = Table(title=escape(f"{_model_name(run['model'])} on {run['devices']} x "
                           f"{run['hardware']}" + (f" [{', '.join(p['what_if'])}]"
                                                    if p["what_if"] else "")),
              show_header=False, title_justify="left")
    t.add_column("what", no_wrap=True)
    t.add_column("value", justify="right", overflow="fold")
    t.add_row("parallelism", _layout(run, p["facts"]))
    t.add_row("batch", f"{p['facts']['global_batch_sequences']} sequences x "
              f"{p['facts']['seq_len']} tokens = {p['facts']['tokens_per_step']:,} tokens/step "
              f"({p['facts']['microbatches']} micro-batches of {p['facts']['micro_batch']})")
    t.add_row("step time", fmt_seconds(step))
    t.add_row("throughput", f"{p['tokens_per_s']:,.0f} tokens/s "
              f"({p['tokens_per_s_per_device']:,.0f} tokens/s/device)")
    t.add_row("MFU / HFU", f"{_pct(p['mfu'])} / {_pct(p['hfu'])}")
    if run["precision"] != "bf16":
        # the convention of the published tables: model flops over the dense BF16 peak
        faster = ("FP4 GEMMs at up to four (Blackwell Ultra: six) times it"
                  if run["precision"] == "nvfp4" else "FP8 GEMMs at up to twice it")
        t.add_row("  MFU / HFU basis", f"the dense BF16 peak; {faster}, so a share above "
                  f"100% is possible")
    if run.get("lora_rank"):
        # a LoRA step never forms the frozen weights' gradients (flint.models.lora)
        t.add_row("  LoRA model flops", "4 per frozen weight and token (forward, input "
                  "gradient), 6 per adapter weight")
    if p["mfu"] > p["hfu"]:
        # model flops follow PaLM (Chowdhery et al. 2022, app. B) and Megatron-LM
        # (Narayanan et al. 2021): the causal S x S product counted whole, as published
        # MFUs count it; hardware flops are what the kernels run
        t.add_row("  why MFU > HFU", "MFU counts causal attention whole (PaLM, Megatron-LM); "
                  "the attention kernels skip its masked half")
    t.add_row("compute stream busy", fmt_seconds(p["compute_busy_s"]) + _share(
        p["compute_busy_s"], step))
    t.add_row("exposed communication", fmt_seconds(p["exposed_communication_s"]) + _share(
        p["exposed_communication_s"], step))
    if run["pp"] > 1:
        t.add_row("pipeline bubble", f"{_pct(p['bubble_fraction'])} of the pipelined part")
        sends = _P2P.get(run.get("pipeline_p2p"), "?")
        if run.get("pipeline_scatter_gather"):      # only where each rank holds it all
            sends += (f"; the boundary as {run['tp']} TP slices, all-gathered"
                      if run["tp"] > 1 and not run["sp"] else
                      "; scatter/gather has nothing to slice (" + (
                          "tp 1" if run["tp"] == 1 else "SP already sends 1/tp") + ")")
        t.add_row("  stage sends", sends)
    verdict = "OUT OF MEMORY" if p["oom"] else "fits"
    t.add_row("memory per device", f"{fmt_bytes(p['memory_bytes'])} of "
              f"{fmt_bytes(p['memory_capacity_bytes'])}: {verdict}")
    mem = p.get("memory") or {}
    for cat, nbytes in sorted((mem.get("arguments_bytes") or {}).items()):
        t.add_row(f"  {cat.replace('_', ' ')}", fmt_bytes(nbytes))
    if mem.get("temporaries_peak_bytes") is not None:
        t.add_row("  activations and temporaries at the peak",
                  fmt_bytes(mem["temporaries_peak_bytes"]))
    facts = p["facts"]
    t.add_row("GEMM operand dtypes", ", ".join(f"{k} ({v} GEMMs)" for k, v in
                                               facts["gemm_dtypes"].items()) or "none")
    if facts.get("compiled_for"):
        t.add_row("graph", facts["compiled_for"])
    if facts.get("sixteen_bit"):
        t.add_row("16-bit GEMMs", facts["sixteen_bit"])
    t.add_row("kernels", f"{facts['framework']}")
    if facts.get("attention_kernels"):
        t.add_row("  attention", "; ".join(facts["attention_kernels"]))
    if facts.get("attention_core"):
        t.add_row("  attention core", facts["attention_core"])
    if run.get("launch_blocking"):
        t.add_row("  launches", "blocking (CUDA_LAUNCH_BLOCKING=1): each kernel waits for its "
                  "launch's round trip, and nothing overlaps")
    if run.get("cuda_graphs") is not None:
        t.add_row("  launches", "from CUDA graphs: no host launch or launch gap per kernel"
                  if run["cuda_graphs"] else "one by one: each kernel starts a launch gap "
                  "after the last")
    if facts.get("grad_accumulation"):
        t.add_row("gradient accumulation", _ACCUMULATION.get(facts["grad_accumulation"],
                                                             facts["grad_accumulation"]))
    if facts.get("gradient_sums"):
        t.add_row("  gradient sums", facts["gradient_sums"])
    if facts.get("grad_sync") and facts.get("microbatches", 1) > 1:
        t.add_row("gradient reduction", _SYNC.get(facts["grad_sync"], facts["grad_sync"]))
    if facts.get("parameter_gathers"):
        t.add_row("parameter gathers", facts["parameter_gathers"])
    if facts.get("fp8_scaling"):
        t.add_row("FP8 scaling", facts["fp8_scaling"])
    if facts.get("fp8_amax"):
        t.add_row("FP8 amax", facts["fp8_amax"])
    if facts.get("fp4_scaling"):
        t.add_row("NVFP4 scaling", facts["fp4_scaling"])
    if facts.get("fp8_weight_casts"):
        t.add_row("FP8 weight casts", facts["fp8_weight_casts"])
    if facts.get("recompute"):
        t.add_row("recompute", facts["recompute"])
    if facts.get("block_recompute"):
        t.add_row("block recompute", facts["block_recompute"])
    console.print(t)
    c = Table(title="Time by op class (busiest device, summed over the step)",
              title_justify="left")
    c.add_column("class", no_wrap=True)
    c.add_column("time", justify="right")
    c.add_column("share of step", justify="right")
    for k, v in sorted(p["by_class_s"].items(), key=lambda kv: (-kv[1], kv[0])):
        if v > 0:
            c.add_row(k, fmt_seconds(v), _pct(v / step) if step else "-")
    console.print(c)
    console.print("collectives: " + "; ".join(facts["collectives"]) if facts["collectives"]
                  else "collectives: none", highlight=False, soft_wrap=True)
    render_what_if_effects(facts.get("what_if_effects") or [], console)


def render_what_if_effects(effects: list[dict], console: Console) -> None:
    """One line per what-if: applied, or what it did not change and why."""
    from flint.what_if_effects import describe

    for e in effects:
        console.print(f"what-if {describe(e)}", highlight=False, markup=False,
                      soft_wrap=True)


def _share(x: float, step: float) -> str:
    return f" ({100 * x / step:.0f}% of step)" if step else ""


def _model_name(model) -> str:
    if isinstance(model, dict):
        return str(model.get("name") or model.get("base") or "custom model")
    return str(model)


def _layout(run: dict, facts: dict) -> str:
    dp = run["devices"] // (run["tp"] * run["cp"] * run["pp"])
    parts = [f"tp {run['tp']}" + (" + sp" if run["sp"] else "")]
    for key in ("cp", "pp", "vp", "ep"):
        if run[key] > 1:
            parts.append(f"{key} {run[key]}")
    if run["pp"] > 1:
        parts.append(run["schedule"])
    zero = {0: "all-reduce", 1: "ZeRO-1 (distributed optimizer)", 2: "ZeRO-2",
            3: "ZeRO-3 (FSDP)"}[run["zero"]]
    if run.get("zero_sync") == "broadcast":
        zero += ", gradients all-reduced, parameters broadcast by their owners"
    elif run.get("zero_sync") == "all-reduce":
        zero += ", gradients all-reduced, parameters all-gathered"
    if run.get("grad_reduce_dtype", "fp32") != "fp32":
        zero += f", gradients reduced in {run['grad_reduce_dtype']}"
    if run["hsdp"]:
        zero += (f", HSDP groups of {run['hsdp']}" if run["zero"] == 3 else
                 f", state sharded over groups of {run['hsdp']}")
    parts.append(f"dp {dp} {zero}")
    parts.append(f"remat {run['remat']}")
    parts.append(run["precision"])
    if run.get("lora_rank"):
        parts.append(f"LoRA rank {run['lora_rank']} on {run['lora_targets']} over a frozen "
                     f"{run.get('lora_base', 'bf16')} base")
    return ", ".join(parts)
