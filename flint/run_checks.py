"""Why a TrainingRun cannot run: one line naming the field and the reason.

The schema (flint.run_schema.RunSchema) checks each field alone; these check fields against each
other, against the model's shape and against the hardware spec, in the order a user would
fix them (cluster split first, then batch, then model fit)."""
from __future__ import annotations

from flint.errors import FlintError
from flint.hardware_models.attention_kernels import SDPA_KERNELS
from flint.models import OFFLOADED_NAMES


# What a torch run's attention may say: flash (SDPA's default kernel) or one of the fused
# kernels SDPA selects among (hardware_models.attention_kernels.SDPA_KERNELS)
TORCH_SDPA_KERNELS = ("flash",) + SDPA_KERNELS
# Fused kernels by the GPU generations they are built for: FlashAttention-3's kernels are
# Hopper's (Dao-AILab/flash-attention hopper/ README: "H100 / H800 GPU"); cuDNN's fused
# attention runs on NVIDIA GPUs from Ampere (cuDNN Graph API, SDPA support surface: sm80
# and later); FlashAttention v1/v2 on any CUDA or ROCm GPU
NVIDIA_GENERATIONS = ("ampere", "hopper", "blackwell")
KERNEL_GENERATIONS = {"flash3": ("hopper",), "cudnn": NVIDIA_GENERATIONS}


def check_run(run) -> None:
    from flint.frontends.targets import import_jax_quietly

    import_jax_quietly()        # the model zoo imports JAX: no CUDA-plugin noise first
    _cluster(run)
    _framework(run)
    _batch(run)
    cfg = _model(run)
    _lora(run, cfg)
    _pipeline(run, cfg)
    _parallel_fit(run, cfg)
    _hardware(run)


