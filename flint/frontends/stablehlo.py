"""StableHLO frontend: a StableHLO program (text or bytecode) becomes a WorkloadGraph.

Exporters (torch-xla, torchax, MaxText dumps, `jax.jit(f).lower(...).as_text()`) write one
of two kinds of program:

* SPMD programs that still carry shardings (`sdy.mesh` / `sdy.sharding`, `mhlo.sharding`,
  sharding custom calls, `mhlo.num_partitions` > 1). XLA partitions and optimizes them for
  N compile-only devices, as Flint's JAX path does, and the per-device HLO is lowered.
* Per-device programs (no shardings). They are compiled for one device so XLA fuses them as
  it would for real, and every one of the N ranks runs that program.

The module is read with the MLIR Python bindings that ship in jaxlib, never by regex.
"""
from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from flint.cluster import Cluster, validate_mesh
from flint.errors import FlintError
from flint.frontends.targets import (compile_with_fallback, devices_for, prepare_environment,
                                     quiet_native_stderr, resolve_target,
                                     tpu_devices_per_host)

prepare_environment()
with quiet_native_stderr():  # jaxlib's native libraries probe for CUDA drivers on import
    from jaxlib import _jax, xla_client   # _jax: only _from_portable_artifact uses it
    from jaxlib.mlir import ir
    from jaxlib.mlir._mlir_libs import _jax_mlir_ext
    from jaxlib.mlir.dialects import chlo, mhlo, sdy, stablehlo

_BYTECODE_MAGIC = b"ML\xefR"
# custom calls GSPMD exporters (jax without Shardy, torch-xla) use to pin a sharding
_SHARDING_CALLS = frozenset({"Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape"})
# any of these means the program still expects to be partitioned
_SHARDING_ATTRS = frozenset({"mhlo.sharding", "sdy.sharding"})
_COLLECTIVE_OPS = frozenset({"stablehlo.all_reduce", "stablehlo.all_gather",
                             "stablehlo.reduce_scatter", "stablehlo.all_to_all",
                             "stablehlo.collective_permute", "stablehlo.collective_broadcast"})
_LOCATION = re.compile(r'^loc\("(.*)":(\d+):(\d+)(?: to .*)?\)$')


@dataclass
class _Program:
    """What the module says about its own partitioning."""

    module: ir.Module
    name: str | None
    num_partitions: int | None
    num_replicas: int | None
    meshes: list = field(default_factory=list)      # sdy meshes: [(name, ((axis, size),..))]
    sharded_values: int = 0                         # values/ops carrying a sharding
    sharding_devices: set = field(default_factory=set)  # device counts of mhlo.shardings
    collectives: bool = False

    @property
    def sharded(self) -> bool:
        if self.num_partitions is not None:
            return self.num_partitions > 1
        return bool(self.sharded_values or _sdy_mesh(self))


