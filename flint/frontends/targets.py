"""Compile-only devices for a target: N virtual GPUs, TPUs or host CPUs, with no hardware.

GPU: the CUDA PJRT plugin compiles for a topology `1x{hosts}x{gpus_per_host}` described by a
GpuTargetConfigProto text file per SKU (gpu_targets/*.pbtxt, figures from public specs).
TPU: libtpu's topology descriptions (optional extra). CPU: host devices of this process.
"""
from __future__ import annotations

import contextlib
import os
import re
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from flint.errors import FlintError

GPU_TARGETS_DIR = Path(__file__).parent / "gpu_targets"
# generation, torus dims, devices per chip in libtpu's compile-only topology (v4 exposes both
# TensorCores; it has no megacore option), most chips in one slice: the spec's largest slice
# (its `torus`: v4 16x16x16, v5e and v6e 16x16 (larger v5e aborts in compile), v5p 16x16x24
# = 6144 chips, though its Pod has 8960: Cloud TPU's 'TPU v5p' page)
TPU_TARGETS = {"tpu-v4": ("v4", 3, 2, 4096), "tpu-v5e": ("v5e", 2, 1, 256),
               "tpu-v5p": ("v5p", 3, 1, 6144), "tpu-v6e": ("v6e", 2, 1, 256)}
# The collective flags MaxText's TPU training scripts export (LIBTPU_INIT_ARGS in
# MaxText/configs/v5p/*.sh and v5e/*.sh; the tpu-recipes set the same): FSDP's all-gathers
# become async collective fusions the TensorCore carries beside its compute (start,
# continuation and done fusions: passes.tpu_async), the data-
# parallel all-reduce is optimized, collective-permutes run asynchronously. Without them
# libtpu's all-gathers are synchronous. libtpu reads the flags once, when it loads; a
# LIBTPU_INIT_ARGS of the user's own wins (stage programs are keyed by the flags in effect).
TPU_TRAINING_FLAGS = " ".join((
    "--xla_tpu_enable_async_collective_fusion_fuse_all_gather=true",
    "--xla_tpu_megacore_fusion_allow_ags=false", "--xla_enable_async_collective_permute=true",
    "--xla_tpu_enable_ag_backward_pipelining=true",
    "--xla_tpu_enable_data_parallel_all_reduce_opt=true",
    "--xla_tpu_data_parallel_opt_different_sized_ops=true",
    "--xla_tpu_enable_async_collective_fusion=true",
    "--xla_tpu_enable_async_collective_fusion_multiple_steps=true",
    "--xla_tpu_overlap_compute_collective_tc=true", "--xla_enable_async_all_gather=true"))


def libtpu_flags() -> str:
    """The flags libtpu compiles TPU programs under in this process."""
    return os.environ.get("LIBTPU_INIT_ARGS", TPU_TRAINING_FLAGS)


# libtpu's size threshold (MiB) below which SPMD partitioning keeps an all-gather or
# reduce-scatter feeding a dot as it is rather than a windowed einsum (collective matmul).
# MaxText's benchmarks/xla_flags_library.py: DISABLE_COLLECTIVE_MATMUL sets it to 1000000.
# A per-compile option (compiler_options), unlike LIBTPU_INIT_ARGS. Only `off` is offered:
# a threshold of 0 does not make every such dot one (libtpu 0.0.42 keeps an 8-chip FSDP
# MLP of 8192 x 2048 x 8192 as it is), so XLA's own choice cannot be overruled that way.
WINDOWED_EINSUM_THRESHOLD = "xla_jf_spmd_threshold_for_windowed_einsum_mib"
COLLECTIVE_MATMUL_OFF_MIB = 1_000_000


def collective_matmul_options(mode: str) -> dict:
    """The compile options of a TPU run's collective matmul (auto: none)."""
    return {WINDOWED_EINSUM_THRESHOLD: COLLECTIVE_MATMUL_OFF_MIB} if mode == "off" else {}


