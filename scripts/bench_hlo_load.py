"""Load and validate a synthetic 40k-instruction HLO module under a memory cap.

Writes the nsys-jax archives of a synthetic multi-process run (one archive per process, one
GPU each): an FSDP-style step of `--layers` layers (all-gather of the weight shard, two
GEMMs, `--fusions` loop fusions of an 8-instruction elementwise chain, a reduce-scatter of
the gradient), its optimized HLO as an HloProto numbered the way XLA before 2025 numbered
instructions (one counter for the whole module, as nsys-jax dumps are), and per-thunk GPU
times in `nvtx_gpu_proj_trace/trace.parquet` (synthetic durations: bytes moved at 2.5 TB/s
plus 3 us, deterministic jitter; they exercise the join, not the cost model). A small
`jit_train_step` module runs too, so the default module must be the busiest, not the name.

Then, each in a child process under RLIMIT_AS = `--cap-gb`:
  before  jaxlib loads the module proto as dumped (what Flint did before ids were compacted)
  after   `flint validate --trace <archive> ...` (all archives of the run at once)
and prints each one's peak RSS and wall time.

    python scripts/bench_hlo_load.py [--layers 216] [--id-stride 8] [--processes 4] [--cap-gb 4]
"""
from __future__ import annotations

import argparse
import io
import json
import lzma
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

H, T, SHARD = 1024, 2048, 4           # hidden size, tokens per device, FSDP degree
BF16 = 2
MODULE = "jit_step_fn"
PROGRAM = 7


def step_hlo(layers: int, fusions: int) -> str:
    """HLO text of the synthetic step (one device's program of a 4-way FSDP run)."""
    act, w, shard = f"bf16[{T},{H}]", f"bf16[{H},{H}]", f"bf16[{H // SHARD},{H}]"
    out = [f"HloModule {MODULE}, is_scheduled=true", "",
           "%add_region (a: bf16[], b: bf16[]) -> bf16[] {",
           "  %a = bf16[] parameter(0)", "  %b = bf16[] parameter(1)",
           "  ROOT %sum = bf16[] add(%a, %b)", "}", ""]
    ops = ("add", "multiply", "subtract", "maximum", "add", "multiply")
    for layer in range(layers):
        for f in range(fusions):
            k = f"{layer}_{f}"
            out.append(f"%fused_computation.{k} (p0.{k}: {act}, p1.{k}: {act}) -> {act} {{")
            out.append(f"  %p0.{k} = {act}{{1,0}} parameter(0)")
            out.append(f"  %p1.{k} = {act}{{1,0}} parameter(1)")
            prev = f"p0.{k}"
            for j, op in enumerate(ops[:-1]):
                out.append(f"  %{op}.{k}.{j} = {act}{{1,0}} {op}(%{prev}, %p1.{k})")
                prev = f"{op}.{k}.{j}"
            out.append(f"  ROOT %{ops[-1]}.{k}.root = {act}{{1,0}} {ops[-1]}(%{prev}, %p1.{k})")
            out += ["}", ""]
    out.append(f"ENTRY %main (x: {act}, w: {shard}) -> {act} {{")
    out += [f"  %x = {act}{{1,0}} parameter(0)", f"  %w = {shard}{{1,0}} parameter(1)"]
    prev = "x"
    groups = "replica_groups={{0,1,2,3}}"
    for layer in range(layers):
        last = layer == layers - 1
        out.append(f"  %all-gather.{layer} = {w}{{1,0}} all-gather(%w), "
                   f"channel_id={2 * layer + 1}, {groups}, dimensions={{0}}, "
                   f"use_global_device_ids=true")
        out.append(f"  %dot.{layer}.0 = {act}{{1,0}} dot(%{prev}, %all-gather.{layer}), "
                   f"lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}")
        prev = f"dot.{layer}.0"
        for f in range(fusions):
            out.append(f"  %fusion.{layer}_{f} = {act}{{1,0}} fusion(%{prev}, %x), kind=kLoop, "
                       f"calls=%fused_computation.{layer}_{f}")
            prev = f"fusion.{layer}_{f}"
        out.append(f"  %dot.{layer}.1 = {w}{{1,0}} dot(%{prev}, %x), "
                   f"lhs_contracting_dims={{0}}, rhs_contracting_dims={{0}}")
        out.append(f"  %reduce-scatter.{layer} = {shard}{{1,0}} reduce-scatter(%dot.{layer}.1), "
                   f"channel_id={2 * layer + 2}, {groups}, dimensions={{0}}, "
                   f"use_global_device_ids=true, to_apply=%add_region")
        out.append(f"  {'ROOT ' if last else ''}%grad_sink.{layer} = {act}{{1,0}} "
                   f"add(%{prev}, %x)")
        prev = f"grad_sink.{layer}"
    out.append("}")
    return "\n".join(out) + "\n"


