"""What `flint.engine.predict` returns: a Prediction (step, utilization, memory, the
breakdowns and the facts it rests on) and how those facts are read off the priced graph."""
from __future__ import annotations

from dataclasses import dataclass, field

from flint.framework_rules import (QUANTIZED, amax_local_to_tp, parameter_gather,
                                   unsharded_gradient_accumulation,
                                   weight_casts_held_for_step)
from flint.models import OFFLOADED_NAMES
from flint.run import TrainingRun


@dataclass
class Prediction:
    """What a run costs per step on its hardware (per device where it says so)."""

    run: TrainingRun
    what_if: tuple
    step_time_s: float
    tokens_per_s: float                 # the whole cluster
    tokens_per_s_per_device: float
    mfu: float
    hfu: float
    compute_busy_s: float
    exposed_communication_s: float
    bubble_fraction: float
    memory_bytes: float                 # per device, peak
    memory_capacity_bytes: float
    oom: bool
    memory: dict                        # the split (parameters, gradients, optimizer, ...)
    by_class_s: dict
    by_layer_s: dict
    collectives_s: dict
    pipeline: dict
    facts: dict                         # what the prediction rests on
    program_key: str
    extracted: bool                     # whether the stage program was compiled now
    wall_s: float = 0.0
    cost_model: str = ""
    moe_routing: dict | None = None     # MoE runs: the routing report (passes.moe_routing)
    estimate: object = field(default=None, repr=False)   # hardware_models Estimate

    @property
    def timeline(self):
        return self.estimate.timeline if self.estimate is not None else None

    def to_json(self) -> dict:
        """The prediction as JSON (no wall time: equal runs give equal documents)."""
        d = {k: v for k, v in self.__dict__.items()
             if k not in ("run", "estimate", "wall_s", "extracted")}
        d["run"] = self.run.to_json()
        d["run_key"] = self.run.key()
        d["what_if"] = list(self.what_if)
        return d


