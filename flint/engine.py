"""The engine: what one training configuration costs, from the compiler's own program.

    from flint.run import TrainingRun
    from flint.engine import predict
    p = predict(TrainingRun(model="llama3-70b", seq_len=8192, devices=1024, tp=8, pp=4,
                            vp=5, global_batch=512, precision="fp8", hardware="h100-sxm"))
    p.step_time_s, p.mfu, p.oom, p.to_json()

How a run is priced (the same recipe for `flint predict`, `flint sweep`, `flint plan`, the
published-table scripts and library callers):

1. One pipeline stage's program (`flint.stage.stage_program`): a few unrolled layers of the model on
   the stage's data x expert x context x tensor mesh, at the run's micro-batch, sequence
   length, remat policy and GEMM precision, compiled by XLA for the compile-only target
   the hardware spec names. It is cached on disk by its key (flint.template_cache), so
   every later run with the same program only re-prices it.
2. Graph passes, in order: MoE routing (`passes.moe_routing`, MoE models), the run's
   kernel population (`passes.kernel_population`), the layer template widened to the
   model's layers (`passes.layer_template`: composite nodes that hold work, not prices),
   the run's ZeRO flavour (`passes.distributed_optimizer` for ZeRO-1/2), and the pipeline
   schedule over `pp` stages and the micro-batches of one step (`passes.pipeline`; stages
   balanced by predicted time unless the run splits by layers).
3. `hardware_models.estimate` on the run's spec with the what-ifs (or a third-party cost
   model), which also prices the templates' blocks afresh.
"""
from __future__ import annotations

import gc
import time
from dataclasses import replace
from flint.errors import FlintError
from flint.prediction import Prediction, prediction_facts  # noqa: F401 (re-exported)
from flint.framework_rules import (amax_local_to_tp, gathered_weights_freed,
                                   gathers_held_for_step, parameter_gather,
                                   unsharded_gradient_accumulation,
                                   weight_casts_held_for_step)
from flint.run import TrainingRun
# the stage program's names, re-exported (callers import them from the engine)
from flint.stage import (COMPILED_DATA, MOE_TEMPLATE_LAYERS, TEMPLATE_LAYERS,  # noqa: F401
                         TORCH_WORKLOAD_VERSION, WORKLOAD_VERSION, compile_target,
                         compiled_mesh, devices_per_host, stage_program)
from flint.steady_state import affine, extrapolate, steady_points


def _retargeted(run: TrainingRun, template):
    """The compiled stage program on the run's own stage mesh (passes.rescale). Raises
    FlintError when a collective cannot be re-targeted (then the run's own mesh is
    compiled instead)."""
    if template.cluster.mesh == run.mesh():
        return template
    from flint.passes.rescale import Rescale

    mesh = ",".join(f"{n}={s}" for n, s in run.mesh())
    out = Rescale(devices=run.stage_devices, mesh=mesh).run(template)
    hosts = min(devices_per_host(run), run.stage_devices)
    return replace(out, cluster=replace(out.cluster, devices_per_host=hosts))


def predict(run: TrainingRun, cost_model=None, what_if=(), cache=None,
            timeline: bool = False) -> Prediction:
    """Price one step of `run`. `cost_model`: a CostModel factory or its `module:factory`
    name (hardware_models.pluggable; None: the built-in model); `what_if`: spec overrides
    ("hbm_bandwidth=6.7TB/s", ...); `cache`: a flint.template_cache.TemplateCache or a
    directory (None: $FLINT_CACHE, else ~/.cache/flint); `timeline`: keep the simulated
    timeline on the prediction's estimate."""
    # Pricing a long pipeline makes some 10^5 short-lived nodes and dicts; the cyclic
    # collector rescanning them was a third of a warm predict (GPT-1T PP64: 2.9 s with
    # it, 1.8 s without). Nothing here relies on a cycle being freed mid-call, so it
    # runs once the prediction is made, as usual.
    paused = gc.isenabled()
    gc.disable()
    try:
        return _predict(run, cost_model, what_if, cache, timeline)
    finally:
        if paused:
            gc.enable()


