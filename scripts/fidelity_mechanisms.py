"""The mechanisms of scripts/fidelity_families.py: each a named assignment of TrainingRun
fields for the framework eras it names (fidelity_eras.ERAS), with the public source it rests
on and the family whose evidence first motivated it. Never chosen per row."""
from __future__ import annotations

from dataclasses import dataclass

from fidelity_eras import DEEPSPEED_2022, MEGATRON_LM_PRE_2022, PERF_RECIPES


@dataclass(frozen=True)
class Mechanism:
    """A named assignment of run fields for the eras it names, with its public source."""

    name: str
    assign: tuple                 # ((field, value), ...)
    eras: tuple
    source: str
    developed_on: str             # the family whose evidence first motivated it
    needs: str = ""               # a TrainingRun field that must exist ("" = always)
    blocked: str = ""             # why the engine cannot price it faithfully yet
    # not a field assignment: the run as stated when it fits, else the least block
    # recompute that fits (flint.fit_memory.least_recompute)
    fit_memory: bool = False
    # ((field, allowed values), ...): rows whose fields (as built) hold other values keep
    # their run as it is, where the engine prices the assignment for only some layouts
    only: tuple = ()
    # a regex the family must match: what one team did, not the era ("" = every family)
    families: str = ""


MECHANISMS = (
    Mechanism("unfused attention before FlashAttention, its probabilities dropped out",
              (("attention", "unfused"), ("attention_dropout", 0.1)),
              (*MEGATRON_LM_PRE_2022, "megatron-lm-2022", *DEEPSPEED_2022,
               "megatron-deepspeed-2021"),
              "FlashAttention (Dao et al., arXiv 2205.14135) appeared 2022-05, after MT-NLG "
              "(2021) and BLOOM's 2022-02 sweep; Megatron-LM/DeepSpeed of that time write "
              "the S x S scores and run the fused scale-mask-softmax kernel on them "
              "(megatron/model/fused_softmax.py); published.md section 4: 'Flash attention "
              "was not used'. ParallelAttention then runs torch's dropout on the "
              "probabilities (megatron/model/transformer.py), --attention-dropout 0.1 by "
              "default (megatron/arguments.py, the same in Megatron-DeepSpeed); no row's "
              "config changes it (BigScience's tr11-176B-ml.slurm does not pass it; "
              "Korthikanti et al. 2022 count the dropout mask in their activation memory)",
              "published 4 Korthikanti 2022 x Megatron-LM 2022 x A100"),
    Mechanism("no sequence parallelism before Megatron-LM 2022-05", (("sp", False),),
              (*MEGATRON_LM_PRE_2022, *DEEPSPEED_2022, "megatron-deepspeed-2021",
               "internevo"),
              "sequence parallelism is Korthikanti et al. 2022 (arXiv 2205.05198, 2022-05); "
              "InternEvo's tensor mode 'mtp' is 'pure megatron tensor parallel without "
              "sequence parallel' (InternLM/InternEvo configs/7B_sft.py)",
              "more 2 InternEvo train_performance x InternEvo x A100"),
    Mechanism("grad reduce after the pipeline flush (DeepSpeed PipelineEngine)",
              (("overlap_grad_reduce", False),),
              (*MEGATRON_LM_PRE_2022, *DEEPSPEED_2022, "megatron-deepspeed-2021"),
              "DeepSpeed deepspeed/runtime/pipe/schedule.py TrainSchedule: ReduceTiedGrads, "
              "ReduceGrads and OptimizerStep are issued after the last BackwardPass; the "
              "engine disables the per-backward all-reduce ('We schedule the all-reduces'); "
              "Megatron-LM 2021's local DDP all-reduces its gradient buffer after the "
              "backward (megatron/model/distributed.py allreduce_gradients, called from "
              "train_step; overlap came with --overlap-grad-reduce in 2023)",
              "more 1 BigScience tr11 x Megatron-DeepSpeed 2022 x A100"),
    Mechanism("stages split by layer count", (("pipeline_split", "layers"),),
              (*MEGATRON_LM_PRE_2022, "megatron-lm-2022", *DEEPSPEED_2022,
               "megatron-deepspeed-2021"),
              "Megatron-DeepSpeed GPTModelPipe: PipelineModule(partition_method="
              "'type:transformer') (BLOOM later 'type:transformer|embedding', an embedding "
              "counted as a block); Megatron-LM 2022 gives each stage num_layers // pp "
              "layers (--account-for-embedding-in-pipeline-split came in 2024)",
              "more 1 BigScience tr11 x Megatron-DeepSpeed 2022 x A100"),
    Mechanism("TP communication overlap in Megatron-Core recipes",
              (("tp_comm_overlap", None),), ("megatron-core", *PERF_RECIPES),
              "Megatron-Core --tp-comm-overlap (Transformer Engine userbuffers, 2023+), on in "
              "the NeMo/Megatron-Bridge performance recipes (e.g. Llama3-70B H100 'TP-comm "
              "overlap via userbuffers', published.md caveats); the run's framework default",
              "held-out Megatron-Core 2024 x H100 (issue 27)", needs="tp_comm_overlap"),
    Mechanism("DeepSpeed's default ZeRO stage 0", (("zero", 0),),
              ("megatron-deepspeed-2021",),
              "DeepSpeed zero_optimization.stage defaults to 0; the MT-NLG source states no "
              "ZeRO stage (its 530B fits without one: ~16 B x 1.9B params per GPU)",
              "more 3 MT-NLG x Megatron-DeepSpeed 2021 x A100"),
    Mechanism("Megatron-LM's optimizer on every data-parallel rank (before its distributed "
              "optimizer)", (("zero", 0),), MEGATRON_LM_PRE_2022,
              "Megatron-LM 2019 (pretrain_gpt2.py: FP16_Optimizer around Adam on every rank) "
              "and 2021 (megatron/optimizer/optimizer.py Float16OptimizerWithFloat16Params: "
              "fp32 main parameters and Adam state on every data-parallel rank, gradients "
              "all-reduced); the DistributedOptimizer (megatron/optimizer/distrib_optimizer.py) "
              "came later and is opt-in (--use-distributed-optimizer, store_true), which "
              "neither the 2019 scripts nor examples/sc21 pass",
              "- (from the framework's source, no family's error)"),
    Mechanism("framework kernels per family (vs all-megatron)", (), (),
              "not assignable: every rebuildable family's non-GEMM kernels are library "
              "kernels (Megatron's fused softmax/bias-GeLU, apex and flash-attn norms, "
              "Transformer Engine), i.e. framework megatron; the torch twin that prices "
              "eager kernels refuses zero 1 (InternEvo's hybrid ZeRO) and cp > 1 "
              "(AutoModel's Llama3-70B row)", "-"),
    Mechanism("block recompute to fit memory", (), ("megatron-core", *PERF_RECIPES),
              "the NVIDIA tables list no activation recompute (published.md); the runs ran, "
              "and the recipes set Megatron's block recompute to the layers per chunk that "
              "make them fit (Megatron-Bridge perf_recipes, e.g. 'Llama3-8B H100 FP8-CS: "
              "recompute_granularity=full, method=block, num_layers=5'); the default "
              "selective recompute is kept where it fits",
              "published 1a Megatron-Bridge x Megatron-Core+TE x GB200", fit_memory=True),
    Mechanism("DeepSpeed BF16_Optimizer's fp32 gradient accumulation",
              (("grad_accumulation", "fp32-copy"),), ("megatron-deepspeed-2022-bf16",),
              "DeepSpeed deepspeed/runtime/bf16_optimizer.py (written for BLOOM, 2022): "
              "update_hp_grads casts each bf16 gradient to fp32 and adds it to the fp32 "
              "gradient after every micro-batch's backward (pipe/engine.py "
              "_exec_backward_pass: 'manually call because we don't call "
              "optimizer.backward()'); HF blog 'The Technology Behind BLOOM Training': "
              "gradient accumulation in FP32 'is what BF16Optimizer does'",
              "more 1 BigScience tr11 x Megatron-DeepSpeed 2022 x A100"),
    Mechanism("PyTorch autograd gradient accumulation",
              (("grad_accumulation", "autograd"),),
              ("megatron-deepspeed-2021", "megatron-deepspeed-2022", "internevo"),
              "DeepSpeed's fp16 pipeline engine (2021; BLOOM's fp16 rows, 2022) and "
              "InternEvo's HybridZeroOptimizer "
              "(hooks on the AccumulateGrad nodes, reduction skipped until the last "
              "micro-batch) leave the sum of the micro-batches' gradients to PyTorch's "
              "AccumulateGrad, an in-place add into .grad in the gradient's dtype; neither "
              "uses Megatron's gradient-accumulation fusion",
              "- (from the frameworks' source, no family's error)"),
    Mechanism("FlashAttention v1 where a framework pinned it",
              (("attention", "flash1"),), ("internevo",),
              "InternEvo doc/en/install.md (@1aea101b): 'Install flash-attention (version "
              "v1.0.5)' from its third_party submodule, images torch1.13.1-cuda11.7.1-"
              "flashatten1.0.5; the train_performance table is InternLM's first release's "
              "(the same numbers in the InternLM docs of 2023-07), before FlashAttention-2 "
              "(2023-07-17); later docs moved to flash-attn 2.2.1 and kept the table",
              "- (from the framework's documented environment, no family's error)"),
    Mechanism("InternEvo's ZeRO-1: gradients all-reduced, parameters broadcast by owner",
              (("zero_sync", "broadcast"),), ("internevo",),
              "InternEvo internlm/solver/optimizer/hybrid_zero_optim.py: the AccumulateGrad "
              "hooks reduce with reduce_rank=None, and utils.reduce_tensor all-reduces when "
              "no destination rank is given; broadcast_params issues one dist.broadcast per "
              "owner rank of the zero1 group and waits on every handle (overlap_sync_param "
              "False in configs/7B_sft.py); NCCL prices a broadcast as a ring of nRanks "
              "steps (tuning.cc)",
              "- (from the framework's source, no family's error)", needs="zero_sync"),
    Mechanism("bf16 gradient reduction in NVIDIA's performance recipes",
              (("grad_reduce_dtype", "bf16"),), PERF_RECIPES,
              "Megatron-Bridge src/megatron/bridge/perf_recipes/_common.py @f64bff14 "
              "_perf_precision: 'Always sets grad_reduce_in_fp32=False' (and "
              "cfg.ddp.grad_reduce_in_fp32 = False in _benchmark_common); NeMo 2.0 "
              "scripts/performance/helpers.py @e8509a92 set_precision_configs: "
              "recipe.trainer.plugins.grad_reduce_in_fp32 = False, and the recipes' "
              "performance_optimizations set the same; the libraries' defaults are fp32 "
              "(Megatron-LM arguments.py forces fp32 for bf16; bf16_mixed() has "
              "grad_reduce_in_fp32=True); NeMo 24.07's launcher configs leave "
              "optim.grad_sync_dtype at its fp32 default except a few (nemotron_340b.yaml)",
              "published 1c NeMo docs 24.09-25.07 x Megatron-Core+TE x B200",
              needs="grad_reduce_dtype",
              # Flint prices bf16 gradients in the distributed optimizer's buffer; a
              # Megatron-FSDP row (zero 3) reduces the gradients its program computes
              only=(("zero", (1, 2)),),
              # it reached no row until the rows stopped stating the fp32 default (session
              # 40); measured then, with -> without: 1a GB200 12.0% -> 10.7%, 1a GB300
              # 8.9% -> 6.2%, 1a H100 2.4% -> 2.0%, 1c GB200 14.4% -> 13.6% (better only 1a
              # B200 and 1c H100): the Blackwell rows already run too fast for a reason not
              # found, and a true setting that moves them further is not kept until it is.
              # Session 41 (after the attention backward fix): 1a B200 4.3% -> 8.1%, 1a GB300
              # 7.8% -> 5.0%, 1c GB200 9.5% -> 8.7%, the rest within half a point
              blocked="dropped by sessions 40 and 41's leave-one-family-out (held-out "
                      "families improved 2, worse 3 of 6; then 1, worse 2 of 6); shown with "
                      "--include-blocked"),
    Mechanism("gradients reduced in the model's dtype (DeepSpeed, InternEvo)",
              (("grad_reduce_dtype", "bf16"),), (*DEEPSPEED_2022, "internevo"),
              "DeepSpeed deepspeed/runtime/engine.py communication_data_type: fp16 when "
              "fp16 is enabled, bf16 when bf16 is (both 2 bytes; ZeRO stage_1_and_2 and the "
              "BF16_Optimizer fallback cast to it before reducing); InternEvo "
              "hybrid_zero_optim.py reduces the bf16 .grad of its bf16 parameters; Flint's "
              "default is Megatron's fp32 main gradients",
              "- (from the frameworks' source, no family's error)", needs="grad_reduce_dtype",
              only=(("zero", (1, 2)),)),
    Mechanism("DeepSpeed BF16_Optimizer's ZeRO-1: gradients all-reduced, parameters "
              "all-gathered", (("zero_sync", "all-reduce"),), ("megatron-deepspeed-2022-bf16",),
              "DeepSpeed deepspeed/runtime/engine.py allreduce_gradients: an optimizer "
              "without reduce_gradients (BF16_Optimizer) takes buffered_allreduce_fallback on "
              "get_grads_for_reduction(), its whole fp32 gradients; bf16_optimizer.py step "
              "updates this rank's partition and all_gather_dp_groups gathers the bf16 "
              "parameters (tr11 README: it 'implements its own ZeRO Stage 1')",
              "- (from the framework's source, no family's error)", needs="zero_sync",
              only=(("zero", (1,)),)),
    # what the torch twin prices: bf16 under autocast or torchao's Float8 linears (fp8,
    # tensorwise dynamic scaling), SDPA, DDP (zero 0) or FSDP (zero 3)
    Mechanism("PyTorch's own kernels for PyTorch FSDP/DDP runs", (("framework", "torch-eager"),),
              ("pytorch",),
              "a PyTorch FSDP/DDP step runs one kernel per aten op (RMSNorm, SiLU, rotary, "
              "casts, the optimizer's foreach kernels) around cuBLAS GEMMs and SDPA's flash "
              "kernel, not Transformer Engine's fused ones: the torch front end's own "
              "FSDP2/DDP graphs (README, framework torch-eager)",
              "held-out PyTorch FSDP A100/H100 (issue 27)",
              only=(("precision", ("bf16", "fp8")), ("zero", (0, 3)), ("cp", (1,)))),
    Mechanism("Inductor's kernels for PyTorch runs under torch.compile",
              (("framework", "torch-compile"),), ("pytorch-compile",),
              "torch.compile fuses each pointwise chain into one Triton kernel (Inductor); "
              "GEMMs and attention stay cuBLAS and SDPA (README, framework torch-compile)",
              "held-out PyTorch FSDP A100/H100 (issue 27)",
              only=(("precision", ("bf16", "fp8")), ("zero", (0, 3)), ("cp", (1,)))),
    Mechanism("FP8 delayed scaling before current scaling (Transformer Engine DelayedScaling)",
              (("fp8_recipe", "delayed"),), ("megatron-core", "nvidia-perf-recipes"),
              "Transformer Engine's per-tensor FP8 recipe was DelayedScaling (scales from the "
              "amax history of earlier steps, the amax taken in the cast itself) until "
              "Float8CurrentScaling came in TE 2.2 (2025); NeMo 2.0's bf16_with_fp8_mixed() "
              "is delayed scaling and the NeMo docs first say 'scaling factors computed in "
              "the current step' on the 25.04 page; Megatron-LM's examples/llama/"
              "train_llama3_8b_h100_fp8.sh passes --fp8-amax-history-len 1024 "
              "--fp8-amax-compute-algo max (Megatron's --fp8-recipe default, delayed). Rows "
              "that state current scaling (FP8-CS, MLPerf v5.1, NeMo 25.04+) keep it; "
              "Megatron-Bridge (its perf scripts name the recipe per run) is not assigned",
              "- (from the frameworks' source, no family's error)", needs="fp8_recipe",
              only=(("precision", ("fp8",)),),
              # measured in session 41 (--include-blocked), with -> without: 1b 11.3% ->
              # 8.4%, 1c B200 19.2% -> 16.1%, 1f 7.1% -> 6.7%, 1c H100 (one row) 4.2% ->
              # 23.7%: the H100/B200 FP8 rows run too fast without the amax passes, so
              # something else in them is priced too fast; the true recipe waits for it
              blocked="dropped by session 41's leave-one-family-out (held-out families "
                      "improved 1, worse 3 of 4); shown with --include-blocked"),
    Mechanism("NeMo launcher's Nemotron-340B config reduces gradients in bf16",
              (("grad_reduce_dtype", "bf16"),), ("megatron-core",),
              "NVIDIA/NeMo-Framework-Launcher launcher_scripts/conf/training/nemotron/"
              "nemotron_340b.yaml @3be81fc1: optim mcore_distributed_optim with "
              "grad_sync_dtype: bf16 (the NeMo 24.07 performance runs of that model use its "
              "config); the other models' configs keep the fp32 default",
              "published 1b NeMo 24.07 x Megatron-Core+TE x H100", needs="grad_reduce_dtype",
              only=(("model", ("nemotron-340b",)), ("zero", (1, 2)))),
    # issue 27 deliverable 3, session 45: pipeline sends as each framework issues them
    Mechanism("Megatron's 1F1B waits on its pipeline sends (framework default)",
              (("pipeline_p2p", None),), ("megatron-core", *PERF_RECIPES),
              "Megatron-Core pipeline_parallel/p2p_communication.py _communicate waits on "
              "every request (wait_on_reqs=True) and, with batch_p2p_comm and "
              "batch_p2p_sync (ModelParallelConfig defaults), synchronizes the device; "
              "Megatron-LM arguments.py sets overlap_p2p_comm False without virtual "
              "stages ('non-interleaved schedule does not support overlapping p2p "
              "communication'); the interleaved schedule posts them ahead "
              "(--no-overlap-p2p-communication: on by default)",
              "- (from the framework's source, no family's error)", needs="pipeline_p2p"),
    Mechanism("pipeline sends waited on (Megatron-LM 2021-22)",
              (("pipeline_p2p", "blocking"),), (*MEGATRON_LM_PRE_2022, "megatron-lm-2022"),
              "Megatron-LM 2021 megatron/p2p_communication.py _communicate: "
              "batch_isend_irecv, req.wait() on each, then torch.cuda.synchronize(), for "
              "the interleaved schedule too (overlap_p2p_comm came in 2023)",
              "- (from the framework's source, no family's error)", needs="pipeline_p2p"),
    Mechanism("one blocking send or receive at a time (DeepSpeed PipelineEngine)",
              (("pipeline_p2p", "blocking-serial"),),
              (*DEEPSPEED_2022, "megatron-deepspeed-2021"),
              "DeepSpeed runtime/pipe/p2p.py send/recv: dist.send / dist.recv ('Doesnt "
              "support async_op true'); runtime/pipe/schedule.py TrainSchedule issues "
              "RecvActivation then SendGrad before a forward, SendActivation then RecvGrad "
              "before a backward, each 'blocking and must be paired'",
              "- (from the framework's source, no family's error)", needs="pipeline_p2p"),
    Mechanism("pipeline boundary sent as TP slices and all-gathered",
              (("pipeline_scatter_gather", True),),
              (*MEGATRON_LM_PRE_2022, "megatron-lm-2022", *DEEPSPEED_2022,
               "megatron-deepspeed-2021"),
              "Narayanan et al. 2021 (arXiv 2104.04473) section 4.1 'scatter/gather "
              "optimization', Megatron-LM's --no-scatter-gather-tensors-in-pipeline "
              "(store_false: on by default), kept by the 2022 sequence-parallel release for "
              "runs without SP (p2p_communication._communicate: 'if "
              "args.scatter_gather_tensors_in_pipeline and not args.sequence_parallel'); "
              "DeepSpeed runtime/pipe/engine.py "
              "is_pipe_partitioned = is_model_parallel (activations and their gradients "
              "sent as PartitionedTensor slices, .full() all-gathers them over the TP group)",
              "- (from the frameworks' source, no family's error)",
              # session 46, with -> without: BLOOM 14.2 -> 10.2%, MT-NLG 22.4 -> 19.7%,
              # Korthikanti 2.7 -> 4.2% (level verdict: dropped); BLOOM's rank correlation
              # +0.837 -> +0.790. Kept: the frameworks' behaviour, the better order
              needs="pipeline_scatter_gather"),
    Mechanism("every kernel launch blocking (BigScience on Jean Zay, CUDA_LAUNCH_BLOCKING=1)",
              # and what it implies (flint.run_checks), whatever a leave-one-out keeps
              (("launch_blocking", True), ("overlap_grad_reduce", False),
               ("pipeline_p2p", "blocking-serial")), DEEPSPEED_2022,
              "bigscience tr11-176B-ml.slurm: 'export CUDA_LAUNCH_BLOCKING=1' with 'do not "
              "remove or the training will hang'; chronicles-prequel.md 'dealing with JZ "
              "hanging on the large model' (set before the topology sweep, whose 320-384 "
              "GPU runs always hung without it); its own check: 0-6% slower at 80-160 GPUs",
              "- (from the team's launch script, no family's error)",
              needs="launch_blocking", families=r"bigscience|bloom|jean zay"),
    Mechanism("TP input-gradient reduction beside the weight-gradient GEMM (async all-reduce)",
              (("tp_grad_overlap", None),),
              ("megatron-lm-2022", "megatron-core", *PERF_RECIPES, "internevo"),
              "Megatron-Core ModelParallelConfig.async_tensor_model_parallel_allreduce ('enables "
              "asynchronous execution of tensor-model-parallel all-reduce with weight gradient "
              "computation of a column-linear layer'; Megatron-LM 2022's "
              "--no-async-tensor-model-parallel-allreduce: on by default); InternEvo "
              "FusedDenseFunc.backward: all_reduce_raw(grad_input, async_op=True) before the "
              "wgrad, waited after it. Not in Megatron-LM 2021 nor the Megatron-DeepSpeed forks "
              "(synchronous autograd all-reduce)",
              "- (from the frameworks' source, no family's error)", needs="tp_grad_overlap"),
    Mechanism("NeMo AutoModel's benchmark recipe: every decoder layer checkpointed, "
              "gradients reduced in every micro-batch",
              (("remat", "full"), ("grad_sync", "every-microbatch")), ("automodel",),
              "NVIDIA-NeMo/Automodel examples/llm_benchmark/llama3_3/"
              "custom_llama3_1_70b_pretrain_benchmark_8nodes.yaml @f5b942f6 (the 1h Llama3 "
              "70B layout: 64 ranks, tp 1, cp 2, dp 32, gbs 128, lbs 1, seq 8192): "
              "distributed.activation_checkpointing: True (each decoder layer wrapped whole, "
              "its forward re-run in the backward) and defer_fsdp_grad_sync: False ('Must be "
              "False with GA>1'), so FSDP2 reduce-scatters the gradients in every "
              "micro-batch's backward; kernels stay Transformer Engine's (framework megatron: "
              "the torch twin refuses cp > 1). Flint's own memory check agrees: with "
              "selective recompute the layout needs 113 GiB of an 80 GB H100",
              "published 1h NeMo AutoModel x PyTorch FSDP2+TE x H100",
              needs="grad_sync", only=(("zero", (3,)),)),
    Mechanism("XLA's dot-product attention before JAX's Pallas TPU flash kernel (MaxText v4)",
              (("attention", "unfused"),), ("maxtext",),
              "published.md 2a: the v4 numbers were committed to MaxText's README in 2023-03 "
              "(cf466fafe, c0e67ec1a), before the 2023-12 scripts that set attention=flash; "
              "JAX's Pallas TPU flash attention (jax/experimental/pallas/ops/tpu/"
              "flash_attention.py) was 'fairly new' on 2023-09-13 (marin-community/levanter "
              "#308) and announced on 2023-10-25 (Dao-AILab/flash-attention #635); before "
              "it MaxText's attention was XLA's dot-product attention, S x S scores in HBM",
              "published 2a MaxText configs x MaxText/XLA x TPU v4",
              families=r"TPU v4"),
    Mechanism("NVIDIA's MLPerf recipes replay the step from CUDA graphs",
              (("cuda_graphs", True),), ("megatron-core",),
              "published.md 6c: the 405B configs' config_common*.sh set FULL_CUDA_GRAPH=1 "
              "(Megatron-Core's full-iteration CUDA graph); mlcommons/training_results_v5.1 "
              "NVIDIA/benchmarks/llama31_8b/implementations/nemo/"
              "config_GB300_18x4x1xtp1pp1cp2_8b.sh and config_GB300_128x4x1xtp2pp1cp4_8b.sh "
              "@4da2d1cd source config_common_cg.sh. A graph replay launches no kernel from "
              "the host and leaves no launch gap between kernels",
              "- (from the submission's configs, no family's error)",
              needs="cuda_graphs", families=r"6c MLPerf"),
    Mechanism("Megatron-LM 2019's attention score path: scale, mask and softmax as PyTorch "
              "kernels", (("score_path", "eager"),), ("megatron-lm-2019",),
              "Megatron-LM's 2019 GPT-2 attention (mpu/transformer.py "
              "GPT2ParallelSelfAttention) runs its score path as separate PyTorch ops: matmul, "
              "divide by sqrt(head dim), multiply by the causal mask and subtract 10000 x "
              "(1 - mask), torch.nn.Softmax, dropout under the model-parallel RNG tracker, "
              "matmul, on a model cast to half (FP16_Module). Its fused kernels "
              "(FusedScaleMaskSoftmax in megatron/model/fused_softmax.py, the bias-GeLU and "
              "bias-dropout-add fusions) came with the 2020 code (passes/score_path.py)",
              "published 9 Shoeybi et al. 2019 x Megatron-LM 2019 x V100",
              needs="score_path"),
)
