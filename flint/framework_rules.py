"""How a run's framework behaves where the extracted step does not show it: the rules that
set the engine's pass options from a TrainingRun's fields (flint.engine) and the facts a
prediction states about them (flint.prediction)."""
from __future__ import annotations

from flint.run import TrainingRun

# the precisions whose GEMM operands Transformer Engine quantizes from bf16 tensors
QUANTIZED = ("fp8", "mxfp8", "nvfp4")


def gathers_held_for_step(run: TrainingRun) -> bool:
    """FSDP under a pipeline schedule gathers each layer's parameters once per step and
    holds them through its micro-batches (passes.layer_gathers: torch.distributed.pipelining
    with FSDP2 and reshard_after_forward False, torchtitan's default under a pipeline,
    Llama 3); XLA's pipelined programs (MaxText's default, pipeline_fsdp_ag_once=False) and
    runs without a pipeline gather in every micro-batch."""
    return run.zero == 3 and run.pp > 1 and run.framework != "xla"


def unsharded_gradient_accumulation(run: TrainingRun) -> bool:
    """FSDP2 with its gradient sync off (set_requires_gradient_sync(False): every
    micro-batch's backward but the last under torch.distributed.pipelining) keeps each
    parameter's unsharded gradient and adds the next micro-batches' into it, in the
    reduce dtype (fp32 under Flint's torch twin's MixedPrecisionPolicy): FSDPParam's
    to_accumulated_grad_if_needed and accumulate_unsharded_grad_if_needed
    (torch/distributed/fsdp/_fully_shard/_fsdp_param.py); the last backward reduce-scatters
    the sum (passes.grad_accumulation `unsharded`)."""
    return (run.framework.startswith("torch") and run.zero == 3
            and run.grad_sync == "last-microbatch")


def weight_casts_held_for_step(run: TrainingRun) -> bool:
    """Megatron-Core with Transformer Engine casts each weight to FP8 once per step, in
    the first micro-batch, and reuses it in the others (passes.layer_template cast_once);
    FSDP (zero 3) gathers its weights anew, XLA and PyTorch cast where their programs do."""
    return (run.framework == "megatron" and run.precision in QUANTIZED and run.zero != 3)


def amax_local_to_tp(run: TrainingRun) -> bool:
    """Transformer Engine scales an FP8 tensor from its own shard's amax, reduced over the
    tensor-parallel group at most (passes.amax_scope); the extracted step reduces it over
    every axis the tensor is sharded on. NVFP4's tensor scale (its second level) comes
    from the same quantizers (NVFP4Quantizer's with_amax_reduction)."""
    return run.framework == "megatron" and run.precision in QUANTIZED


def parameter_gather(run: TrainingRun) -> str:
    """When a sharded optimizer (zero 1/2) gathers the updated parameters
    (passes.distributed_optimizer gather): Megatron-Core with overlapped gradient reduction
    prefetches them bucket by bucket in the first micro-batch's forward (overlap_param_gather,
    which Megatron-LM allows only with overlap_grad_reduce and NeMo / Megatron-Bridge
    recipes and NVIDIA's MLPerf configs turn on with it); other runs gather them all at the
    start of the step (DeepSpeed's optimizer step, Megatron without the overlap)."""
    return ("prefetch" if run.framework == "megatron" and run.zero in (1, 2)
            and run.zero_sync == "reduce-scatter" and run.overlap_grad_reduce else "step")


def gathered_weights_freed(run: TrainingRun) -> bool:
    """FSDP2 with reshard_after_forward frees a layer's gathered weights after its forward
    (the torch twin's trace shows them read again by the backward's re-gather)."""
    return run.framework.startswith("torch") and run.zero == 3 and run.reshard_after_forward
