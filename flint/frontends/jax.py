"""JAX frontend: compile a jitted step for N compile-only devices and read its optimized HLO.

Stages mirror JAX's own (`jit(f).lower(...).compile()`):

    step = flint.capture(devices=4096, mesh={"data": 512, "model": 8})(train_step)
    lowered = step.lower(*args)          # FlintLowered: .as_text() is StableHLO
    compiled = lowered.compile()         # FlintCompiled: .as_text() is the optimized HLO
    graph = compiled.workload()          # WorkloadGraph
    graph = step.workload(*args)         # all three at once

The step is never executed: arguments may be ShapeDtypeStructs or real arrays, and only
their shapes and dtypes are used.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from flint.cluster import Cluster, parse_mesh
from flint.errors import FlintError
from flint.frontends.targets import (compile_with_fallback, default_devices_per_host,
                                     devices_for, prepare_environment, quiet_native_stderr,
                                     resolve_target)

prepare_environment()
with quiet_native_stderr():  # the CUDA plugin probes for drivers while JAX imports
    import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

from flint.frontends.arg_specs import abstract_args, argument_names  # noqa: E402


@dataclass(frozen=True)
class CaptureConfig:
    devices: int
    mesh: tuple[tuple[str, int], ...]
    hardware: str = "h100-sxm"
    devices_per_host: int = 8
    in_specs: object = None
    rules: tuple = ()
    out_specs: object = None
    static_argnums: tuple = ()
    donate_argnums: tuple = ()
    compiler_options: tuple = ()
    parallelize: object = None      # torch steps: parallelize(model, DeviceMesh)
    model_flops: float | None = None  # per step, whole cluster (MFU); else from the graph


def make_config(devices: int, mesh=None, hardware: str = "h100-sxm", **kw) -> CaptureConfig:
    target = resolve_target(hardware)
    mesh_t = parse_mesh(mesh, devices)
    per_host = kw.pop("devices_per_host", None) or default_devices_per_host(target)
    opts = tuple(sorted((kw.pop("compiler_options", None) or {}).items()))
    rules = tuple(kw.pop("rules", None) or ())
    return CaptureConfig(devices, mesh_t, hardware, per_host, rules=rules,
                         compiler_options=opts, **kw)


def build_mesh(cfg: CaptureConfig) -> tuple[Mesh, Cluster]:
    target = resolve_target(cfg.hardware)
    devices = devices_for(target, cfg.devices, cfg.devices_per_host)
    sizes = [s for _, s in cfg.mesh]
    mesh = Mesh(np.array(devices, dtype=object).reshape(sizes), tuple(n for n, _ in cfg.mesh))
    cluster = Cluster(cfg.devices, cfg.mesh, target.spec, target.platform,
                      min(cfg.devices_per_host, cfg.devices))
    return mesh, cluster


@dataclass
class FlintCompiled:
    compiled: object
    cluster: Cluster
    name: str
    timings: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)   # XLA's warnings, e.g. memory it could not save
    sharding: dict = field(default_factory=dict)  # per-argument table and warnings
    model_flops: float | None = None

    def as_text(self) -> str:
        """The optimized, SPMD-partitioned per-device HLO."""
        return self.compiled.as_text()

    def cost_analysis(self):
        return self.compiled.cost_analysis()

    def memory_analysis(self):
        return self.compiled.memory_analysis()

    def hlo_module(self):
        from flint.hlo.module import parse_module

        return parse_module(self.as_text())

    def workload(self):
        from flint.passes.lower_hlo import lower_hlo

        t0 = time.perf_counter()
        graph = lower_hlo(self.hlo_module(), self.cluster)
        graph.meta.update(source="jax", function=self.name, jax_version=jax.__version__,
                          compiler_notes=list(self.notes))
        memory = _memory_stats(self.compiled)
        if memory:
            graph.meta["xla_memory"] = memory
        if self.sharding:
            graph.meta["arguments_sharding"] = self.sharding["table"]
            graph.meta["sharding_warnings"] = self.sharding["warnings"]
        from flint.frontends.model_flops import set_model_flops

        set_model_flops(graph, self.model_flops)
        from flint.frontends.program_checks import record_and_warn
        from flint.frontends.training_facts import record_training

        record_and_warn(graph)
        record_training(graph)
        self.timings["graph_s"] = time.perf_counter() - t0
        return graph


@dataclass
class FlintLowered:
    lowered: object
    cluster: Cluster
    name: str
    compiler_options: dict
    timings: dict = field(default_factory=dict)
    sharding: dict = field(default_factory=dict)
    model_flops: float | None = None

    def as_text(self) -> str:
        """The StableHLO module JAX lowered (before partitioning and optimization)."""
        return self.lowered.as_text()

    def compile(self) -> FlintCompiled:
        t0 = time.perf_counter()
        notes: list[str] = []
        try:
            compiled = compile_with_fallback(
                lambda extra: self.lowered.compile({**self.compiler_options, **extra} or None),
                notes)
        except Exception as e:
            raise FlintError(f"XLA could not compile {self.name} for {self.cluster.devices} "
                             f"{self.cluster.hardware} devices: {_first_line(e)}") from None
        timings = dict(self.timings, compile_s=time.perf_counter() - t0)
        return FlintCompiled(compiled, self.cluster, self.name, timings, notes, self.sharding,
                             self.model_flops)


class Captured:
    """A step function bound to a virtual cluster (what `flint.capture` returns)."""

    def __init__(self, fn: Callable, cfg: CaptureConfig):
        if not callable(fn):
            raise FlintError(f"{fn!r} is not a function")
        self.fn = fn
        self.cfg = cfg
        self.name = getattr(fn, "__name__", type(fn).__name__)
        self.__wrapped__ = fn

    def __call__(self, *args, **kwargs):
        """Call the step as usual (on whatever real devices this process has)."""
        return self.fn(*args, **kwargs)

    def with_config(self, **changes) -> "Captured":
        from dataclasses import replace

        return Captured(self.fn, replace(self.cfg, **changes))

    def lower(self, *args) -> FlintLowered:
        from flint.frontends.sharding_report import sharding_report, warn

        t0 = time.perf_counter()
        mesh, cluster = build_mesh(self.cfg)
        t_dev = time.perf_counter()
        jit_in, jit_out = _jit_specs(self.fn, len(args))
        rows: list = []
        specs = abstract_args(args, mesh, self.cfg.in_specs, self.cfg.rules,
                              self.cfg.static_argnums, argument_names(self.fn, len(args)),
                              jit_specs=jit_in, report=rows)
        table, notes = sharding_report(rows, dict(self.cfg.mesh))
        warn(notes)
        from flint.frontends.static_leaves import closed_over, split

        dynamic, static, has_static = split(specs)
        if has_static:      # equinox-style modules: trace the arrays, close over the rest
            jitted = jax.jit(closed_over(getattr(self.fn, "__wrapped__", self.fn), static),
                             donate_argnums=self.cfg.donate_argnums)
        else:
            jitted = self._jitted(mesh, jit_out)
        from flint.frontends.cudnn_attention import cudnn_attention_as_flash
        from flint.frontends.flax_scopes import nnx_module_scopes
        from flint.frontends.virtual_mesh import flax_linen_under_a_mesh

        try:
            with jax.set_mesh(mesh), nnx_module_scopes(), flax_linen_under_a_mesh(), \
                    cudnn_attention_as_flash(cluster.platform):
                lowered = jitted.lower(*dynamic)
        except FlintError:
            raise
        except Exception as e:
            raise FlintError(f"cannot trace {self.name}: {type(e).__name__}: "
                             f"{_one_line(e)}") from None
        timings = {"devices_s": t_dev - t0, "lower_s": time.perf_counter() - t_dev}
        return FlintLowered(lowered, cluster, self.name, dict(self.cfg.compiler_options),
                            timings, {"table": table, "warnings": notes},
                            self.cfg.model_flops)

    def workload(self, *args):
        """The WorkloadGraph. A PyTorch step `fn(model, optimizer, *batch)` (its first
        argument an nn.Module or a model factory, the second "adamw" / "sgd" / None / an
        optimizer factory) is traced by Flint's torch front end instead of XLA."""
        if _is_torch_call(args):
            from flint.frontends.torch_capture import TorchStep, capture as capture_torch

            step = TorchStep(args[0], tuple(args[2:]), optimizer=args[1],
                             parallelize=self.cfg.parallelize, step_fn=self.fn)
            return capture_torch(step, self.cfg.devices, self.cfg.mesh,
                                 self.cfg.hardware).workload(fuse=True)
        return self.lower(*args).compile().workload()

    def _jitted(self, mesh: Mesh, jit_out=None):
        """The step jitted for the virtual mesh. A step the user jitted with shardings of
        their own mesh (real devices, or none) is jitted again from its function, with
        those specs rebound to the virtual mesh (its in_shardings became argument specs)."""
        fn = self.fn
        info = getattr(fn, "_jit_info", None)
        already_jitted = hasattr(fn, "lower") and hasattr(fn, "trace")
        user_shardings = info is not None and (
            info.user_specified_in_shardings or jit_out is not None)
        if already_jitted and self.cfg.out_specs is None and not user_shardings:
            return fn
        base = getattr(fn, "__wrapped__", fn) if already_jitted else fn
        kw = {"static_argnums": self.cfg.static_argnums or tuple(
                  getattr(info, "static_argnums", ()) or ()),
              "donate_argnums": self.cfg.donate_argnums or tuple(
                  getattr(info, "donate_argnums", ()) or ())}
        out_specs = self.cfg.out_specs if self.cfg.out_specs is not None else jit_out
        if out_specs is not None:
            kw["out_shardings"] = jax.tree.map(
                lambda s: None if s is None else NamedSharding(mesh, s), out_specs,
                is_leaf=lambda x: x is None or isinstance(x, P))
        return jax.jit(base, **kw)