def tpu_program_keys(target: str) -> dict:
    """What keys a stage program compiled for `target` besides the model and mesh: on a
    TPU, libtpu's flags in effect and how the lowering reads its programs."""
    if target not in TPU_TARGETS:
        return {}
    from flint.passes.tpu_async import TPU_LOWERING_VERSION

    return {"libtpu_flags": libtpu_flags(), "tpu_lowering_version": TPU_LOWERING_VERSION}


TPU_CHIPS_PER_HOST = 4    # libtpu's default chips_per_host_bounds is 2x2x1
ALIASES = {"h100": "h100-sxm", "h100-80gb": "h100-sxm", "a100": "a100-80gb-sxm",
           "a100-40gb": "a100-40gb-sxm", "a100-80gb": "a100-80gb-sxm", "host": "cpu"}


@dataclass(frozen=True)
class Target:
    """Where a program compiles (`hardware`, a compile-only target, on `platform`) and the
    hardware spec it is priced with (`spec`: a spec name or a spec YAML path)."""

    hardware: str
    platform: str            # gpu | tpu | cpu
    spec: str = ""

    def __post_init__(self):
        if not self.spec:
            object.__setattr__(self, "spec", self.hardware)


def gpu_target_names() -> list[str]:
    return sorted(p.stem for p in GPU_TARGETS_DIR.glob("*.pbtxt"))


def known_hardware() -> list[str]:
    """The compile-only targets (what XLA compiles for)."""
    return gpu_target_names() + sorted(TPU_TARGETS) + ["cpu"]


def _compile_target(name: str) -> Target | None:
    if name in gpu_target_names():
        return Target(name, "gpu")
    if name in TPU_TARGETS:
        return Target(name, "tpu")
    if name == "cpu":
        return Target(name, "cpu")
    return None


def resolve_target(hardware: str) -> Target:
    """`--hardware` is a hardware spec (a name of hardware_models/specs, or a spec YAML
    path); the program compiles for the target the spec names (`compile_target`). A
    compile target's own name (or an alias such as `h100`) is the spec of that name."""
    name = ALIASES.get(str(hardware).lower(), str(hardware).lower())
    direct = _compile_target(name)
    if direct is not None:
        return direct
    from flint.hardware_models.spec import load_spec, spec_names

    is_path = str(hardware).endswith((".yaml", ".yml"))
    if not is_path and name not in spec_names():
        raise FlintError(f"unknown hardware {hardware!r}; specs: {', '.join(spec_names())} "
                         f"(or a spec YAML path; `flint hardware` lists them)")
    spec = load_spec(str(hardware) if is_path else name)
    target = _compile_target(spec.compile_target) if spec.compile_target else None
    if target is None and _compile_target(spec.name) is not None:
        target = _compile_target(spec.name)       # a calibrated copy of a target's spec
    if target is None:
        why = (f"names compile target {spec.compile_target!r}, which Flint does not know"
               if spec.compile_target else "names no compile target")
        raise FlintError(f"hardware spec {spec.name!r} {why}: Flint cannot compile programs "
                         f"for it (compile targets: {', '.join(known_hardware())}; a spec "
                         f"says which with `compile_target:`)")
    return Target(target.hardware, target.platform, str(hardware) if is_path else spec.name)


def prepare_environment() -> None:
    """Process settings that must precede `import jax` for compile-only targets."""
    os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
    # The CUDA plugin is only needed for its compiler: never start a GPU runtime here.
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


def import_jax_quietly() -> None:
    """Import JAX with fd 2 captured: its CUDA plugin probes for drivers as it loads and
    logs "Could not find cuda drivers on your machine" through absl, before Flint has
    said anything (every front end imports JAX: the zoo, the torch twin's configs)."""
    import sys

    if "jax" not in sys.modules:
        prepare_environment()
        with quiet_native_stderr():
            import jax  # noqa: F401


@contextlib.contextmanager
def quiet_native_stderr(notes: list | None = None):
    """Capture C++ output on fd 2 (CUDA stub probes, XLA warnings); replay it if we fail.

    XLA warnings (lines like `W1122 03:19:09.8 123 file.cc:42] text`) are appended to
    `notes` as `file.cc: text`, without the time stamp, so they can be reported.
    """
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        except (FlintError, KeyboardInterrupt):
            raise           # bad input or an interrupt: one line, not the native noise
        except BaseException:
            os.dup2(saved, 2)
            sink.seek(0)
            os.write(2, sink.read()[-4000:])
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            if notes is not None:
                sink.seek(0)
                notes.extend(_xla_warnings(sink.read().decode(errors="replace")))