def _cluster(run) -> None:
    per = run.tp * run.cp * run.pp
    if run.devices % per:
        raise FlintError(f"devices: {run.devices} do not split into tp {run.tp} x cp {run.cp} "
                         f"x pp {run.pp} ({run.devices} is not a multiple of {per})")
    if run.tp_comm_overlap and not (run.tp > 1 and run.sp):
        raise FlintError("tp_comm_overlap: TP communication overlap pipelines the sequence-"
                         "parallel all-gathers and reduce-scatters: it needs tp > 1 and sp")
    if run.tp_grad_overlap and run.tp == 1:
        raise FlintError("tp_grad_overlap: the backward's input-gradient reduction runs over "
                         "the tensor-parallel ranks and needs tp > 1")
    if run.sp and run.tp == 1:
        raise FlintError("sp: sequence parallelism shards activations over the tensor-parallel "
                         "ranks and needs tp > 1")
    dp = run.devices // per
    if dp % run.ep:
        raise FlintError(f"ep: {run.ep} expert-parallel ranks do not divide the {dp} "
                         f"data-parallel ranks (EP is carved out of data parallelism)")
    if run.hsdp:
        if run.zero == 0:
            raise FlintError(f"hsdp: a shard group ({run.hsdp}) needs a sharded optimizer "
                             f"(zero 1 or 2) or FSDP (zero 3), not zero 0")
        if (dp // run.ep) % run.hsdp:
            raise FlintError(f"hsdp: {run.hsdp} does not divide the {dp // run.ep} "
                             f"data-parallel ranks it shards over")
    if run.devices_per_host and run.devices % min(run.devices_per_host, run.devices):
        raise FlintError(f"devices_per_host: {run.devices} devices do not fill hosts of "
                         f"{run.devices_per_host}")


def _framework(run) -> None:
    """What the PyTorch twin (flint/models/torch_decoder.py) cannot run, by field."""
    _attention_dropout(run)
    _grad_sync(run)
    _zero_sync(run)
    _launch_blocking(run)
    if run.remat in OFFLOADED_NAMES and run.framework != "xla":
        raise FlintError(f"remat: {run.remat} is MaxText's host offload (XLA's async copies "
                         f"to pinned host memory): framework xla, not {run.framework}")
    if run.xla_emitters != "mlir" and run.framework != "xla":
        raise FlintError(f"xla_emitters: {run.framework} does not run XLA's fusion emitters "
                         f"(the choice is for framework xla)")
    if run.reshard_after_forward and run.zero == 3 and run.pp > 1 and \
            run.framework.startswith("torch"):
        raise FlintError("reshard_after_forward: under a pipeline torch.distributed.pipelining "
                         "keeps FSDP2's parameters gathered after each backward but the "
                         "last (set_reshard_after_backward(False)), so resharding after the "
                         "forward regathers once per micro-batch, which Flint does not "
                         "price: leave it unset (False under a pipeline, torchtitan's "
                         "default)")
    if not run.reshard_after_forward:
        if run.zero != 3:
            raise FlintError("reshard_after_forward: only FSDP (zero 3) reshards parameters")
        if not run.framework.startswith("torch"):
            raise FlintError(f"reshard_after_forward: {run.framework} runs XLA's FSDP "
                             f"program, which decides itself when to gather (FSDP2's "
                             f"option: framework torch-eager or torch-compile)")
    if not run.framework.startswith("torch"):
        return
    name = run.framework
    if run.cp > 1:
        raise FlintError(f"cp: {name} runs the torch twin, which has no context "
                         f"parallelism (framework megatron or xla has)")
    if (run.precision, run.fp8_recipe) not in (("bf16", "current"), ("fp8", "current")):
        raise FlintError(f"precision: {name} runs bf16 GEMMs under autocast, or fp8 as "
                         f"torchao's Float8Linear does (tensorwise dynamic scaling: "
                         f"fp8_recipe current); {run.precision} with {run.fp8_recipe} "
                         f"scaling is Transformer Engine's (framework megatron)")
    if run.attention not in TORCH_SDPA_KERNELS + ("unfused",):
        raise FlintError(f"attention: {name} runs SDPA's fused attention: "
                         f"{' | '.join(TORCH_SDPA_KERNELS)} (flash: its FlashAttention-2), "
                         f"or unfused (eager PyTorch's score path), not {run.attention}")
    if run.remat == "dots":
        raise FlintError(f"remat: {name} runs none | selective | full (selective: "
                         f"torchtitan's op-level selective activation checkpointing); dots "
                         f"is the JAX twin's policy")
    if run.grad_accumulation != "autograd":
        whose = {"in-gemm": "Megatron's gradient-accumulation fusion and XLA's",
                 "fp32-copy": "DeepSpeed's BF16 optimizer"}[run.grad_accumulation]
        raise FlintError(f"grad_accumulation: {name} sums micro-batch gradients the way "
                         f"PyTorch does (autograd: AccumulateGrad adds into .grad); "
                         f"{run.grad_accumulation} is {whose} (framework megatron or xla)")
    if run.zero in (1, 2):
        raise FlintError(f"zero: {name} runs DDP-style data parallelism (zero 0) or FSDP2 "
                         f"(zero 3), not zero {run.zero}")


def _attention_dropout(run) -> None:
    if not run.attention_dropout and run.score_path == "fused":
        return
    from flint.hardware_models.attention_kernels import compiled_core

    core = compiled_core(run.attention, run.hardware)
    if run.score_path != "fused" and (run.framework != "megatron" or core != "unfused"):
        raise FlintError(f"score_path: {run.score_path} is how Megatron-LM runs an unfused "
                         f"core's scale, mask and softmax (framework megatron, attention "
                         f"unfused), not {run.framework} with {core}; torch frameworks run "
                         f"the twin's own")
    if run.cp > 1:
        raise FlintError(f"{'score_path' if run.score_path != 'fused' else 'attention_dropout'}"
                         f": the unfused core's score path is priced without context "
                         f"parallelism (cp 1), not cp {run.cp}")
    if run.attention_dropout and core != "unfused":
        raise FlintError(f"attention_dropout: dropout on the attention probabilities is "
                         f"priced for an unfused core, not {core}: fused kernels are priced "
                         f"without their in-kernel dropout")
    if run.attention_dropout and run.framework == "xla":
        raise FlintError("attention_dropout: framework xla prices the JAX twin's program as "
                         "XLA compiles it, and that program has no dropout (framework "
                         "megatron or a torch one adds it)")


def _zero_sync(run) -> None:
    if run.fp8_recipe != "current" and run.precision != "fp8":
        raise FlintError(f"fp8_recipe: {run.fp8_recipe} scaling is a recipe of precision fp8 "
                         f"(Transformer Engine's per-tensor scaling), not {run.precision}")
    if run.zero_sync == "broadcast" and run.zero != 1:
        raise FlintError(f"zero_sync: broadcast is InternEvo's ZeRO-1 (gradients all-reduced, "
                         f"each owner broadcasting its parameters), not zero {run.zero}")
    if run.zero_sync == "all-reduce" and run.zero != 1:
        raise FlintError(f"zero_sync: all-reduce is DeepSpeed BF16_Optimizer's ZeRO-1 "
                         f"(gradients all-reduced, parameters all-gathered), not zero "
                         f"{run.zero}")
    if run.grad_reduce_dtype != "fp32" and (run.zero not in (1, 2)
                                            or run.framework != "megatron"):
        raise FlintError(f"grad_reduce_dtype: {run.grad_reduce_dtype} gradients are priced for "
                         f"a sharded optimizer's buffer (zero 1 or 2, framework megatron: "
                         f"Megatron-Core's grad_reduce_in_fp32=False); this run "
                         f"(zero {run.zero}, {run.framework}) reduces the gradients its "
                         f"program computes")


def _grad_sync(run) -> None:
    if run.grad_sync != "last-microbatch":
        return
    if run.zero == 2:
        raise FlintError("grad_sync: zero 2 shards the gradient buffer, so each micro-batch's "
                         "gradients are reduce-scattered in its own backward (DeepSpeed "
                         "refuses no_sync with gradient partitioning): use every-microbatch")
    if run.zero == 3 and run.framework.startswith("torch") and run.pp == 1:
        raise FlintError("grad_sync: last-microbatch under FSDP2 without a pipeline "
                         "(set_requires_gradient_sync(False) in a loop of backwards) gathers "
                         "the parameters again in every micro-batch while it keeps their "
                         "unsharded gradients, which Flint does not price: use "
                         "every-microbatch, or pp > 1 (torch.distributed.pipelining)")


def _batch(run) -> None:
    dp = run.devices // (run.tp * run.cp * run.pp)
    if run.global_batch % (dp * run.micro_batch):
        raise FlintError(f"global_batch: {run.global_batch} sequences are not a multiple of "
                         f"dp {dp} x micro_batch {run.micro_batch} = {dp * run.micro_batch}")
    if run.seq_len % (2 * run.cp) and run.cp > 1:
        raise FlintError(f"seq_len: {run.seq_len} does not split into 2 x cp = {2 * run.cp} "
                         f"load-balanced chunks")


def _model(run):
    from flint.models.describe import resolve_model

    try:
        return resolve_model(run.model_spec()).with_(seq_len=run.seq_len)
    except FlintError as e:
        raise FlintError(f"model: {e}") from None


def _pipeline(run, cfg) -> None:
    chunks = run.pp * run.vp
    if run.recompute_layers:
        if run.remat != "full":
            raise FlintError(f"recompute_layers: block recompute of {run.recompute_layers} "
                             f"layers per chunk is a form of remat full, not {run.remat}")
        if run.recompute_layers > cfg.n_layers / chunks:
            raise FlintError(f"recompute_layers: {run.recompute_layers} exceeds the "
                             f"{cfg.n_layers / chunks:g} layers of each of the {chunks} "
                             f"pipeline chunks")
    if chunks > cfg.n_layers:
        raise FlintError(f"vp: pp {run.pp} x vp {run.vp} = {chunks} model chunks do not fill "
                         f"{cfg.name}'s {cfg.n_layers} layers")
    if run.vp > 1 and run.schedule != "interleaved":
        raise FlintError(f"schedule: vp {run.vp} chunks per stage need the interleaved "
                         f"schedule, not {run.schedule}")
    if run.schedule == "interleaved":
        if run.vp < 2 or run.pp < 2:
            raise FlintError("schedule: interleaved 1F1B needs pp > 1 and vp > 1")
        m = run.global_batch // ((run.devices // (run.tp * run.cp * run.pp)) * run.micro_batch)
        if m % run.pp:
            raise FlintError(f"global_batch: interleaved 1F1B needs the {m} micro-batches to be "
                             f"a multiple of pp {run.pp} (Megatron-LM's rule)")


def _parallel_fit(run, cfg) -> None:
    for what, n in (("attention heads", cfg.n_heads), ("KV heads", cfg.n_kv_heads),
                    ("FFN hidden size", cfg.d_ff), ("vocabulary", cfg.vocab)):
        if n % run.tp:
            raise FlintError(f"tp: {run.tp} does not divide {cfg.name}'s {n} {what}")
    if run.ep > 1 and not cfg.n_experts:
        raise FlintError(f"ep: {cfg.name} has no experts to shard over {run.ep} ranks")
    if cfg.n_experts and cfg.n_experts % run.ep:
        raise FlintError(f"ep: {run.ep} does not divide {cfg.name}'s {cfg.n_experts} experts")
    if run.dispatcher != "alltoall" and not cfg.n_experts:
        raise FlintError(f"dispatcher: {cfg.name} has no experts to dispatch tokens to")
    if run.routing != "balanced":
        if not cfg.n_experts:
            raise FlintError(f"routing: {cfg.name} has no experts to route tokens to")
        from flint.passes.moe_routing import expert_shares

        try:
            expert_shares(run.routing, cfg.n_experts)
        except FlintError as e:
            raise FlintError(f"routing: {e}") from None


def _hardware(run) -> None:
    from flint.frontends.targets import resolve_target
    from flint.hardware_models.spec import load_spec

    try:
        target = resolve_target(run.hardware)
        spec = load_spec(run.hardware)
    except FlintError as e:
        raise FlintError(f"hardware: {e}") from None
    if target.platform == "cpu":
        raise FlintError(f"hardware: {run.hardware} is a host CPU: training runs are "
                         f"priced on accelerators (use flint extract for CPU programs)")
    if target.platform == "tpu" and run.framework != "xla":
        raise FlintError(f"framework: {run.framework} kernels do not run on "
                         f"{run.hardware} (a TPU runs XLA's: framework xla)")
    _attention_kernel(run, target.platform, spec)
    if run.collective_matmul != "auto" and (target.platform, run.framework) != ("tpu", "xla"):
        raise FlintError(f"collective_matmul: {run.collective_matmul} sets libtpu's "
                         f"windowed-einsum threshold, for framework xla on a TPU (not "
                         f"{run.framework} on {run.hardware}); leave it out")
    if run.cuda_graphs and target.platform != "gpu":
        raise FlintError(f"cuda_graphs: {run.hardware} is not a GPU (a TPU runs the step as "
                         f"one program; leave cuda_graphs out)")
    check_precision(run.precision, spec)


def check_precision(precision: str, spec) -> None:
    """Quantized GEMMs need the GPU's tensor cores for them (runs and plans)."""
    if precision != "bf16" and "fp8" not in spec.peak_flops:
        raise FlintError(f"precision: {precision} GEMMs need FP8 tensor cores; "
                         f"{spec.name} lists none")
    if precision == "nvfp4" and "fp4" not in spec.peak_flops:
        raise FlintError(f"precision: nvfp4 GEMMs need FP4 tensor cores (Blackwell); "
                         f"{spec.name} lists none")


def _lora(run, cfg) -> None:
    """LoRA runs the JAX twin's adapters on a dense decoder."""
    from flint.models.lora_targets import DEFAULT_TARGETS, parse_targets

    if not run.lora_rank:
        if run.lora_targets != DEFAULT_TARGETS or run.lora_base != "bf16":
            field = "lora_targets" if run.lora_targets != DEFAULT_TARGETS else "lora_base"
            raise FlintError(f"{field}: a LoRA option needs a lora_rank (0 trains every "
                             f"weight)")
        return
    if run.lora_base == "fp8" and run.precision != "fp8":
        raise FlintError(f"lora_base: an FP8 base (per-tensor scaled E4M3 weights) is read "
                         f"by precision fp8's GEMMs, not {run.precision}'s")
    if run.framework.startswith("torch"):
        raise FlintError(f"lora_rank: LoRA adapters are modelled in the JAX twin (framework "
                         f"megatron or xla), not in {run.framework}'s torch twin")
    if cfg.n_experts or cfg.kv_lora:
        raise FlintError(f"lora_rank: {cfg.name} is a MoE/MLA model; LoRA is modelled on "
                         f"dense decoders")
    column = {"qkv", "fc1"} & set(parse_targets(run.lora_targets))
    if column and run.lora_rank % run.tp:
        raise FlintError(f"lora_rank: {run.lora_rank} does not split over tp {run.tp} (a "
                         f"column-parallel linear's adapter shards its rank over the "
                         f"tensor-parallel ranks, Megatron's ParallelLinearAdapter)")


def _launch_blocking(run) -> None:
    """With every launch blocking the host until its kernel has run, nothing the host
    issues overlaps anything else: a field that says something overlaps cannot apply."""
    if not run.launch_blocking:
        return
    if run.framework == "xla":
        raise FlintError("launch_blocking: XLA launches its kernels from command buffers, "
                         "not one by one (framework megatron, torch-eager or torch-compile)")
    clash = [f"{name} {value}" for name, value, fine in (
        ("overlap_grad_reduce", run.overlap_grad_reduce, False),
        ("tp_comm_overlap", run.tp_comm_overlap, False),
        ("tp_grad_overlap", run.tp_grad_overlap, False),
        ("pipeline_p2p", run.pipeline_p2p, "blocking-serial")) if value != fine]
    if run.cuda_graphs:
        clash.append("cuda_graphs True (a graph replay launches no kernel on its own)")
    if run.zero == 3:
        clash.append("zero 3 (FSDP prefetches the next layer's parameters)")
    if clash:
        hint = " (set overlap_grad_reduce false)" if run.overlap_grad_reduce else ""
        raise FlintError("launch_blocking: each launch waits for its kernel, so nothing "
                         "overlaps; it cannot apply with " + ", ".join(clash) + hint)


def _attention_kernel(run, platform: str, spec) -> None:
    """A named fused-attention kernel exists for the run's accelerator."""
    if run.attention in ("flash", "unfused"):
        return
    if platform != "gpu":
        raise FlintError(f"attention: {run.attention} is a GPU kernel; {run.hardware} runs "
                         f"its compiler's attention (use flash or unfused)")
    from flint.hardware_models.nccl import generation

    allowed = KERNEL_GENERATIONS.get(run.attention)
    arch = generation(spec.name, spec.model)
    if allowed and arch not in allowed:
        raise FlintError(f"attention: {run.attention} has no kernels for {run.hardware} "
                         f"({arch or spec.model or 'an unnamed GPU'}; it runs on "
                         f"{' | '.join(allowed)})")
