"""The framework eras of the published rows: each family belongs to one, the framework
lineage its section's prose names; fidelity_mechanisms.MECHANISMS assign run fields by era."""

# era -> (framework in words, what the source states about it)
ERAS = {
    "megatron-core": ("Megatron-Core+TE", "NeMo 24.07-25.07 / Megatron-Bridge 25.09+ / "
                      "Megatron-LM examples / MLPerf v5.1 NeMo: Transformer Engine kernels, "
                      "flash (cuDNN) attention, distributed optimizer with overlapped grad "
                      "reduce and param gather, TP communication overlap in the perf recipes"),
    "nvidia-perf-recipes": ("Megatron-Core+TE", "NeMo 2.0 performance recipes (containers "
                            "25.02-25.07): megatron-core with the recipes' own settings, "
                            "e.g. gradients reduced in bf16"),
    "bridge-perf-recipes": ("Megatron-Core+TE", "Megatron-Bridge performance recipes "
                            "(25.09+): megatron-core with the recipes' own settings "
                            "(gradients reduced in bf16, the FP8 recipe named per run)"),
    "automodel": ("PyTorch FSDP2+TE", "NeMo AutoModel: FSDP2 with Transformer Engine kernels"),
    "maxtext": ("MaxText/XLA", "MaxText on JAX: XLA's fusions (framework xla)"),
    "pathways": ("PaLM/Pathways XLA", "PaLM on TPU v4 through Pathways"),
    "megatron-lm-2022": ("Megatron-LM 2022", "Korthikanti et al. 2022 (arXiv 2205.05198): "
                         "TP + sequence parallelism + selective recompute, no flash attention"),
    "megatron-deepspeed-2022": ("Megatron-DeepSpeed 2022", "BigScience tr11 (Feb-Mar 2022): "
                                "Megatron TP inside DeepSpeed's pipeline engine, ZeRO-1"),
    # the same sweep's bf16 rows (02-28 on, the "bf16" sections, production): DeepSpeed's
    # BF16_Optimizer instead of its fp16 ZeRO-1 optimizer (more-published.md, tr11 README)
    "megatron-deepspeed-2022-bf16": ("Megatron-DeepSpeed 2022", "BigScience tr11 bf16 "
                                     "rows: Megatron TP inside DeepSpeed's pipeline engine, "
                                     "BF16_Optimizer (its own ZeRO stage 1)"),
    "megatron-deepspeed-2021": ("Megatron-DeepSpeed 2021", "MT-NLG (arXiv 2201.11990): "
                                "Megatron tensor slicing, DeepSpeed pipeline and data "
                                "parallelism"),
    "internevo": ("InternEvo", "InternEvo 7B: PyTorch, flash-attn, Megatron TP without SP "
                  "('mtp'), hybrid ZeRO-1"),
    # eras a section's heading names (section_of): tables beyond the shared ones
    "megatron-lm-2019": ("Megatron-LM 2019", "Shoeybi et al. 2019 (arXiv 1909.08053): "
                         "TP + DP on V100, fp16, no pipeline, no sequence parallelism, "
                         "unfused attention, local DDP (gradients all-reduced after the "
                         "backward)"),
    "megatron-lm-2021": ("Megatron-LM 2021", "Narayanan et al. 2021 (arXiv 2104.04473): "
                         "TP + PP + DP, no sequence parallelism, no flash attention, "
                         "gradients all-reduced after the backward"),
    "pytorch": ("PyTorch FSDP/DDP", "PyTorch FSDP/FSDP2 or DDP (torchtitan, FSDP recipes): "
                "one kernel per aten op, SDPA attention"),
    "pytorch-compile": ("PyTorch FSDP + torch.compile", "PyTorch FSDP/FSDP2 or DDP under "
                        "torch.compile: Inductor's fused kernels, SDPA attention"),
}
TORCH_ERAS = ("pytorch", "pytorch-compile")
# Megatron-LM before sequence parallelism, flash attention and its distributed optimizer
MEGATRON_LM_PRE_2022 = ("megatron-lm-2019", "megatron-lm-2021")
# a row of these eras silent on ZeRO is priced as its era's mechanism says
# (fidelity_mechanisms), not as Megatron-Core's default
UNSHARDED_OPTIMIZER_ERAS = MEGATRON_LM_PRE_2022


DEEPSPEED_2022 = ("megatron-deepspeed-2022", "megatron-deepspeed-2022-bf16")
PERF_RECIPES = ("nvidia-perf-recipes", "bridge-perf-recipes")