def load_stablehlo(path_or_text, *, devices: int, mesh: tuple[tuple[str, int], ...] | None = None,
                   hardware: str = "h100-sxm", devices_per_host: int | None = None):
    """Compile a StableHLO program for `devices` compile-only devices and return its graph.

    `path_or_text` is a path (str or Path) to a .mlir text or MLIR bytecode file, or the
    module's text itself (a str holding a newline or a brace). A sharded program must be
    partitioned for exactly `devices` (its `mhlo.num_partitions`, `sdy.mesh` and shardings);
    a program without shardings is the per-device program every rank runs. The cluster's
    mesh is `mesh`, else the program's sdy mesh, else `(("data", devices),)`.
    Raises FlintError, with a one-line message, for unreadable or malformed input, a module
    without `main`, a partitioning that does not fit `devices`, or an XLA compile failure.
    """
    from flint.hlo.module import parse_module
    from flint.passes.lower_hlo import lower_hlo

    t0 = time.perf_counter()
    data, where, file = _read(path_or_text)
    target = resolve_target(hardware)
    mesh = tuple((str(n), int(s)) for n, s in mesh) if mesh is not None else None
    validate_mesh(mesh or (("data", devices),), devices)
    per_host = devices_per_host or (8 if target.platform == "gpu" else tpu_devices_per_host(
        target.hardware) if target.platform == "tpu" else 4)

    program = _inspect(_parse(data, file, where, _mlir_context()), where)
    if program.sharded:
        _check_partitions(program, devices, where)
        partitions, replicas = devices, 1      # SPMD: partition p is rank p
        mesh = mesh or _sdy_mesh(program) or (("data", devices),)
        _set_num_partitions(program.module, devices)
        compile_devices = devices_for(target, devices, per_host)
    else:
        partitions, replicas = 1, _per_device_replicas(program, devices, where)
        mesh = mesh or (("data", devices),)
        compile_devices = devices_for(target, replicas, min(per_host, replicas))
    t_parse = time.perf_counter()
    notes: list[str] = []
    try:  # XLA's RET_CHECK dumps stacks on fd 2: compile_with_fallback keeps it there
        hlo_text = compile_with_fallback(
            lambda extra: _compile(program.module, compile_devices, replicas, partitions,
                                   load=target.platform == "cpu", overrides=extra), notes)
    except Exception as e:  # XLA raises JaxRuntimeError with a multi-line status
        raise FlintError(f"XLA could not compile {where} for {devices} {target.hardware} "
                         f"devices: {_first_line(e)}") from None
    t_compile = time.perf_counter()
    cluster = Cluster(devices, mesh, target.spec, target.platform, min(per_host, devices))
    graph = lower_hlo(parse_module(hlo_text), cluster)
    graph.meta.update(source="stablehlo", file=file, sharded=program.sharded,
                      module=program.name or graph.meta.get("module"),
                      compiler_notes=notes,
                      timings={"parse_s": t_parse - t0, "compile_s": t_compile - t_parse,
                               "graph_s": time.perf_counter() - t_compile})
    return graph


# --- reading ----------------------------------------------------------------------------
def _read(path_or_text) -> tuple[bytes, str, str | None]:
    """(module bytes, name for messages, file path or None)."""
    if isinstance(path_or_text, bytes):
        return path_or_text, "<bytes>", None
    if isinstance(path_or_text, str) and not _is_file(path_or_text) and (
            "\n" in path_or_text or "{" in path_or_text):   # an existing file wins: `a{b}.mlir`
        return path_or_text.encode(), "<string>", None
    path = Path(path_or_text)
    if not path.is_file():
        raise FlintError(f"file not found: {path}")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise FlintError(f"cannot read {path}: {e.strerror}") from None
    return data, str(path), str(path)


def _is_file(text: str) -> bool:
    try:
        return Path(text).is_file()
    except (OSError, ValueError):   # module text is no file name (too long, NUL bytes)
        return False


def _mlir_context():
    """An MLIR context with the dialects StableHLO exporters use (those JAX itself loads)."""
    # func, arith, ... are upstream dialects: jaxlib registers them only through this
    # (private) extension, the same call JAX makes for its own contexts.
    registry = ir.DialectRegistry()
    _jax_mlir_ext.register_dialects(registry)
    context = ir.Context()
    context.append_dialect_registry(registry)
    context.load_all_available_dialects()
    for register in (stablehlo.register_dialect, sdy.register_dialect, chlo.register_dialect,
                     mhlo.register_mhlo_dialect):
        register(context)
    return context


def _parse(data: bytes, file: str | None, where: str, context):
    if not data.strip():
        raise FlintError(f"{where} is empty")
    is_bytecode = data.startswith(_BYTECODE_MAGIC)
    if not is_bytecode:
        try:
            data.decode()
        except UnicodeDecodeError:
            raise FlintError(f"{where} is neither MLIR text nor MLIR bytecode") from None
    try:
        with context:
            # parseFile names the file in diagnostics (program.mlir:3:5)
            module = ir.Module.parseFile(file) if file else ir.Module.parse(data)
    except ir.MLIRError as e:
        raise FlintError(_diagnostic_line(e, where)) from None
    if is_bytecode and any(op.operation.name.startswith("vhlo.")
                           for op in module.body.operations):
        module = _from_portable_artifact(data, where, context)
    return module


def _from_portable_artifact(data: bytes, where: str, context):
    """StableHLO of a versioned (VHLO) portable artifact, as `jax.export` serializes.

    Private jaxlib API, used only here: jaxlib exposes the VHLO -> StableHLO upgrade only
    as `jaxlib._jax.mlir.deserialize_portable_artifact`.
    """
    try:
        return _jax.mlir.deserialize_portable_artifact(data, context)
    except Exception as e:  # an artifact newer than this jaxlib, or a damaged one
        raise FlintError(f"{where} is a StableHLO portable artifact this jaxlib cannot "
                         f"read: {_first_line(e)}") from None