def _jit_specs(fn, nargs: int):
    """The PartitionSpecs of a jitted step's own in_shardings (one prefix per argument)
    and out_shardings, or None where it gave none: NamedShardings name the user's mesh,
    which the virtual mesh replaces, so only their specs carry over."""
    info = getattr(fn, "_jit_info", None)
    if info is None:
        return None, None

    def spec_of(leaf):
        if isinstance(leaf, NamedSharding):
            return leaf.spec
        return leaf if isinstance(leaf, P) else None

    jit_in = None
    if info.user_specified_in_shardings:
        leaves = [spec_of(x) for x in info.in_shardings_leaves]
        tree = jax.tree_util.tree_unflatten(info.in_shardings_treedef, leaves)
        jit_in = tuple(tree) if isinstance(tree, (tuple, list)) and len(tree) == nargs \
            else (tree,) * nargs
    jit_out = None
    out_leaves = [spec_of(x) for x in info.out_shardings_leaves]
    if any(x is not None for x in out_leaves):
        jit_out = jax.tree_util.tree_unflatten(info.out_shardings_treedef, out_leaves)
    return jit_in, jit_out


def _is_torch_call(args) -> bool:
    """Without importing torch: is the first argument a torch module, a module class, or a
    zero-argument model factory followed by an optimizer ("adamw", "sgd", None or a
    factory)? A JAX step's arguments are arrays, never functions."""
    import sys

    torch = sys.modules.get("torch")
    if not args or torch is None:
        return False
    first = args[0]
    if isinstance(first, torch.nn.Module) or (
            isinstance(first, type) and issubclass(first, torch.nn.Module)):
        return True
    optimizer = args[1] if len(args) > 1 else None
    return (callable(first) and not isinstance(first, type) and _takes_no_arguments(first)
            and len(args) > 1 and (optimizer is None or isinstance(optimizer, str)
                                   or callable(optimizer)))