def _predict(run: TrainingRun, cost_model, what_if, cache, timeline: bool) -> Prediction:
    from flint.hardware_models.pluggable import cost_model_name, resolve_cost_model
    from flint.hardware_models.spec import load_spec

    if not isinstance(run, TrainingRun):
        raise FlintError(f"predict takes a TrainingRun, not {type(run).__name__}")
    t0 = time.perf_counter()
    what_if = tuple(str(w) for w in what_if)
    overrides = run_overrides(run) + list(what_if)
    # bad what-ifs, and a cluster the spec cannot lay out, fail before any work
    from flint.hardware_models.topology import topology_for

    topology_for(load_spec(run.hardware, overrides), run.devices)
    factory = resolve_cost_model(cost_model)
    store = _cache(cache)
    # a long pipeline is priced from two short ones (flint.steady_state) unless the
    # caller wants the whole timeline
    points = None if timeline else steady_points(run.schedule, run.pp, run.microbatches)
    share = run.recompute_share
    if share is not None and timeline:
        raise FlintError(f"recompute_layers: a step recomputing {run.recompute_layers} layers "
                         f"per chunk is priced from its two ends (no recompute, full); it "
                         f"has no single timeline to trace")
    e, piped, compiled = _estimated(run, store, overrides, factory, points)
    if share is not None:
        # layers are alike and their work and held activations add up: the step is
        # `share` of the way from keeping every layer's activations to recomputing all
        kept, _, fresh = _estimated(replace(run, remat="none", recompute_layers=0), store,
                                    overrides, factory, points)
        e, compiled = affine(kept, e, share, memory=True), compiled or fresh
    if not timeline:
        e.timeline = None
    tokens = run.tokens_per_step
    step = e.step_time_s
    from flint.template_cache import program_key
    from flint.what_if_effects import what_if_effects

    return Prediction(
        run=run, what_if=what_if, step_time_s=step,
        tokens_per_s=tokens / step if step else 0.0,
        tokens_per_s_per_device=tokens / step / run.devices if step else 0.0,
        mfu=e.mfu or 0.0, hfu=e.hfu, compute_busy_s=e.compute_busy_s,
        exposed_communication_s=e.exposed_communication_s,
        bubble_fraction=e.pipeline.get("bubble_fraction", 0.0),
        memory_bytes=e.memory_bytes, memory_capacity_bytes=e.memory_capacity_bytes,
        oom=e.oom, memory=e.memory, by_class_s=e.by_class_s, by_layer_s=e.by_layer_s,
        collectives_s=e.collectives_s, pipeline=e.pipeline,
        facts={**prediction_facts(run, piped, what_if, points), "what_if_effects": what_if_effects(
            piped, run.hardware, what_if, run_overrides(run), factory, e.memory_bytes)},
        program_key=program_key(stage_program(run)),
        extracted=compiled, wall_s=time.perf_counter() - t0,
        cost_model=cost_model_name(cost_model) or "",
        moe_routing=piped.meta.get("moe_routing"), estimate=e)


def _estimated(run: TrainingRun, store, overrides, factory, points):
    """(the run's Estimate, its pipelined graph, whether a stage program was compiled)."""
    from flint.hardware_models.estimate import estimate

    estimates, memory, compiled = [], None, False
    # the longer one first: past the warm-up the memory peak no longer grows (except
    # GPipe's), so the shorter one borrows it instead of walking its buffers again
    for m in sorted(points or (run.microbatches,), reverse=True):
        own = memory is None or run.schedule == "gpipe"
        piped, mine, extracted = _pipelined(run, store, overrides, factory, m, memory=own)
        memory, compiled = (mine if own else memory), compiled or extracted
        estimates.insert(0, estimate(piped, run.hardware, overrides, cost_model=factory,
                                     memory=memory))
    e = estimates[0] if points is None else extrapolate(*estimates, *points,
                                                        run.microbatches, run.schedule)
    return e, piped, compiled


def run_overrides(run: TrainingRun) -> list[str]:
    """Spec figures the run itself sets: hosts of `devices_per_host` devices (an NVLink
    domain confined to a host shrinks with it; a rack-scale domain stays)."""
    if not run.devices_per_host:
        return []
    from flint.hardware_models.spec import load_spec

    spec = load_spec(run.hardware)
    out = [f"devices_per_node={run.devices_per_host}"]
    if spec.scale_up_domain == spec.devices_per_node:
        out.append(f"scale_up_domain={run.devices_per_host}")
    return out


def forget() -> None:
    """Drop the graphs kept in this process (stage programs, layered and pipelined graphs);
    the disk cache stays: the next predict is a warm run from disk."""
    _LAYERED.clear()
    _PIPELINED.clear()
    _CACHES.clear()