# XLA's Triton GEMM emitter, un-autotuned on compile-only devices (no device to time its
# candidate tilings on), finds no tiling for some fused dots (the output projection of
# 225-wide heads) and fails the whole compile with this status; with the emitter off those
# dots run as library GEMMs (cuBLAS), as XLA's own fallback does wherever Triton declines one
TRITON_GEMM = "xla_gpu_enable_triton_gemm"
_TRITON_TILING = "Couldn't find output tile sizes"


def compile_with_fallback(compile_fn, notes: list):
    """`compile_fn(overrides)` (XLA debug options to add: {} first) with fd 2 captured; run
    once more with the Triton GEMM emitter off when it is what failed (said in `notes`).
    Raises the compile's own exception otherwise."""
    for overrides in ({}, {TRITON_GEMM: False}):
        failure = None
        with quiet_native_stderr(notes):
            try:
                return compile_fn(overrides)
            except Exception as e:  # XLA raises JaxRuntimeError with a multi-line status
                failure = e
        if overrides or _TRITON_TILING not in str(failure):
            raise failure
        first = str(failure).strip().splitlines()[0]
        notes.append(f"XLA's Triton GEMM emitter found no tiling for a dot "
                     f"({first[:160]}...): compiled with {TRITON_GEMM}=false, the dots as "
                     f"library GEMMs")


_LOG_LINE = re.compile(r"^[WE]\d{4} [\d:.]+\s+\d+ ([\w.]+):\d+\] (.*)$")


def _xla_warnings(text: str) -> list[str]:
    return [f"{m.group(1)}: {m.group(2)}" for m in map(_LOG_LINE.match, text.splitlines()) if m]


def start_devices(hardware: str, count: int, devices_per_host: int | None = None) -> None:
    """Create the compile-only devices and start JAX's backends, quietly, before a user's
    script runs JAX code of its own (`jax.random.key(0)` in example_args starts the
    backends: with one host device where the CPU target needs `count`, and with the CUDA
    plugin's driver probe on stderr)."""
    target = resolve_target(hardware)
    devices_for(target, count, devices_per_host or default_devices_per_host(target))
    with quiet_native_stderr():
        import jax

        jax.devices()


def devices_for(target: Target, count: int, devices_per_host: int) -> list:
    """`count` compile-only devices of the target, in rank order."""
    if count < 1:
        raise FlintError(f"device count must be >= 1, got {count}")
    if target.platform == "gpu":
        return _gpu_devices(target.hardware, count, devices_per_host)
    if target.platform == "tpu":
        return _tpu_devices(target.hardware, count)
    return _cpu_devices(count)


