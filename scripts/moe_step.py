"""Predict one MoE training step from a few extracted layers (shared by moe_skew.py and
published_moe.py).

    from moe_step import MoeRun, predict
    result = predict(MoeRun("deepseek-v3", gpus=256, tp=1, pp=4, vp=4, ep=64, mbs=1,
                            gbs=4096, seq=4096, hardware="gb200-nvl72", target="b200",
                            precision="mxfp8"), ["balanced", "zipf:1.0"])

How (the same for every configuration):
- One pipeline stage's program is compiled for its GPUs (GPUs / PP, compile-only), as
  scripts/bench_large.py does: a `template_layers`-layer unrolled template of the model's MoE
  layers on the mesh (data, expert, model): expert = EP, data = the rest of the stage's data
  parallelism (stage GPUs / (TP x EP)), model = TP with sequence parallelism when TP > 1.
- The template holds MoE layers only: leading dense layers (DeepSeek-V3's first 3) are
  priced as MoE layers. For DeepSeek-V3 the active FFN work is the same (8 x 2048 routed + 2048
  shared = 18432 = the dense FFN), so only their all-to-alls and router are extra.
- passes/moe_routing.py re-prices the template for each routing distribution, then
  LayerTemplate writes the whole model's layers, PipelineParallel schedules PP stages x GA
  microbatches (1F1B, interleaved with VP chunks when VP > 1), and estimate() simulates it.
- Activation recompute: "selective" (the attention core). Data-parallel gradient
  reduction once per step (the layer template's per-layer reductions), with Megatron's
  distributed optimizer (passes/distributed_optimizer.py: reduce-scatter, sharded update,
  parameter all-gather; dense parameters over data x expert, experts over data).
- Kernels: Megatron-Core with Transformer Engine, so elementwise, norm and cast kernels
  are library kernels (node meta `kernel_source: library`), as for the dense rows of
  compare_published.py; pipeline stages are balanced by predicted time (split="time").
- A stage boundary sends the residual stream (bf16 [MBS, seq / TP, d]; its gradient
  back), as Megatron-Core's p2p communication does. The layer template's own guess (every
  value one template layer hands the next) also catches values XLA shares between layers
  (rotary tables, a fused attention kernel's extra outputs), so it is replaced.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


@dataclass(frozen=True)
class MoeRun:
    model: str
    gpus: int
    tp: int
    pp: int
    vp: int
    ep: int
    mbs: int
    gbs: int
    seq: int
    hardware: str          # cost-model spec
    target: str            # compile target
    precision: str = "bf16"
    remat: str = "selective"
    template_layers: int = 2
    # token dispatcher: "alltoall" (NCCL, Megatron-Core's default) sends every top-k copy;
    # "deepep" / "hybridep" send a token once per remote node
    dispatcher: str = "alltoall"
    cp: int = 1            # context parallelism (EP inside the data-parallel ranks)

    @property
    def stage_gpus(self) -> int:
        return self.gpus // self.pp

    @property
    def dp(self) -> int:
        return self.gpus // (self.tp * self.pp * self.cp)

    @property
    def microbatches(self) -> int:
        return self.gbs // (self.dp * self.mbs)

    def check(self) -> str:
        """Why the configuration cannot be built ('' when it can)."""
        if self.gpus % self.pp or self.stage_gpus % (self.tp * self.cp):
            return (f"{self.gpus} GPUs do not split into tp={self.tp} x cp={self.cp} x "
                    f"pp={self.pp}")
        if self.dp % self.ep:
            return f"EP {self.ep} does not divide the data-parallel size {self.dp}"
        if self.gbs % (self.dp * self.mbs):
            return f"GBS {self.gbs} is not a multiple of DP {self.dp} x MBS {self.mbs}"
        return ""

    def mesh(self) -> list:
        rest = self.dp // self.ep
        axes = [["data", rest]] if rest > 1 else []
        axes.append(["expert", self.ep])
        if self.cp > 1:        # Megatron's rank order: TP innermost, then CP, then DP
            axes.append(["context", self.cp])
        if self.tp > 1:
            axes.append(["model", self.tp])
        return axes


def template(run: MoeRun, cache: Path):
    """The stage's extracted template graph (cached on disk by program)."""
    from flint.graph import WorkloadGraph
    from flint.models.describe import resolve_model, to_mapping
    from flint.sweep import extract_program

    cfg = resolve_model(run.model).with_(first_dense=0, seq_len=run.seq)
    # multi-head latent attention's values run unpadded (head dim 128, not 192) since
    # workload version 2: its templates are re-extracted; the others did not change
    version = {"workload_version": 2} if cfg.kv_lora else {}
    program = {"framework": "jax", "model": to_mapping(cfg), "devices": run.stage_gpus,
               "mesh": run.mesh(), "batch_per_replica": run.mbs, "remat": run.remat,
               "sequence_parallel": run.tp > 1, "scan": False, "seq_len": run.seq,
               "layers": run.template_layers, "hardware": run.target,
               **({"gemm_precision": run.precision} if run.precision != "bf16" else {}),
               **version}
    key = hashlib.sha256(json.dumps(program, sort_keys=True).encode()).hexdigest()[:16]
    path = cache / "graphs" / f"{key}.json"
    if path.is_file():
        return WorkloadGraph.load(path), False
    os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
    graph = extract_program(program)
    path.parent.mkdir(parents=True, exist_ok=True)
    graph.save(path)
    return graph, True