def _cache(cache):
    if cache is None or isinstance(cache, (str, bytes)) or hasattr(cache, "__fspath__"):
        return _shared_cache(cache)
    return cache


def _shared_cache(directory):
    """One TemplateCache per directory in this process (its in-memory graphs are reused by
    later runs: a sweep or a plan prices many runs of one program)."""
    from flint.template_cache import TemplateCache, default_cache_dir

    key = str(directory) if directory is not None else str(default_cache_dir())
    if key not in _CACHES:
        _CACHES[key] = TemplateCache(key)
    return _CACHES[key]


# Graphs after the passes that do not depend on the spec, by (program, passes' options):
# a sweep over hardware or what-ifs re-prices them without re-running the passes.
_LAYERED: dict = {}
_KEPT = 4
_CACHES: dict = {}          # directory -> its TemplateCache (_shared_cache)


def layered_graph(run: TrainingRun, cache) -> tuple:
    """(the run's one-micro-batch step at layer granularity, whether its program was
    compiled now): routing, kernel population, layer template, ZeRO flavour."""
    from flint.template_cache import program_key

    program = stage_program(run)
    key = (program_key(program), run.mesh(), run.hsdp, run.devices_per_host, run.routing,
           run.dispatcher, run.framework, run.attention, run.score_path,
           run.attention_dropout, run.zero, run.zero_sync,
           run.grad_reduce_dtype, run.overlap_grad_reduce, run.tp_comm_overlap,
           run.tp_grad_overlap,
           run.launch_blocking, run.cuda_graphs, run.xla_emitters, run.grad_accumulation,
           gathers_held_for_step(run), unsharded_gradient_accumulation(run),
           # the accumulation's first micro-batch differs, and a tied embedding's copy
           # is its own only on another stage than the embedding's
           (run.microbatches, run.pp > 1) if run.grad_accumulation != "in-gemm" else None)
    hit = _LAYERED.get(key)
    if hit is not None:
        return hit, False
    template, extracted = cache.get(program)
    try:
        stage = _retargeted(run, template)
    except FlintError:          # a collective rescale cannot spread: compile the real mesh
        template, compiled = cache.get(stage_program(run, exact=True))
        stage, extracted = template, extracted or compiled
    layered = _passes(run, stage)
    _LAYERED[key] = layered
    while len(_LAYERED) > _KEPT:
        _LAYERED.pop(next(iter(_LAYERED)))
    return layered, extracted