def module_wide_ids(module_proto: bytes, stride: int) -> bytes:
    """Renumber instructions with one counter for the whole module (pre-2025 XLA dumps),
    `stride` apart: passes create and delete instructions, so a dumped module's largest id
    is several times its instruction count (66,134 for 7,757 in the shared MaxText dump)."""
    from flint.hlo.proto_ids import renumber_instructions

    counter = iter(range(1_000, 1 << 31, stride))
    return renumber_instructions(module_proto, lambda _comp, old: [next(counter) for _ in old])


def hlo_proto(text: str, stride: int) -> bytes:
    from jaxlib import _hlo

    from flint.hlo.proto_ids import wrap_in_hlo_proto

    return wrap_in_hlo_proto(module_wide_ids(
        _hlo.hlo_module_from_text(text).as_serialized_hlo_module_proto(), stride))


def thunk_times(text: str, seed: int) -> list[tuple[str, int]]:
    """(instruction, ns) per entry instruction that launches a kernel, in program order."""
    rng = random.Random(seed)
    entry = text[text.index("ENTRY"):]
    out = []
    for line in entry.splitlines()[3:-1]:
        name = line.strip().removeprefix("ROOT ").split(" = ")[0].lstrip("%")
        collective = name.startswith(("all-gather", "reduce-scatter"))
        nbytes = H * H * BF16 if collective else 3 * T * H * BF16
        out.append((name, int((nbytes / 2.5e12 + 3e-6) * 1e9 * rng.uniform(0.9, 1.2))))
    return out


def trace_parquet(thunks, tid: int, steps: int, small_thunks: int) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = {"Name": [], "Projected Start": [], "Projected Duration": [], "TID": [],
            "RangeId": [], "ParentId": [], "PID": [], "Rank": []}

    def add(name, start, dur, rid, parent):
        for k, v in zip(rows, (name, start, dur, tid, float(rid), parent, 1000 + tid, 0)):
            rows[k].append(v)

    t, rid = 1_000_000, 1
    for _ in range(small_thunks):   # a small, frequent module whose name is the usual default
        add("TSL:XlaModule:#hlo_module=jit_train_step,program_id=3#", t, 2_000, rid, None)
        add("TSL:Thunk:#hlo_op=wrapped_add#", t, 2_000, rid + 1, float(rid))
        t, rid = t + 10_000, rid + 2
    for _ in range(steps):
        module_rid, start = rid, t
        rid += 1
        for name, ns in thunks:
            add(f"TSL:Thunk:#name=,hlo_op={name}#", t, ns, rid, float(module_rid))
            t, rid = t + ns + 500, rid + 1
        add(f"TSL:XlaModule:#prefix=jit(step_fn)/jit(main),hlo_module={MODULE},"
            f"program_id={PROGRAM}#", start, t - start, module_rid, None)
        t += 1_000_000
    buf = io.BytesIO()
    pq.write_table(pa.table(rows), buf)
    return buf.getvalue()


GPU_CONFIG = ('gpu_device_info {\n  core_count: 132\n  memory_bandwidth: 3352320000000\n'
              '  device_memory_size: 84929478656\n}\nplatform_name: "CUDA"\n'
              'device_description_str: "NVIDIA H100 80GB HBM3"\n')


def write_archives(out: Path, layers: int, fusions: int, processes: int, steps: int,
                   stride: int):
    text = step_hlo(layers, fusions)
    proto = hlo_proto(text, stride)
    packed, small = lzma.compress(proto), lzma.compress(_small_module())
    paths = []
    for p in range(processes):
        path = out / f"synthetic_rank{p}.nsys-jax.zip"
        with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
            stem = f"dump/module_{PROGRAM:04d}.{MODULE}"
            z.writestr(f"{stem}.sm_9.0_gpu_after_optimizations.hlo.pb.xz", packed)
            z.writestr(f"{stem}.gpu_target_config.pbtxt.xz", lzma.compress(GPU_CONFIG.encode()))
            z.writestr("dump/module_0003.jit_train_step.sm_9.0_gpu_after_optimizations.hlo.pb.xz",
                       small)
            z.writestr("nvtx_gpu_proj_trace/trace.parquet",
                       trace_parquet(thunk_times(text, seed=p), 2000 + p, steps, 200))
        paths.append(path)
    return paths, proto


