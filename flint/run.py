"""A training run: one configuration of a model on a cluster, described once, checked once.

    run = TrainingRun(model="llama3-70b", seq_len=8192, devices=1024, tp=8, pp=4, vp=5,
                      global_batch=512, precision="fp8", hardware="h100-sxm")
    run.dp, run.microbatches, run.key()
    TrainingRun.from_json(run.to_json()) == run

`flint.engine.predict(run)` prices it; `flint predict`, `flint sweep`, `flint plan` and the
published-table scripts all build TrainingRuns. The hardware is the spec the run is priced
on; the compile target comes from the spec (`compile_target:`), never from the user.

Parallelism, Megatron-LM's rank order (tensor innermost, then context, expert, data,
pipeline outermost): devices = dp x cp x tp x pp; the expert axis is carved out of the
data-parallel ranks (dp = ep x the rest); ZeRO: 0 = gradient all-reduce, 1 = Megatron's
distributed optimizer (optimizer state sharded over DP), 2 = ZeRO-1 plus sharded gradients,
3 = FSDP (parameters, gradients and optimizer state sharded: over all of DP, or over
`hsdp` ranks with replicas across them, PyTorch's HYBRID_SHARD). With zero 1/2, `hsdp` is
the optimizer's shard group the same way (Megatron-Core's dp / --num-distributed-optimizer-
instances, InternEvo's zero1=N).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields
from typing import Optional, Union

from flint.errors import FlintError
from flint.run_schema import RunSchema, suggest_word
from flint.schema import did_you_mean, validated


@dataclass(frozen=True)
class TrainingRun:
    """One training configuration. `model`: a preset/zoo name, a model YAML or Hugging
    Face config.json path, or a mapping of dims (as a tuple of pairs, so the run hashes);
    `seq_len`: the training sequence length, always explicit. `global_batch` in
    sequences (0: one micro-batch per data-parallel rank); `sp` None: on when tp > 1
    (Megatron-Core's default); `schedule` None: interleaved 1F1B when vp > 1, else 1F1B;
    `devices_per_host` 0: the spec's devices per node."""

    model: Union[str, tuple]
    devices: int
    seq_len: int = 0            # 0: the `seq` a model mapping states (else an error)
    hardware: str = "h100-sxm"
    devices_per_host: int = 0
    tp: int = 1
    sp: Optional[bool] = None
    cp: int = 1
    pp: int = 1
    vp: int = 1
    schedule: Optional[str] = None
    pipeline_split: str = "time"
    # how a stage's boundary sends and receives run beside its compute
    # (passes.pipeline.P2P_MODES: posted-ahead, blocking, blocking-serial). None: the
    # framework's own: blocking for megatron's non-interleaved schedules (Megatron-LM turns
    # overlap_p2p_comm off without virtual stages: "non-interleaved schedule does not
    # support overlapping p2p communication"), posted ahead otherwise
    pipeline_p2p: Optional[str] = None
    # tp > 1 without sequence parallelism: each tensor-parallel rank sends 1/tp of the
    # boundary tensor and the receiver all-gathers it over TP (Megatron-LM 2021's
    # scatter/gather optimization, Narayanan et al. 2021 section 4.1; DeepSpeed's
    # pipe_partitioned). Off: every rank sends the whole tensor (Megatron-Core)
    pipeline_scatter_gather: bool = False
    ep: int = 1
    dispatcher: str = "alltoall"
    zero: int = 1
    hsdp: int = 0
    micro_batch: int = 1
    global_batch: int = 0
    remat: str = "selective"
    # remat full only: recompute this many layers of each pipeline chunk and keep the
    # others' activations (Megatron's --recompute-method block --recompute-num-layers, what
    # the NeMo / Megatron-Bridge recipes use to fit memory); 0: every layer
    recompute_layers: int = 0
    precision: str = "bf16"
    framework: str = "megatron"
    # attention core kernel; the data-parallel gradient reduction overlapped with the
    # backward bucket by bucket (Megatron's --overlap-grad-reduce, DDP, FSDP) or run after
    # the whole backward (Megatron-LM 2021's local DDP, DeepSpeed's pipeline engine)
    attention: str = "flash"
    # attention unfused (framework megatron or a torch one): the dropout probability on the
    # attention probabilities (Megatron-LM's --attention-dropout, 0.1 by default there;
    # today's LLM recipes train without). Fused kernels are priced without their in-kernel
    # dropout
    attention_dropout: float = 0.0
    # attention unfused under megatron: how its scale, causal mask and softmax run. fused:
    # one kernel (Megatron's FusedScaleMaskSoftmax, from 2020); eager: one PyTorch kernel
    # each (Megatron-LM 2019). passes.score_path prices both
    score_path: str = "fused"
    overlap_grad_reduce: bool = True
    # where the micro-batches' gradients are summed (GRAD_ACCUMULATION). None: the
    # framework's own way: in-gemm for megatron and xla, no kernel of its own
    # (Megatron-Core's gradient-accumulation fusion, on by default; XLA folds the add into
    # the GEMM); autograd for the torch frameworks (AccumulateGrad adds into .grad)
    grad_accumulation: Optional[str] = None
    # when the gradient reduction runs (GRAD_SYNC). None: every micro-batch for the torch
    # frameworks and zero 2, the last micro-batch otherwise
    grad_sync: Optional[str] = None
    # zero 1/2: how the sharded optimizer moves gradients and parameters (ZERO_SYNC)
    zero_sync: str = "reduce-scatter"
    # zero 1/2: the gradients' dtype in their reduction, and in their buffer unless the
    # accumulation keeps an fp32 copy (grad_accumulation fp32-copy) (GRAD_REDUCE_DTYPES)
    grad_reduce_dtype: str = "fp32"
    # TP all-gathers / reduce-scatters pipelined in chunks with their GEMMs
    # (passes.tp_comm_overlap; Megatron-Core --tp-comm-overlap). None: the framework's
    # default, on for megatron with tp > 1 and sequence parallelism but nvfp4 (the NeMo /
    # Megatron-Bridge performance recipes), off otherwise (XLA's collective matmul and
    # PyTorch's AsyncTP are opt-in)
    tp_comm_overlap: Optional[bool] = None
    # the backward's TP reduction of each column-parallel linear's input gradient runs
    # while that linear's weight-gradient GEMM computes (passes.tp_grad_overlap; Megatron's
    # async_tensor_model_parallel_allreduce, on by default since Megatron-LM 2022 and in
    # Megatron-Core and Transformer Engine). None: on for megatron with tp > 1, off for
    # the other frameworks (XLA's schedule and the torch twin's own order stand)
    tp_grad_overlap: Optional[bool] = None
    # framework xla on a TPU: XLA's collective matmul (SPMD windowed einsum: an all-gather
    # or reduce-scatter feeding a dot becomes a loop of collective-permutes and partial
    # dots). auto: libtpu decides where, as it ships (its size threshold and its own
    # heuristics); off: nowhere (MaxText's DISABLE_COLLECTIVE_MATMUL, the tpu-recipes'
    # *_no_collective_matmul configs). A compile option: the program changes with it
    collective_matmul: str = "auto"
    # CUDA_LAUNCH_BLOCKING=1: every kernel launch returns only when the kernel has run, so
    # the host never runs ahead and nothing overlaps (BigScience's tr11 launched so, "do
    # not remove or the training will hang": tr11-176B-ml.slurm); each kernel then waits
    # for its launch's round trip (hardware_models.populations.BLOCKING_LAUNCH_S). Needs
    # overlap_grad_reduce off; derives blocking-serial pipeline sends and no TP overlap
    launch_blocking: bool = False
    # the kernels are replayed from CUDA graphs (XLA's command buffers; Megatron-Core's
    # --enable-cuda-graph; torch.cuda.graph or Inductor's mode="reduce-overhead"): no host
    # launches and no launch gap between kernels (hardware_models.populations
    # .stream_kernels). None: the framework's default, on for xla on GPUs, off for the
    # others (and on TPUs, which have none)
    cuda_graphs: Optional[bool] = None
    # framework xla: which of XLA's GPU fusion emitters made the kernels. mlir: the MLIR
    # emitters XLA runs on CUDA since 2024 (vectorized reductions, unrolled in-place
    # updates); legacy: the LLVM emitters before them (one element per thread and step).
    # hardware_models.populations prices each.
    xla_emitters: str = "mlir"
    # zero 3: FSDP frees a layer's gathered parameters after its forward and gathers them
    # again for its backward (FULL_SHARD, FSDP2's default); False keeps them (SHARD_GRAD_OP):
    # one all-gather per layer and micro-batch instead of two, more memory. None: False for
    # the torch frameworks under a pipeline (torchtitan's), True otherwise
    reshard_after_forward: Optional[bool] = None
    routing: str = "balanced"
    # precision fp8: how Transformer Engine scales each tensor (FP8_RECIPES). current: from
    # the tensor's own amax, a pass over it before the cast (Float8CurrentScaling, TE 2.2+,
    # the recipes from NeMo 25.04 on); delayed: from the amax history of earlier steps,
    # the amax taken in the cast's own pass (DelayedScaling, TE 1.x's only recipe)
    fp8_recipe: str = "current"
    # LoRA fine-tuning (flint.models.lora): the adapters' rank, 0 training every weight
    # (pre-training, full fine-tuning); the frozen base's linears they adapt, Megatron's
    # names (qkv, proj, fc1, fc2; NeMo's groups attention, mlp). The default is
    # Megatron-Bridge's LoRA.target_modules (all four)
    lora_rank: int = 0
    lora_targets: str = "qkv,proj,fc1,fc2"
    # how the frozen base is held: bf16, or fp8 (its layers' linears in FP8: NeMo's
    # fp8_params, Transformer Engine's fp8_model_init; precision fp8 only), which spares
    # the per-step cast of every frozen weight
    lora_base: str = "bf16"

    def __post_init__(self):
        if isinstance(self.hardware, str) and not self.hardware.endswith((".yaml", ".yml")):
            from flint.frontends.targets import ALIASES

            name = self.hardware.lower()        # one spelling per spec: `h100` is h100-sxm
            object.__setattr__(self, "hardware", ALIASES.get(name, name))
        if not self.seq_len:
            object.__setattr__(self, "seq_len", stated_seq_len(self.model_spec()))
        doc = self.to_json()
        validated(RunSchema, doc, "run")
        if isinstance(self.model, dict):
            object.__setattr__(self, "model", tuple(sorted(self.model.items())))
        from flint.models.lora_targets import canonical

        object.__setattr__(self, "lora_targets", canonical(self.lora_targets))
        if self.sp is None:
            object.__setattr__(self, "sp", self.tp > 1)
        for name, value in self.derived_defaults().items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)
        if not self.global_batch:
            object.__setattr__(self, "global_batch", self.dp_if_valid() * self.micro_batch)
        from flint.run_checks import check_run

        check_run(self)

    # --- derived figures -------------------------------------------------------------
    def dp_if_valid(self) -> int:
        per = self.tp * self.cp * self.pp
        return self.devices // per if per and self.devices % per == 0 else 0

    @property
    def dp(self) -> int:
        """Data-parallel ranks (the expert axis included)."""
        return self.devices // (self.tp * self.cp * self.pp)

    @property
    def stage_devices(self) -> int:
        return self.devices // self.pp

    @property
    def microbatches(self) -> int:
        """Micro-batches per step (gradient accumulation, the pipeline's depth)."""
        return self.global_batch // (self.dp * self.micro_batch)

    @property
    def layers_per_chunk(self) -> float:
        """The model's layers per pipeline chunk (pp x vp chunks; may be fractional)."""
        return self.model_config().n_layers / (self.pp * self.vp)

    @property
    def recompute_share(self) -> float | None:
        """The share of each pipeline chunk's layers a block recompute (recompute_layers)
        recomputes; None when the remat policy alone says (every layer alike)."""
        if not self.recompute_layers:
            return None
        per_chunk = self.layers_per_chunk
        return None if self.recompute_layers >= per_chunk else self.recompute_layers / per_chunk

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len

    def model_spec(self):
        """The model as resolve_model takes it: a name or path, or a mapping of dims."""
        return dict(self.model) if isinstance(self.model, tuple) else self.model

    def model_config(self):
        """The model's DecoderConfig at the run's sequence length."""
        from flint.models.describe import resolve_model

        return resolve_model(self.model_spec()).with_(seq_len=self.seq_len)

    def mesh(self) -> tuple[tuple[str, int], ...]:
        """One pipeline stage's mesh, outermost axis first: data (or FSDP/HSDP), expert,
        context, tensor (flint.models.train's axis names)."""
        rest = self.dp // self.ep
        if self.zero == 3:
            shard = self.hsdp or rest
            axes = [("data", rest // shard), ("fsdp", shard)]
        else:
            axes = [("data", rest)]
        axes += [("expert", self.ep), ("context", self.cp), ("model", self.tp)]
        kept = [(n, s) for n, s in axes if s > 1]
        return tuple(kept) or (("data", 1),)

    @property
    def boundary_slices(self) -> int:
        """How many slices a pipeline boundary crosses in: one per TP rank with
        pipeline_scatter_gather where every rank holds the whole boundary (no SP)."""
        return self.tp if self.pipeline_scatter_gather and not self.sp else 1

    # --- identity ----------------------------------------------------------------------
    def to_json(self) -> dict:
        d = asdict(self)
        d["model"] = self.model_spec()
        return d

    @classmethod
    def from_json(cls, doc, where: str = "run") -> "TrainingRun":
        if not isinstance(doc, dict):
            raise FlintError(f"{where}: a run is a mapping of fields")
        unknown = sorted(map(str, set(doc) - {f.name for f in fields(cls)}))
        if unknown:
            raise FlintError(f"{where}: unknown field {unknown[0]!r}"
                             f"{did_you_mean(unknown[0], [f.name for f in fields(cls)])}")
        for name in ("model", "devices"):
            if doc.get(name) is None:
                raise FlintError(f"{where}: {name}: missing (--{name})")
        if not doc.get("seq_len"):
            doc = dict(doc, seq_len=stated_seq_len(doc["model"], where))
        suggest_word(doc, where)
        validated(RunSchema, doc, where)        # types and ranges, one line on failure
        values = {f.name: doc[f.name] for f in fields(cls) if f.name in doc}
        try:
            return cls(**values)
        except FlintError as e:
            raise FlintError(f"{where}: {e}") from None

    @classmethod
    def load(cls, path: str) -> "TrainingRun":
        """A run from a YAML or JSON file."""
        return cls.from_json(run_document(path, {}), path)

    def to_yaml(self) -> str:
        import yaml

        return yaml.safe_dump(self.to_json(), sort_keys=False)

    def key(self) -> str:
        """A stable digest of the run (its JSON, keys sorted)."""
        text = json.dumps(self.to_json(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def derived_defaults(self) -> dict:
        """What the fields left out (None) take from the others: sp on with TP; TP
        communication overlap for megatron with TP and SP (the performance recipes', which
        turn it off for nvfp4: Megatron-Bridge's llama3/llama31_llm_pretrain.py); interleaved
        1F1B with virtual stages; pipeline sends waited on in megatron's non-interleaved
        schedules, posted ahead otherwise (one at a time, and no TP overlap, where launches
        block); the framework's gradient handling: PyTorch sums with AccumulateGrad and
        reduces in every backward (DDP's and FSDP2's default, ZeRO-2's need) but under a
        pipeline in the last only (torch.distributed.pipelining's backward_maybe_with_nosync),
        where FSDP2 also keeps its gathers (torchtitan's reshard_after_forward = not
        pp_enabled); Megatron and XLA sum in the GEMM and reduce once."""
        torch = self.framework.startswith("torch")
        schedule = "interleaved" if self.vp > 1 else "1f1b"
        blocking = self.launch_blocking         # one launch at a time: nothing overlaps
        one_f_one_b = (self.schedule or schedule) != "interleaved"
        p2p = ("blocking-serial" if blocking
               else "blocking" if self.framework == "megatron" and one_f_one_b
               else "posted-ahead")
        return {"sp": self.tp > 1,
                "tp_comm_overlap": self.framework == "megatron" and self.tp > 1
                and bool(self.sp) and not blocking and self.precision != "nvfp4",
                "tp_grad_overlap": self.framework == "megatron" and self.tp > 1
                and not blocking,
                "schedule": schedule,
                "pipeline_p2p": p2p,
                "grad_accumulation": "autograd" if torch else "in-gemm",
                "grad_sync": "every-microbatch" if (torch and self.pp == 1) or self.zero == 2
                else "last-microbatch",
                "reshard_after_forward": not (torch and self.zero == 3 and self.pp > 1),
                "cuda_graphs": self.framework == "xla" and self._on_gpu()}

    def _on_gpu(self) -> bool:
        """Whether the run's hardware is a GPU (an unknown one: check_run says so)."""
        from flint.frontends.targets import resolve_target

        try:
            return resolve_target(self.hardware).platform == "gpu"
        except FlintError:
            return True

    def replace(self, **changes) -> "TrainingRun":
        """The same run with some fields changed (checked again). A field holding the
        default derived from other fields (sp, tp_comm_overlap, tp_grad_overlap, schedule,
        pipeline_p2p, the
        framework's grad_accumulation, grad_sync and cuda_graphs) is derived again from the new ones
        unless given; one set to something else stays, and so does global_batch."""
        doc = self.to_json()
        for name, value in self.derived_defaults().items():
            if name not in changes and doc[name] == value:
                doc[name] = None
        doc.update(changes)
        return TrainingRun(**doc)

    def label(self) -> str:
        parts = [f"{self.devices} x {self.hardware}", f"tp{self.tp}" + ("+sp" if self.sp else "")]
        parts += [f"{k}{v}" for k, v in (("cp", self.cp), ("pp", self.pp), ("vp", self.vp),
                                         ("ep", self.ep)) if v > 1]
        parts += [f"dp{self.dp}", f"zero{self.zero}" + (f"/hsdp{self.hsdp}" if self.hsdp else ""),
                  f"mb{self.micro_batch}x{self.microbatches}", f"remat={self.remat}" + (
                      f"/{self.recompute_layers}" if self.recompute_layers else ""),
                  self.precision]
        if self.lora_rank:
            parts.append(f"lora{self.lora_rank}:{self.lora_targets}")
        name = self.model if isinstance(self.model, str) else dict(self.model).get(
            "name", dict(self.model).get("base", "custom"))
        return f"{name} seq {self.seq_len} gbs {self.global_batch}: " + " ".join(parts)


def stated_seq_len(model, where: str = "run") -> int:
    """The sequence length a model mapping states itself (`{base: ..., seq: 4096}`);
    anything else is ambiguous (a preset's or a config's maximum context is not what a
    run trains at), so it stops with the flag to set."""
    if isinstance(model, dict) and model.get("seq"):
        return model["seq"]
    from flint.frontends.targets import import_jax_quietly
    from flint.models.describe import resolve_model

    import_jax_quietly()

    try:
        cfg = resolve_model(model)
    except FlintError as e:                 # the model itself is wrong: say that first
        raise FlintError(f"{where}: model: {e}") from None
    hint = f"; {cfg.name}'s config allows up to {cfg.seq_len}"
    raise FlintError(f"{where}: seq_len: give the training sequence length (--seq-len N, or "
                     f"seq_len: in a run file){hint}")


def run_document(path: str | None, flags: dict) -> dict:
    """A run's fields from a YAML/JSON file (if any) with the given flags (None: not
    given) on top."""
    doc: dict = {}
    if path:
        import yaml

        from flint.io import read_text

        try:
            doc = yaml.safe_load(read_text(path, limit=2**20))
        except (yaml.YAMLError, RecursionError) as e:
            raise FlintError(f"{path}: not valid YAML: {str(e).splitlines()[0]}") from None
        if not isinstance(doc, dict):
            raise FlintError(f"{path}: a run file holds a mapping of TrainingRun fields")
    doc.update({k: v for k, v in flags.items() if v is not None})
    return doc