def _passes(run: TrainingRun, template):
    from flint.models.decoder import model_flops
    from flint.passes.distributed_optimizer import DistributedOptimizer
    from flint.passes.expand_loops import ExpandLoops
    from flint.passes.kernel_population import ATTENTION_KERNELS, KernelPopulation
    from flint.passes.layer_template import LayerTemplate

    cfg = run.model_config()
    graph = ExpandLoops().run(template)
    if cfg.n_experts:
        from flint.passes.moe_routing import MoeRouting

        graph = MoeRouting(run.routing, dropless=not cfg.capacity_factor,
                           capacity_factor=cfg.capacity_factor or 1.0, top_k=cfg.top_k,
                           deduplicate=run.dispatcher != "alltoall").run(graph)
    named_kernel = run.attention if run.attention in ATTENTION_KERNELS else ""
    graph = KernelPopulation(run.framework, named_kernel,
                             launch_blocking=run.launch_blocking,
                             xla_emitters=run.xla_emitters,
                             cuda_graphs=run.cuda_graphs).run(graph)
    if run.framework == "megatron" and (run.score_path != "fused" or run.attention_dropout):
        from flint.passes.score_path import ScorePath

        graph = ScorePath(run.seq_len, run.micro_batch * cfg.n_heads // run.tp
                          * run.seq_len ** 2, run.score_path,
                          run.attention_dropout).run(graph)
    if run.tp_comm_overlap:
        from flint.passes.tp_comm_overlap import TpCommOverlap

        graph = TpCommOverlap().run(graph)
    if run.tp_grad_overlap:
        from flint.passes.tp_grad_overlap import TpGradOverlap

        graph = TpGradOverlap().run(graph)
    if amax_local_to_tp(run):
        from flint.passes.amax_scope import AmaxScope

        graph = AmaxScope("model").run(graph)
    if graph.meta.get("layer_template") is None and cfg.n_layers > 1:
        graph = LayerTemplate(cfg.n_layers, boundary=boundary_shape(run, cfg),
                              overlap_reduction=run.overlap_grad_reduce,
                              defer_reduced_work=run.framework != "xla",
                              gather_once=gathers_held_for_step(run),
                              cast_once=weight_casts_held_for_step(run),
                              resharded=gathered_weights_freed(run)).run(graph)
        if run.framework == "megatron":
            from flint.models.activations import stamp_megatron_activations

            stamp_megatron_activations(graph, cfg, run)
    if run.zero in (1, 2):
        graph = DistributedOptimizer(
            shard_gradients=run.zero == 2, sync=run.zero_sync, group=run.hsdp,
            gather=parameter_gather(run),
            grad_dtype={"fp32": "f32"}.get(run.grad_reduce_dtype, run.grad_reduce_dtype),
            # DeepSpeed's BF16_Optimizer accumulates into fp32 gradients whatever it sends
            buffer_dtype="f32" if run.grad_accumulation == "fp32-copy" else "").run(graph)
    if run.grad_accumulation != "in-gemm":      # a one-layer model's step: one clear error
        from flint.passes.grad_accumulation import GradAccumulation

        # the torch twin's weights are f32 under autocast, and its FSDP arguments are
        # already this rank's shard; a ZeRO-2 buffer is sharded by the optimizer pass
        graph = GradAccumulation(run.grad_accumulation, microbatches=run.microbatches,
                                 tied_copy=cfg.tie_embeddings and run.pp > 1,
                                 shards=run.dp if run.zero == 2 else 1,
                                 unsharded=dict(run.mesh()).get("fsdp", 1)
                                 if unsharded_gradient_accumulation(run) else 1,
                                 dtype="f32" if run.framework.startswith("torch")
                                 else "bf16").run(graph)
    # the whole model's flops for one micro-batch of the stage's data-parallel group, per
    # device of the stage (the pipeline pass turns it into per device of the cluster)
    if run.lora_rank:       # a LoRA step's model flops: forward and input gradients
        from flint.models.lora import with_lora

        cfg = with_lora(cfg, run.lora_rank, run.lora_targets)
    graph.meta["model_flops_per_device"] = model_flops(
        cfg, run.micro_batch * run.dp * run.seq_len) / run.stage_devices
    return graph


def boundary_shape(run: TrainingRun, cfg) -> str:
    """What a pipeline stage sends the next (and the gradient it gets back): the residual
    stream of one micro-batch, bf16 [micro_batch, seq / (cp x tp with sequence
    parallelism), hidden], Megatron-Core's p2p tensor shape."""
    seq = run.seq_len // (run.cp * (run.tp if run.sp else 1))
    return f"bf16[{run.micro_batch},{seq},{cfg.d_model}]"


_PIPELINED: dict = {}


def _pipelined(run: TrainingRun, cache, overrides, factory, microbatches: int,
               memory: bool = True):
    """(the step's graph over every stage and `microbatches` micro-batches, its memory
    (None unless `memory`), whether the stage program was compiled now)."""
    from flint.hardware_models.memory import estimate_memory
    from flint.passes.pipeline import PipelineParallel

    layered, extracted = layered_graph(run, cache)
    if run.pp == 1 and microbatches == 1:
        return layered, estimate_memory(layered) if memory else None, extracted
    split = run.pipeline_split if run.pp > 1 else "layers"
    every = run.grad_sync == "every-microbatch"
    key = (id(layered), run.pp, microbatches, run.schedule, run.vp, split, every,
           run.pipeline_p2p, run.boundary_slices,
           (run.hardware, tuple(overrides), id(factory)) if split == "time" else None)
    hit = _PIPELINED.get(key)
    if hit is None or hit[0] is not layered:
        piped = PipelineParallel(run.pp, microbatches, run.schedule, run.vp, split,
                                 hardware=run.hardware if split == "time" else "",
                                 what_if=";".join(overrides) if split == "time" else "",
                                 cost_model=factory, reduce_every_microbatch=every,
                                 p2p=run.pipeline_p2p, scatter_gather=run.boundary_slices
                                 ).run(layered)
        hit = [layered, piped, None]
        while len(_PIPELINED) >= 2:     # the two of a steady-state pair: they are large
            _PIPELINED.pop(next(iter(_PIPELINED)))
        _PIPELINED[key] = hit
    if memory and hit[2] is None:
        hit[2] = estimate_memory(hit[1])
    return hit[1], hit[2] if memory else None, extracted
