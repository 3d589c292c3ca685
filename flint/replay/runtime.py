"""Flint replay runtime: runs a replay spec (flint.replay.spec) as one JAX program.

This module is copied verbatim into every program `flint replay` writes, so it imports only
the standard library, NumPy and JAX, and it works on whatever devices JAX finds: host CPU
devices (it asks XLA for as many as the graph has, before JAX starts) or GPUs/TPUs.

The step is `shard_map` over a mesh shaped like the graph's, so every device runs the
graph's per-device program and collectives go over the mesh axes the graph's communicators
span. Each op runs under the name scope `flint_n<id>`; after compiling, the program maps the
compiled step's instruction names back to graph node names (`flint_replay_names.json` beside
a profile), so a profiler trace of the replay validates against the graph it came from.
"""
import argparse
import json
import math
import os
import re
import statistics
import sys
import time

NAMES_FILE = "flint_replay_names.json"
# The graph's collectives are what the compiler emitted after combining; combining the
# replay's again would merge collectives the original ran apart (e.g. in loop iterations).
KEEP_COLLECTIVES_APART = ",".join(f"{p}{kind}-combiner" for p in ("", "cpu-", "gpu-")
                                  for kind in ("all-reduce", "all-gather", "reduce-scatter"))
DTYPES = {"f16": "float16", "bf16": "bfloat16", "f32": "float32", "f64": "float64",
          "s8": "int8", "s16": "int16", "s32": "int32", "s64": "int64", "u8": "uint8",
          "u16": "uint16", "u32": "uint32", "u64": "uint64", "pred": "bool",
          "f8e4m3fn": "float8_e4m3fn", "f8e5m2": "float8_e5m2", "s4": "int8", "u4": "uint8",
          "c64": "complex64", "c128": "complex128"}


def ask_for_host_devices(count):
    """Before JAX starts: let the host CPU platform have `count` devices (no-op on GPUs)."""
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={count}".strip()


class ReplayError(Exception):
    """A spec this machine cannot replay (too few devices, unknown format)."""


class Replay:
    """A compiled replay step and the buffers it reads; `run()` executes one step."""

    def __init__(self, spec, devices=None):
        import jax
        import numpy as np
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        if spec.get("format") != "flint.replay" or spec.get("version") != 1:
            raise ReplayError("not a Flint replay spec (format flint.replay, version 1)")
        self.spec = spec
        names = tuple(a for a, _ in spec["mesh"])
        sizes = [s for _, s in spec["mesh"]]
        found = list(devices if devices is not None else jax.devices())
        if len(found) < spec["devices"]:
            raise ReplayError(f"the graph has {spec['devices']} devices but JAX sees "
                              f"{len(found)} {found[0].platform} device(s); replay on host CPU "
                              f"devices with JAX_PLATFORMS=cpu")
        self.mesh = Mesh(np.array(found[:spec["devices"]]).reshape(sizes), names)
        sharded = NamedSharding(self.mesh, PartitionSpec(names))
        self.buffers = [jax.jit(_filler(s, spec["devices"]), out_shardings=sharded)()
                        for s in spec["buffers"]]
        self.step = jax.jit(_shard_map(self.replay_step, self.mesh, PartitionSpec(names)))
        t0 = time.perf_counter()
        self.compiled = self.step.lower(*self.buffers).compile(
            compiler_options={"xla_disable_hlo_passes": KEEP_COLLECTIVES_APART})
        self.compile_s = time.perf_counter() - t0

    def replay_step(self, *buffers):
        import jax

        values = {(-1, j): b[0] for j, b in enumerate(buffers)}
        for op in self.spec["ops"]:
            with jax.named_scope(f"flint_n{op['id']}"):
                xs = [values[tuple(src)] for src in op["in"]]
                if op.get("repeat") and xs:
                    xs[0] = xs[0] + _offset(op, xs[0].dtype)
                outs = EMIT[op["op"]](op, xs, values[(-1, 0)])
            for k, y in enumerate(outs):
                values[(op["id"], k)] = y
        return tuple(values[tuple(s)][None] for s in self.spec["sinks"])

    def run(self):
        import jax

        out = self.compiled(*self.buffers)
        jax.block_until_ready(out)
        return out

    def time_steps(self, steps, warmup=2):
        """Seconds per step, `steps` timed runs after `warmup` untimed ones."""
        for _ in range(warmup):
            self.run()
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            self.run()
            times.append(time.perf_counter() - t0)
        return times

    def profile(self, log_dir, steps, warmup=1):
        """Trace `steps` runs with jax.profiler into `log_dir`, with the names map beside."""
        import jax

        for _ in range(warmup):
            self.run()
        jax.profiler.start_trace(str(log_dir))
        try:
            for i in range(steps):
                with jax.profiler.StepTraceAnnotation("replay", step_num=i):
                    self.run()
        finally:
            jax.profiler.stop_trace()
        path = os.path.join(str(log_dir), NAMES_FILE)
        with open(path + ".tmp", "w") as f:
            json.dump(self.names(), f, sort_keys=True, indent=1)
        os.replace(path + ".tmp", path)
        return path

    def names(self):
        """{"module": compiled module name, "ops": {instruction name: graph node name}}.
        An instruction without its own `flint_n<id>` metadata (XLA CPU's dot fusions carry
        none) takes the node named most often inside the computation it calls."""
        text = self.compiled.as_text()
        module = re.search(r"HloModule ([\w.\-]+)", text).group(1)
        node_name = {op["id"]: op["name"] for op in self.spec["ops"]}
        own, calls, inside, where, computation = {}, {}, {}, {}, None
        for line in text.splitlines():
            head = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$", line)
            if head:
                computation = head.group(1)
                continue
            ins = re.match(r"^\s*(?:ROOT )?%?([\w.\-]+) = ", line)
            if not ins:
                continue
            where[ins.group(1)] = computation
            tag = re.search(r'op_name="[^"]*flint_n(\d+)/', line)
            if tag:
                own[ins.group(1)] = int(tag.group(1))
                inside.setdefault(computation, []).append(int(tag.group(1)))
            called = re.search(r"calls=%?([\w.\-]+)", line)
            if called:
                calls[ins.group(1)] = called.group(1)
        for name, callee in calls.items():
            ids = inside.get(callee)
            if name not in own and ids:
                own[name] = max(sorted(set(ids)), key=ids.count)
        fused = set(calls.values())      # called computations: not instructions a trace names
        top = {k: v for k, v in own.items() if where[k] not in fused}
        return {"module": module, "ops": {k: node_name[v] for k, v in sorted(top.items())}}