def _small_module() -> bytes:
    from jaxlib import _hlo

    text = ("HloModule jit_train_step\n\nENTRY %main (a: f32[8], b: f32[8]) -> f32[8] {\n"
            "  %a = f32[8]{0} parameter(0)\n  %b = f32[8]{0} parameter(1)\n"
            "  ROOT %wrapped_add = f32[8]{0} add(%a, %b)\n}\n")
    return _hlo.hlo_module_from_text(text).as_serialized_hlo_module_proto()


BEFORE = """
import lzma, sys, time, zipfile
from jaxlib import _hlo
from flint.hlo.proto_ids import hlo_module_of
z = zipfile.ZipFile(sys.argv[1])
name = next(n for n in z.namelist()
            if n.endswith('after_optimizations.hlo.pb.xz') and 'step_fn' in n)
blob = hlo_module_of(lzma.decompress(z.read(name)))
t = time.time()
try:
    _hlo.HloModule.from_serialized_hlo_module_proto(blob).to_string()
    print('loaded in %.1f s' % (time.time() - t))
except MemoryError as e:
    print('MemoryError (%s) after %.1f s' % (e, time.time() - t))
"""


def measured(cmd: list[str], cap_bytes: int) -> tuple[int, float, float, str, str]:
    """(exit code, peak RSS in bytes, wall s, stdout, stderr) of `cmd` under RLIMIT_AS."""
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (cap_bytes, cap_bytes))

    t = time.time()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        p = subprocess.Popen(cmd, stdout=out, stderr=err, preexec_fn=limit)
        _, status, usage = os.wait4(p.pid, 0)
        wall = time.time() - t
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(), err.read().decode()
    return os.waitstatus_to_exitcode(status), usage.ru_maxrss * 1024, wall, stdout, stderr


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=216, help="216: 39,965 instructions")
    ap.add_argument("--fusions", type=int, default=20, help="loop fusions per layer")
    ap.add_argument("--processes", type=int, default=4, help="archives (one GPU each)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--id-stride", type=int, default=8, help="gap between dumped ids")
    ap.add_argument("--cap-gb", type=float, default=4.0, help="RLIMIT_AS of each child")
    ap.add_argument("--out", default=None, help="keep the archives in this directory")
    ap.add_argument("--skip-before", action="store_true")
    a = ap.parse_args()
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        run(a, Path(a.out))
    else:
        with tempfile.TemporaryDirectory(prefix="flint-bench-") as tmp:
            run(a, Path(tmp))


def run(a, out: Path) -> None:
    from flint.hlo.proto_ids import hlo_module_of, table_entries

    t = time.time()
    paths, proto = write_archives(out, a.layers, a.fusions, a.processes, a.steps,
                                  a.id_stride)
    count, entries = table_entries(hlo_module_of(proto))
    print(f"wrote {len(paths)} archives in {time.time() - t:.1f} s: {count} instructions, "
          f"{len(proto) / 1e6:.1f} MB HloProto; per-computation tables as dumped: "
          f"{entries / 1e6:.1f} M entries (compacted: {count / 1e6:.3f} M)")
    cap = int(a.cap_gb * 2**30)
    if not a.skip_before:
        code, rss, wall, text, _ = measured([sys.executable, "-c", BEFORE, str(paths[0])], cap)
        print(f"before (jaxlib on the ids as dumped, cap {a.cap_gb:g} GiB): "
              f"{text.strip() or f'exit {code}'}; "
              f"peak RSS {rss / 2**30:.2f} GiB, wall {wall:.1f} s")
    cmd = [sys.executable, "-m", "flint.cli", "validate", "--json"]
    for p in paths:
        cmd += ["--trace", str(p)]
    code, rss, wall, text, err = measured(cmd, cap)
    if code != 0:
        print(f"after: flint validate failed (exit {code}): {err.strip()[-400:]}")
        sys.exit(1)
    d = json.loads(text[text.index("{"):text.rindex("}") + 1])
    print(f"after (flint validate, {len(paths)} archives, cap {a.cap_gb:g} GiB): peak RSS "
          f"{rss / 2**30:.2f} GiB, wall {wall:.1f} s; joined {d['joined_ops']}/"
          f"{d['measured_ops']} ops ({100 * d['join_share']:.1f} % of time), steps "
          f"{d['steps']}, step error {100 * d['step_error']:+.1f} % (synthetic timings)")


if __name__ == "__main__":
    main()