def prediction_facts(run: TrainingRun, graph, what_if, points=None) -> dict:
    """The facts a prediction rests on, stated with it (flint predict prints them)."""
    from flint.hardware_models.attention_kernels import family_name
    from flint.hardware_models.compute import attention_family
    from flint.hardware_models.composite import template_of
    from flint.hardware_models.nccl import generation
    from flint.hardware_models.spec import load_spec

    # the work of one micro-batch: the template's nodes for a layered graph
    source = template_of(graph) or graph
    spec = load_spec(run.hardware)
    gpu_generation = generation(spec.name, spec.model) if spec.kind == "gpu" else ""
    dtypes: dict[str, int] = {}
    attention: set = set()
    for n in source.nodes:
        if n.op_class == "gemm" and n.operands:
            d = n.operands[0].split("[", 1)[0]
            dtypes[d] = dtypes.get(d, 0) + 1
        elif n.op_class == "attention":
            attention.add(family_name(attention_family(n, gpu_generation), gpu_generation))
    collectives: set = set()
    for g in {id(source): source, id(graph): graph}.values():
        for n in g.nodes:
            if n.collective is not None and n.collective.type not in ("send", "recv"):
                axes = ",".join(g.communicators[n.collective.communicator].mesh_axes)
                collectives.add(n.collective.type + (f" over {axes}" if axes else ""))
    if run.pp > 1:
        collectives.add("send/recv over pipe")
    out = {} if run.recompute_share is None else {"block_recompute": (
        f"{run.recompute_layers} of {run.layers_per_chunk:g} "
        f"layers per chunk recomputed: priced {run.recompute_share:.0%} of the way from "
        f"no recompute to remat full (layers alike, their work and activations add up)")}
    if run.remat == "selective":
        out["recompute"] = (
            "selective: PyTorch selective activation checkpointing, torchtitan's op policy "
            "(every second matmul of a block and its pointwise ops re-run; the attention "
            "core keeps its output)" if run.framework.startswith("torch") else
            "selective: the attention core re-runs in the backward (Megatron-Core's "
            "selective recompute, Korthikanti et al. 2022)")
    if run.remat in OFFLOADED_NAMES:
        out["recompute"] = (
            f"{run.remat}: MaxText's host offload; the offloaded tensors' copies to and from "
            "pinned host memory are priced as the device-memory copies XLA emits for them "
            "(the host link, PCIe, is not modelled), the rest of each layer re-runs")
    if run.precision == "fp8":
        out["fp8_scaling"] = (
            "delayed: per-tensor scales from earlier steps' amax history, the cast the only "
            "pass over each tensor (Transformer Engine DelayedScaling)"
            if run.fp8_recipe == "delayed" else
            "current: per-tensor scales from each tensor's own amax, a pass over it before "
            "its cast (" + ("torchao Float8Linear, tensorwise dynamic scaling; the LM head "
                            "in bf16" if run.framework.startswith("torch") else
                            "Transformer Engine Float8CurrentScaling") + ")")
    if run.precision == "nvfp4":
        out["fp4_scaling"] = (
            "Transformer Engine NVFP4BlockScaling: E2M1 elements, an E4M3 scale per 16 "
            "(weights: per 16 x 16), an FP32 scale per tensor from its amax; all three GEMMs "
            "at the FP4 tensor rate; the weight gradient's operands Hadamard-transformed "
            "inside their cast; parameters gathered in bf16")
    if run.precision in QUANTIZED:
        out["fp8_weight_casts"] = (
            "once per step, in the first micro-batch, reused by the others (Transformer "
            "Engine's cached FP8 weights: Megatron-Core's is_first_microbatch)"
            if weight_casts_held_for_step(run) else
            "where the program casts them (every micro-batch unless the compiler hoists "
            "the cast)")
    out.update(hardware_facts(run, spec, dtypes))
    if amax_local_to_tp(run):
        out["fp8_amax"] = ("each rank's own shard, reduced over the tensor-parallel group "
                           "where the tensor is gathered in FP8 (Transformer Engine's "
                           "quantizers)")
    if run.zero in (1, 2) and run.zero_sync == "reduce-scatter":
        out["parameter_gathers"] = (
            "in the first micro-batch's forward, one bucket ahead of the layer that uses it "
            "(Megatron-Core's overlap_param_gather)" if parameter_gather(run) == "prefetch"
            else "all at the start of the step, after the optimizer's update")
    if unsharded_gradient_accumulation(run):
        out["gradient_sums"] = (
            "FSDP2 with its gradient sync off: each micro-batch's bf16 gradient added into the "
            "whole parameter's fp32 sum, held for the step and reduce-scattered in the last "
            "backward (FSDPParam.accumulate_unsharded_grad_if_needed)")
    if any(n.meta.get("held") == "step" for n in graph.nodes):
        out["parameter_gathers"] = (
            "once per step, each layer's before its first micro-batch and held until the "
            "last backward (FSDP under a pipeline: torch.distributed.pipelining, torchtitan)")
    return {**out, "seq_len": run.seq_len, "global_batch_sequences": run.global_batch,
            "micro_batch": run.micro_batch, "microbatches": run.microbatches,
            "tokens_per_step": run.tokens_per_step, "gemm_dtypes": dict(sorted(dtypes.items())),
            "collectives": sorted(collectives), "framework": run.framework,
            "attention_kernels": sorted(attention),
            "grad_accumulation": run.grad_accumulation, "grad_sync": run.grad_sync,
            "zero": run.zero, "what_if": list(what_if),
            "pipeline_simulated_microbatches": list(points or (run.microbatches,))}


def hardware_facts(run: TrainingRun, spec, gemm_dtypes: dict) -> dict:
    """What a prediction on `spec` rests on besides the spec's figures: the target its
    program was compiled for where that is another GPU's, and the rate 16-bit GEMMs run at
    on a GPU without BF16 tensor cores."""
    from flint.stage import attention_core, compile_target

    out = {}
    core = attention_core(run)
    if core != run.attention:
        out["attention_core"] = (f"{core}: {spec.name} has no fused attention "
                                 "kernel (FlashAttention and cuDNN's need sm80 or later)")
    if core == "unfused" and run.framework.startswith("torch"):
        dropout = (f", dropout {run.attention_dropout:g}" if run.attention_dropout else "")
        kernels = ("each its own kernel" if run.framework == "torch-eager" else
                   "Inductor fusing the pointwise steps between the GEMMs")
        out["attention_core"] = (out.get("attention_core", "unfused") + "; PyTorch's score "
                                 f"path: QK^T, scale, mask, softmax{dropout}, PV, {kernels}")
    target = compile_target(run)
    if target != spec.name and spec.kind == "gpu":
        out["compiled_for"] = f"compiled for {target}, priced on {spec.name}"
        if spec.sources.get("compile_target"):
            out["compiled_for_why"] = spec.sources["compile_target"]
    if "bf16" in gemm_dtypes and "bf16" not in spec.peak_flops and "fp16" in spec.peak_flops:
        out["sixteen_bit"] = (f"at the FP16 tensor rate: {spec.name} has no BF16 tensor cores "
                              "(a 16-bit run there is FP16 mixed precision)")
    return out