def _takes_no_arguments(fn) -> bool:
    import inspect

    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return all(p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
               for p in params)


def capture(fn: Callable | None = None, *, devices: int, mesh=None, hardware: str = "h100-sxm",
            **kw):
    """Bind a (jitted) training step to `devices` compile-only devices of `hardware`.

    `mesh` is `{"data": 512, "model": 8}` or `"data=512,model=8"`; argument shardings come
    from `in_specs` (a pytree prefix of PartitionSpecs), `rules` ((regex, PartitionSpec)
    pairs matched against '/'-joined argument paths), or the arguments' own shardings.
    """
    cfg = make_config(devices, mesh, hardware, **kw)

    def wrap(f):
        return Captured(f, cfg)

    return wrap(fn) if fn is not None else wrap


def extract(fn: Callable, *args, devices: int, mesh=None, hardware: str = "h100-sxm", **kw):
    """One call: compile `fn(*args)` for the virtual cluster and return its WorkloadGraph."""
    return capture(fn, devices=devices, mesh=mesh, hardware=hardware, **kw).workload(*args)


def _memory_stats(compiled) -> dict:
    """XLA's own per-device buffer assignment (bytes), when the backend reports it."""
    try:
        m = compiled.memory_analysis()
    except Exception:  # noqa: BLE001 - some backends do not implement it
        return {}
    if m is None:
        return {}
    keys = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes",
            "temp_size_in_bytes", "generated_code_size_in_bytes")
    return {k.replace("_size_in_bytes", "_bytes"): int(getattr(m, k, 0) or 0) for k in keys}


def _one_line(e: BaseException, limit: int = 1200) -> str:
    """The whole message of an exception on one line (JAX's sharding errors say what is
    wrong after the first line)."""
    text = " ".join(line.strip() for line in str(e).splitlines() if line.strip())
    return (text[:limit] + " ...") if len(text) > limit else (text or type(e).__name__)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else type(e).__name__