def _diagnostic_line(e, where: str) -> str:
    """The first error of an MLIR parse failure as `file:line:col: error: message`."""
    diagnostics = getattr(e, "error_diagnostics", None) or []
    if not diagnostics:
        return f"{where}: error: {_first_line(e)}"
    loc = _LOCATION.match(str(diagnostics[0].location))
    message = (str(diagnostics[0].message).strip().splitlines() or [""])[0]
    if not loc:
        return f"{where}: error: {message}"
    name = where if loc.group(1) in ("-", "") else loc.group(1)   # "-": parsed from a string
    return f"{name}:{loc.group(2)}:{loc.group(3)}: error: {message}"


# --- what the module says ---------------------------------------------------------------
def _inspect(module, where: str) -> _Program:
    ops = list(module.body.operations)
    if not ops:
        raise FlintError(f"{where} holds an empty module")
    attrs = module.operation.attributes
    program = _Program(
        module, _str_attr(attrs, "sym_name"), _int_attr(attrs, "mhlo.num_partitions"),
        _int_attr(attrs, "mhlo.num_replicas"))
    if not any(op.operation.name == "func.func" and _str_attr(op.attributes, "sym_name") ==
               "main" for op in ops):
        raise FlintError(f"{where} has no `main` function")

    def visit(op):
        op = op.operation    # an OpView's `name` may be its symbol, not the op's name
        name = op.name
        if name == "sdy.mesh":
            program.meshes.append((_str_attr(op.attributes, "sym_name"),
                                   _mesh_axes(sdy.MeshAttr(op.attributes["mesh"]))))
        elif name.startswith("sdy."):
            program.sharded_values += 1   # sharding constraints, manual computations, ...
        elif name == "stablehlo.custom_call" and \
                _str_attr(op.attributes, "call_target_name") in _SHARDING_CALLS:
            program.sharded_values += 1
        elif name in _COLLECTIVE_OPS:
            program.collectives = True
        for key, attr in op.attributes.items():
            _note_sharding(program, key, attr)
            if name == "func.func" and key in ("arg_attrs", "res_attrs"):
                for entry in attr:            # one DictAttr per argument / result
                    for inner in entry:
                        _note_sharding(program, inner.name, inner.attr)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    program.meshes.extend(_round_trip_meshes(attrs))
    return program


def _round_trip_meshes(attrs) -> list:
    """Shardy meshes a serialized program keeps as text in its frontend attributes
    (`jax.export` artifacts: `mhlo.frontend_attributes = {xla.sdy.meshes = "{...}"}`)."""
    frontend = attrs["mhlo.frontend_attributes"] if "mhlo.frontend_attributes" in attrs \
        else None
    text = _str_attr(frontend, "xla.sdy.meshes") if isinstance(frontend, ir.DictAttr) else None
    if text is None:
        return []
    try:
        with frontend.context:
            parsed = ir.Attribute.parse(text)
    except ir.MLIRError:
        return []          # left to XLA, which reads the same text and reports on it
    # sdy attributes are not downcast automatically: ask the type itself
    return [(named.name, _mesh_axes(sdy.MeshAttr(named.attr))) for named in parsed
            if sdy.MeshAttr.isinstance(named.attr)]


def _mesh_axes(mesh) -> tuple[tuple[str, int], ...]:
    return tuple((sdy.MeshAxisAttr(a).name, sdy.MeshAxisAttr(a).size) for a in mesh.axes)


def _note_sharding(program: _Program, name: str, attr) -> None:
    if name not in _SHARDING_ATTRS:
        return
    program.sharded_values += 1
    if name == "mhlo.sharding" and isinstance(attr, ir.StringAttr):
        program.sharding_devices.update(_hlo_sharding_devices(attr.value))


def _hlo_sharding_devices(text: str) -> set[int]:
    """Device counts a (possibly tuple) HloSharding spans: tiled ones only."""
    try:
        sharding = xla_client.HloSharding.from_string(text)
    except Exception as e:  # malformed sharding text
        raise FlintError(f"bad mhlo.sharding {text!r}: {_first_line(e)}") from None
    parts = sharding.tuple_elements() or [sharding]
    return {p.num_devices() for p in parts if p.is_tiled()}