def _offset(op, dtype):
    """A per-op constant: keeps two ops on the same data from being merged by CSE."""
    import jax.numpy as jnp

    return jnp.asarray(True if dtype == jnp.bool_ else op["id"] % 7 + 1, dtype)


def _np_dtype(name):
    import jax.numpy as jnp

    return jnp.dtype(DTYPES.get(name, "float32"))


def _filler(shape, devices):
    """A jitted constant-fill of one input buffer: a leading axis of one row per device."""
    import jax.numpy as jnp

    dtype = _np_dtype(shape[0])
    value = True if dtype == jnp.bool_ else 1 if jnp.issubdtype(dtype, jnp.integer) else 0.5
    return lambda: jnp.full((devices,) + tuple(shape[1]), value, dtype)


def _shard_map(fn, mesh, spec):
    try:
        from jax import shard_map
    except ImportError:   # older JAX
        from jax.experimental.shard_map import shard_map
    try:
        return shard_map(fn, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False)
    except TypeError:     # older JAX spells it check_rep
        return shard_map(fn, mesh=mesh, in_specs=spec, out_specs=spec, check_rep=False)


def _work_dtype(dtype):
    import jax.numpy as jnp

    return dtype if dtype in (jnp.float64, jnp.complex64, jnp.complex128) else jnp.float32


def _fit(flat, count):
    """A flat array of `count` elements from `flat`: summed down when larger (a reduction
    reads all of it); when smaller (an index, a scale, a broadcast row) its sum is
    broadcast, which the compiler fuses into the op instead of materializing a copy."""
    import jax.numpy as jnp

    n = flat.shape[0]
    if n == count:
        return flat
    if n > count:
        q = n // count
        return flat[:q * count].reshape(count, q).sum(axis=1)
    return jnp.broadcast_to(flat.sum(), (count,))


def _conform(y, shape):
    """`y` as an array of `shape` ([dtype, dims]), re-viewed when the sizes agree."""
    dims = tuple(shape[1])
    dtype = _np_dtype(shape[0])
    if y.size != math.prod(dims):
        y = _fit(y.reshape(-1).astype(_work_dtype(y.dtype)), math.prod(dims))
    return y.reshape(dims).astype(dtype)


def _emit_ew(op, xs, seed):
    """Read `read_bytes` from the operands (slices when the node reads part of them, as a
    dynamic-slice does) and write every output. The constants differ per op so that the
    compiler cannot merge two ops reading the same data."""
    if not xs:
        xs = [seed]
    have = sum(x.size * x.dtype.itemsize for x in xs)
    share = min(1.0, op["read_bytes"] / have) if have and op["read_bytes"] else 1.0
    out_total = sum(math.prod(s[1]) for s in op["out"])
    work = _work_dtype(_np_dtype(op["out"][0][0]))
    acc = None
    for x in xs:
        flat = x.reshape(-1)
        keep = max(1, math.ceil(flat.shape[0] * share))
        part = _fit(flat[:keep].astype(work), out_total)
        acc = part if acc is None else acc + part
    if op["tanh"]:
        acc = _tanh(acc)
    outs, at = [], 0
    for shape in op["out"]:
        n = math.prod(shape[1])
        outs.append(_conform(acc[at:at + n] * 1.0009765625 + (0.5 + op["id"] * 2.0 ** -16),
                             shape))
        at += n
    return outs


def _tanh(x):
    import jax.numpy as jnp

    return jnp.tanh(x) if jnp.issubdtype(x.dtype, jnp.floating) else x