def _gpu_devices(hardware: str, count: int, per_host: int) -> list:
    per_host = min(per_host, count)
    if count % per_host:
        raise FlintError(f"{count} devices do not fill hosts of {per_host} GPUs")
    return list(_gpu_topology(hardware, count // per_host, per_host).devices)


@lru_cache(maxsize=16)
def _gpu_topology(hardware: str, hosts: int, per_host: int):
    prepare_environment()
    with quiet_native_stderr():
        from jax.experimental import topologies

        _register_cuda_compiler()
        config = (GPU_TARGETS_DIR / f"{hardware}.pbtxt").read_text()
        try:
            return topologies.get_topology_desc(
                platform="cuda", topology=f"1x{hosts}x{per_host}", target_config=config)
        except Exception as e:  # the plugin is missing or rejects the target
            raise FlintError(f"cannot create compile-only {hardware} devices: "
                             f"{str(e).splitlines()[0]}") from None


def _register_cuda_compiler() -> None:
    """Make the CUDA plugin's compile-only topologies available when JAX started before
    Flint could configure it (a script that ran `import jax` and used JAX before `import
    flint`): the plugin then checked for a CUDA runtime, found none and did not register.
    Only its topology factory is registered here (the compiler needs no driver); the
    backends the process already runs are left as they are."""
    from jax._src import xla_bridge as xb

    xb._discover_and_register_pjrt_plugins()     # as make_pjrt_topology does first
    if "cuda" in xb._topology_factories:
        return
    try:
        from functools import partial

        from jax._src.lib import xla_client
        from jax_plugins import xla_cuda12 as plugin
    except ImportError:
        return        # no CUDA plugin installed: the caller's error says so
    path = plugin._get_library_path()
    if path is None:
        return
    c_api = xla_client.load_pjrt_plugin_dynamically("cuda", str(path))
    xb._topology_factories["cuda"] = partial(xla_client.make_c_api_device_topology, c_api)


def slice_shape(hardware: str, chips: int) -> tuple[int, ...]:
    """The torus of a `chips`-chip slice of `hardware`, smallest dimension first: the most
    cubic shape whose dimensions are 1, 2 or a multiple of 4, as Cloud TPU's accelerator
    types are (v5p-128: 4x4x4; v4-384, 192 chips: 4x4x12); a balanced power of two where
    there is one (hardware_models.topology.most_cubic_slice)."""
    from flint.hardware_models.spec import load_spec
    from flint.hardware_models.topology import most_cubic_slice, parse_torus_shape

    return tuple(sorted(parse_torus_shape(most_cubic_slice(load_spec(hardware), chips))))


def tpu_devices_per_host(hardware: str) -> int:
    return TPU_CHIPS_PER_HOST * TPU_TARGETS[hardware][2]


def default_devices_per_host(target: Target) -> int:
    """Devices per host when none is given: an 8-GPU server, a TPU host's chips' cores,
    4 host-CPU devices."""
    if target.platform == "gpu":
        return 8
    return tpu_devices_per_host(target.hardware) if target.platform == "tpu" else 4


def _tpu_devices(hardware: str, count: int) -> list:
    generation, dims, per_chip, max_chips = TPU_TARGETS[hardware]
    if count % per_chip:
        raise FlintError(f"{hardware} has {per_chip} TensorCores (devices) per chip; "
                         f"{count} devices is not a whole number of chips")
    chips = count // per_chip
    # beyond the largest slice: equal slices joined over DCN (Multislice, as MaxText's
    # compile_topology_num_slices compiles them)
    slices = 1 if chips <= max_chips else -(-chips // max_chips)
    if chips % slices:
        raise FlintError(f"{hardware} slices have at most {max_chips} chips; {chips} chips "
                         f"are no whole number of equal slices")
    shape = slice_shape(hardware, chips // slices)
    bounds = None
    if chips < TPU_CHIPS_PER_HOST:  # one host smaller than 2x2: libtpu needs its bounds
        bounds = shape + (1,) * (3 - dims)
    elif shape[0] == 1:             # 1x2x2 does not tile 2x2x1 hosts; 2x2x1 does
        shape = tuple(sorted(shape, reverse=True))
    return list(_tpu_topology(f"{generation}:" + "x".join(map(str, shape)), bounds,
                              slices).devices)


@lru_cache(maxsize=16)
def _tpu_topology(name: str, chips_per_host_bounds: tuple | None, slices: int = 1):
    kw = {"chips_per_host_bounds": list(chips_per_host_bounds)} if chips_per_host_bounds else {}
    if slices > 1:
        kw["num_slices"] = slices
    os.environ.setdefault("LIBTPU_INIT_ARGS", TPU_TRAINING_FLAGS)
    with quiet_native_stderr():  # libtpu probes for a TPU VM and logs the failure on fd 2
        try:
            import libtpu  # noqa: F401
        except ImportError:
            raise FlintError("TPU targets need libtpu: pip install 'flint[tpu]'") from None
        from jax.experimental import topologies

        try:
            return topologies.get_topology_desc(name, "tpu", **kw)
        except Exception as e:
            raise FlintError(f"cannot create TPU topology {name}: "
                             f"{str(e).splitlines()[0]}") from None


def _cpu_devices(count: int) -> list:
    from flint.frontends.host_devices import host_devices

    with quiet_native_stderr():  # starting JAX's backends also probes for CUDA drivers
        return host_devices(count)