def _check_partitions(program: _Program, devices: int, where: str) -> None:
    """FlintError unless the sharded program can be partitioned for `devices`."""
    if program.num_replicas not in (None, 1):
        raise FlintError(f"{where} has {program.num_replicas} replicas and shardings; only "
                         f"SPMD programs with one replica are supported")
    if program.num_partitions is not None and program.num_partitions != devices:
        raise FlintError(f"{where} is partitioned for {program.num_partitions} devices "
                         f"(mhlo.num_partitions) but --devices is {devices}")
    for name, axes in program.meshes:
        size = math.prod(s for _, s in axes)
        if size not in (1, devices):
            shape = ",".join(f"{a}={s}" for a, s in axes) or "[]"
            raise FlintError(f"{where}'s mesh @{name} ({shape}) has {size} devices but "
                             f"--devices is {devices}")
    wrong = sorted(program.sharding_devices - {devices})
    if wrong:
        raise FlintError(f"{where} has shardings over {wrong[0]} devices but --devices is "
                         f"{devices}")


def _sdy_mesh(program: _Program) -> tuple[tuple[str, int], ...] | None:
    """The program's own mesh: its first sdy mesh with more than one device."""
    for _, axes in program.meshes:
        if math.prod(s for _, s in axes) > 1:
            return tuple(axes)
    return None


def _per_device_replicas(program: _Program, devices: int, where: str) -> int:
    """Replicas to compile a per-device program for: 1, unless its collectives name peers
    (explicit replica groups), when XLA needs all `devices` replicas to check them."""
    replicas = program.num_replicas or 1
    if replicas > 1 and replicas != devices:
        raise FlintError(f"{where} is replicated over {replicas} devices (mhlo.num_replicas) "
                         f"but --devices is {devices}")
    if program.collectives and replicas == 1:
        replicas = devices
    return replicas


def _set_num_partitions(module, partitions: int) -> None:
    """Exporters may leave num_partitions out; XLA partitions for it, so it must be N."""
    with module.context:
        module.operation.attributes["mhlo.num_partitions"] = ir.IntegerAttr.get(
            ir.IntegerType.get_signless(32), partitions)


def _str_attr(attrs, name: str) -> str | None:
    return attrs[name].value if name in attrs and isinstance(attrs[name], ir.StringAttr) \
        else None


def _int_attr(attrs, name: str) -> int | None:
    return int(attrs[name].value) if name in attrs and isinstance(attrs[name], ir.IntegerAttr) \
        else None


# --- compiling --------------------------------------------------------------------------
def _compile(module, devices: list, replicas: int, partitions: int, load: bool,
             overrides: dict | None = None) -> str:
    """Optimized HLO text of `module` compiled by XLA for `devices` (replica-major), with
    XLA debug options `overrides`.

    Private JAX API, kept here alone: `jax._src.compiler.get_compile_options` builds the
    options jit itself uses (optimization levels, CUDA data dir, SPMD partitioning), so a
    file compiles as Flint's JAX path would. The client's `compile` (not jit's
    `backend_compile_and_load`, which would start JAX's backends looking for a real GPU to
    cross-compile with) only compiles: nothing is loaded onto a device. The options enable
    Shardy, as jit's do; XLA itself falls back to GSPMD for programs annotated with
    mhlo.sharding (torch-xla, JAX without Shardy).
    """
    import numpy as np
    from jax._src import compiler

    assignment = np.array(devices, dtype=object).reshape(replicas, partitions)
    options = compiler.get_compile_options(num_replicas=replicas, num_partitions=partitions,
                                           device_assignment=assignment,
                                           env_options_overrides=overrides or None)
    client = devices[0].client
    # Host CPU devices belong to a real client, whose bare `compile` has no CPU compiler
    # registered; compiling and loading onto them is cheap. Compile-only clients only compile.
    compile_fn = client.compile_and_load if load else client.compile
    executable = compile_fn(
        module, executable_devices=xla_client.DeviceList(tuple(devices)),
        compile_options=options)
    return executable.hlo_modules()[0].to_string()


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else type(e).__name__