def _emit_gemm(op, xs, seed):
    import jax.numpy as jnp
    from jax import lax

    b, m, k, n = op["bmkn"]
    lhs, rhs = xs[op["lhs"]], xs[op["rhs"]]
    dtype = jnp.promote_types(lhs.dtype, rhs.dtype)
    out = op["out"][0]
    # Without a batch the dot is 2-D: XLA would rewrite a [1, m, k] batched dot into a new
    # instruction that loses the op's name scope.
    batched = (((2,), (1,)), ((0,), (0,))) if b > 1 else (((1,), (0,)), ((), ()))
    lead = (b,) if b > 1 else ()
    y = lax.dot_general(lhs.reshape(lead + (m, k)).astype(dtype),
                        rhs.reshape(lead + (k, n)).astype(dtype), batched,
                        preferred_element_type=_work_dtype(_np_dtype(out[0])))
    y = y.reshape(-1)
    for i, x in enumerate(xs):      # epilogue operands (bias, residual): read, as fused
        if i not in (op["lhs"], op["rhs"]):
            y = y + _fit(x.reshape(-1).astype(y.dtype), y.shape[0])
    return [_conform(y, shape) for shape in op["out"]]


def _emit_collective(op, xs, seed):
    import jax.numpy as jnp
    from jax import lax

    axes = tuple(op["axes"]) if len(op["axes"]) > 1 else op["axes"][0]
    kind, group = op["type"], op["group"]
    if kind == "all-to-all" and len(xs) == group and len({x.shape for x in xs}) == 1:
        # XLA's tuple form: operand i goes to peer i; one all-to-all of them stacked.
        y = lax.all_to_all(jnp.stack(xs), axes, 0, 0, tiled=True)
        if len(op["out"]) != group:
            return [y[i] for i in range(group)]
        return [_conform(y[i], s) for i, s in enumerate(op["out"])]
    outs = []
    for x in xs:
        # Gathered and scattered data move as flat buffers: the same bytes, and no layout
        # change for the compiler to insert (gathering a minor dimension costs a transpose).
        wire = x.astype("int8") if x.dtype == bool else x
        if kind == "all-reduce":
            y = lax.psum(wire, axes)
        elif kind == "all-gather":
            y = lax.all_gather(wire.reshape(-1), axes, axis=0, tiled=True)
        elif kind == "reduce-scatter":
            y = lax.psum_scatter(_divisible(wire, group), axes, scatter_dimension=0, tiled=True)
        elif kind == "all-to-all":
            y = lax.all_to_all(_divisible(wire, group), axes, 0, 0, tiled=True)
        else:
            y = lax.ppermute(wire, tuple(op["axes"]), perm=[tuple(p) for p in op["pairs"]])
        outs.append(y)
    shapes = op["out"] or [[op["shapes"][i][0], list(y.shape)] for i, y in enumerate(outs)]
    return [_conform(outs[min(i, len(outs) - 1)], s) for i, s in enumerate(shapes)]


def _divisible(x, group):
    """`x` flat, cut (or padded by repetition) to a multiple of the group size."""
    flat = x.reshape(-1)
    keep = max(group, flat.shape[0] // group * group)
    if flat.shape[0] < keep:
        flat = _fit(flat, keep)
    return flat[:keep]


def _emit_nop(op, xs, seed):
    return [_conform(seed.reshape(1), s) for s in op["out"]]


EMIT = {"ew": _emit_ew, "gemm": _emit_gemm, "coll": _emit_collective, "nop": _emit_nop}


def main(spec, argv=None):
    """The generated program's command line: time `--steps` steps, optionally profile."""
    p = argparse.ArgumentParser(description=f"Flint replay of {spec.get('source', 'a graph')}: "
                                f"{len(spec['ops'])} ops on {spec['devices']} devices")
    p.add_argument("--steps", type=int, default=10, help="timed steps (default 10)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first (default 2)")
    p.add_argument("--profile", metavar="DIR", help="also trace the steps with jax.profiler")
    p.add_argument("--json", action="store_true", help="print the timings as JSON")
    a = p.parse_args(argv)
    if a.steps < 1 or a.warmup < 0:
        print("error: --steps must be >= 1 and --warmup >= 0", file=sys.stderr)
        return 2
    ask_for_host_devices(spec["devices"])
    try:
        replay = Replay(spec)
    except ReplayError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    times = replay.time_steps(a.steps, a.warmup)
    result = {"ops": len(spec["ops"]), "devices": spec["devices"],
              "platform": replay.mesh.devices.flat[0].platform, "compile_s": replay.compile_s,
              "steps": a.steps, "step_s": times, "median_step_s": statistics.median(times)}
    if a.profile:
        result["names_file"] = replay.profile(a.profile, a.steps)
    if a.json:
        print(json.dumps(result, sort_keys=True))
    else:
        print(f"replayed {result['ops']} ops on {result['devices']} {result['platform']} "
              f"devices: compile {result['compile_s']:.2f} s; step median "
              f"{result['median_step_s'] * 1e3:.3f} ms, min {min(times) * 1e3:.3f} ms, "
              f"max {max(times) * 1e3:.3f} ms over {a.steps} steps")
    return 0