def predict(run: MoeRun, distributions, cache: Path | None = None, seed: int = 0) -> list[dict]:
    """One row per routing distribution: step time and the MoE report (no wall times:
    the rows are written as deterministic files)."""
    from flint.hardware_models.estimate import estimate
    from flint.models.decoder import model_flops
    from flint.models.describe import resolve_model
    from flint.passes.distributed_optimizer import DistributedOptimizer
    from flint.passes.layer_template import LayerTemplate
    from flint.passes.moe_routing import MoeRouting
    from flint.passes.pipeline import PipelineParallel

    cache = cache or REPO / "build" / "moe"
    cfg = resolve_model(run.model).with_(seq_len=run.seq)
    graph, _ = template(run, cache)
    tokens_mb = run.mbs * run.dp * run.seq      # one microbatch of the data-parallel group
    rows = []
    for dist in distributions:
        routed = MoeRouting(dist, seed=seed, dropless=not cfg.capacity_factor,
                            capacity_factor=cfg.capacity_factor or 1.0, top_k=cfg.top_k,
                            deduplicate=run.dispatcher != "alltoall").run(graph)
        for n in routed.nodes:         # Megatron-Core + Transformer Engine kernels
            n.meta["kernel_source"] = "library"
        layered = LayerTemplate(cfg.n_layers, run.hardware).run(routed)
        residual = f"bf16[{run.mbs},{run.seq // (run.tp * run.cp)},{cfg.d_model}]"
        for n in layered.nodes:
            if n.name.startswith(("fwd.", "bwd.")) and n.name not in ("fwd.head", "bwd.embed"):
                n.outputs = [residual]
        layered = DistributedOptimizer().run(layered)
        layered.meta["model_flops_per_device"] = model_flops(cfg, tokens_mb) / run.stage_gpus
        piped = layered
        if run.pp > 1 or run.microbatches > 1:
            piped = PipelineParallel(run.pp, run.microbatches,
                                     "interleaved" if run.vp > 1 else "1f1b",
                                     run.vp if run.vp > 1 else 1,
                                     split="time" if run.pp > 1 else "layers",
                                     hardware=run.hardware).run(layered)
        e = estimate(piped, run.hardware)
        report = routed.meta["moe_routing"]
        step = e.step_time_s
        rows.append({"run": asdict(run), "distribution": dist, "step_s": step,
                     "tokens_s_gpu": run.gbs * run.seq / (step * run.gpus),
                     "model_tflops_gpu": model_flops(cfg, run.gbs * run.seq) / step
                     / run.gpus / 1e12,
                     "memory_gib": e.memory_bytes / 2**30, "oom": e.oom,
                     "straggler_factor": report["straggler_factor"],
                     "max_over_mean_expert": report["max_over_mean_expert"],
                     "a2a_balanced_bytes_per_rank": report["all_to_all_balanced_bytes_per_rank"],
                     "a2a_straggler_bytes_per_rank":
                         report["all_to_all_straggler_bytes_per_rank"],
                     "dropped_token_share": report["dropped_token_share"]})
    return rows
