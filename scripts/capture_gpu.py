"""Measure Flint's workloads on a real GPU: the numbers `scripts/compare_gpu_capture.py`
checks Flint's predictions against. Runs where a GPU is; needs only torch and JAX (no Flint).

Parts, each in its own process with its own time limit (a part that fails or runs out of
time leaves the others' results):
- env        the GPU, driver, library versions, clocks and power limit (nvidia-smi)
- gemm       cuBLAS GEMMs through torch: the forward, input-gradient and weight-gradient
             GEMMs of Llama-3 8B/70B and GPT-3 175B layers at several TP degrees, squares,
             misaligned widths, fp32 with and without TF32; time per GEMM (CUDA events)
- attention  torch SDPA's flash, cuDNN, memory-efficient and math back ends on the
             FlashAttention-3 paper's shapes (16k tokens, 2048 wide), forward and backward
- jax_step   examples/gpu_llama_jax.py's train step: step time, peak memory, XLA's dump of
             the compiled step and a jax.profiler trace of steady-state steps
- torch_step examples/gpu_llama_torch.py run eagerly: step time, peak memory and a
             Kineto trace (record_shapes) of one steady-state step
- ops        eager memory-bound kernels (copies, casts, elementwise, norms, softmax,
             reductions, cross entropy) over sizes from 16 KiB to 1 GiB, Kineto-profiled

    python3 scripts/capture_gpu.py --out DIR [--part gemm --part ...] [--small]

The two step parts live in scripts/capture_gpu_steps.py; this file runs every part.

`--small` shrinks every size so the whole script runs on a CPU in a minute (a check of the
script, not a measurement).
"""
from __future__ import annotations

import argparse
import gzip
import json
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PARTS = {"env": 20, "gemm": 80, "attention": 110, "jax_step": 180, "torch_step": 100,
         "ops": 60}
STEP_PARTS = ("jax_step", "torch_step")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--part", action="append", choices=tuple(PARTS))
    p.add_argument("--small", action="store_true")
    p.add_argument("--run-part", choices=tuple(PARTS), help=argparse.SUPPRESS)
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    if a.run_part:
        if a.run_part in STEP_PARTS:       # the training steps: scripts/capture_gpu_steps.py
            import capture_gpu_steps as where
        else:
            where = sys.modules[__name__]
        getattr(where, f"part_{a.run_part}")(a.out, a.small)
        return
    for part in a.part or PARTS:
        t = time.time()
        cmd = [sys.executable, __file__, "--out", str(a.out), "--run-part", part]
        cmd += ["--small"] if a.small else []
        try:
            rc = subprocess.run(cmd, timeout=PARTS[part]).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        print(f"capture_gpu: {part}: rc {rc} in {time.time() - t:.1f} s", flush=True)


def _device(small: bool):
    import torch

    return torch.device("cuda" if torch.cuda.is_available() and not small else "cpu")


def timed(fn, device, target_s: float = 0.03, max_reps: int = 200) -> float:
    """Mean seconds per call of `fn` (CUDA events around a loop), median of 3 rounds."""
    import torch

    for _ in range(2):
        fn()
    if device.type != "cuda":
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    once = max(start.elapsed_time(end) / 1e3, 1e-6)
    reps = int(min(max_reps, max(3, target_s / once)))
    rounds = []
    for _ in range(3):
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        rounds.append(start.elapsed_time(end) / 1e3 / reps)
    return sorted(rounds)[1]


def _write(out: Path, name: str, payload) -> None:
    """One file for every part's figures (the parts run one after another)."""
    path = out / "measurements.json"
    merged = json.loads(path.read_text()) if path.exists() else {}
    merged[name] = payload
    path.write_text(json.dumps(merged, indent=1))
    print(f"capture_gpu: measured {name}", flush=True)


def _tar(path: Path, members: list[tuple[Path, str]], limit: int = 15 << 20) -> None:
    """A gzip tar of `members`; the largest are left out until it fits `limit` bytes (what
    one returned file may hold), each named on stdout."""
    members = sorted(members, key=lambda m: m[0].stat().st_size)
    while True:
        with tarfile.open(path, "w:gz") as tar:
            for f, arcname in members:
                tar.add(f, arcname=arcname)
        if path.stat().st_size <= limit or not members:
            break
        f, arcname = members.pop()
        print(f"capture_gpu: {arcname} ({f.stat().st_size >> 20} MiB) left out of {path.name}")
    print(f"capture_gpu: wrote {path.name} ({path.stat().st_size >> 10} KiB)", flush=True)


def part_env(out: Path, small: bool) -> None:
    import torch

    env = {"torch": torch.__version__, "cuda": torch.version.cuda,
           "cudnn": torch.backends.cudnn.version(), "python": sys.version.split()[0]}
    if torch.cuda.is_available():
        prop = torch.cuda.get_device_properties(0)
        env.update(gpu=prop.name, sms=prop.multi_processor_count,
                   memory_bytes=prop.total_memory,
                   l2_bytes=getattr(prop, "L2_cache_size", None))
    try:
        import jax

        env["jax"] = jax.__version__
    except Exception as e:      # noqa: BLE001 - recorded, not fatal
        env["jax"] = f"unavailable: {e}"
    if shutil.which("nvidia-smi"):
        q = ("name,driver_version,clocks.max.sm,clocks.max.mem,power.limit,power.max_limit,"
             "clocks.sm,clocks.mem,temperature.gpu")
        env["nvidia_smi"] = subprocess.run(
            ["nvidia-smi", f"--query-gpu={q}", "--format=csv"], capture_output=True,
            text=True).stdout
    _write(out, "env", env)


def gemm_shapes(small: bool) -> list[tuple]:
    """(label, m, n, k, a transposed, b transposed, dtype): C[m,n] = A[m,k] B[k,n]."""
    shapes = []

    def layer(model, tokens, hidden, q_width, kv_width, ffn, gated, tp):
        for name, n, k in (("qkv", (q_width + 2 * kv_width) // tp, hidden),
                           ("proj", hidden, q_width // tp),
                           ("up", (2 if gated else 1) * ffn // tp, hidden),
                           ("down", hidden, ffn // tp)):
            tag = f"{model} tp{tp} {name}"
            shapes.append((f"{tag} fwd", tokens, n, k, False, True, "bf16"))
            shapes.append((f"{tag} dgrad", tokens, k, n, False, False, "bf16"))
            shapes.append((f"{tag} wgrad", n, k, tokens, True, False, "bf16"))

    for tp in (1, 2, 4, 8):
        layer("llama3-8b", 8192, 4096, 4096, 1024, 14336, True, tp)
    for tp in (4, 8):
        layer("llama3-70b", 8192, 8192, 8192, 1024, 28672, True, tp)
    layer("gpt3-175b", 2048, 12288, 12288, 12288, 49152, False, 8)
    layer("gpt-1.3b", 8192, 2048, 2048, 2048, 8192, False, 1)
    shapes.append(("llama3-8b lm head fwd", 8192, 128256, 4096, False, True, "bf16"))
    for s in (1024, 2048, 4096, 8192, 16384):
        shapes.append((f"square {s}", s, s, s, False, False, "bf16"))
    for n in (4096, 4097, 4100, 4104, 4160):          # alignment: 1, 4, 8 and 64 elements
        shapes.append((f"width {n}", 8192, n, 4096, False, True, "bf16"))
        shapes.append((f"depth {n}", 8192, 4096, n, False, True, "bf16"))
    shapes.append(("fp32 4096", 4096, 4096, 4096, False, False, "fp32"))
    shapes.append(("tf32 4096", 4096, 4096, 4096, False, False, "tf32"))
    shapes.append(("fp32 8192x4096x4096", 8192, 4096, 4096, False, True, "fp32"))
    shapes.append(("tf32 8192x4096x4096", 8192, 4096, 4096, False, True, "tf32"))
    if small:
        return [(lbl, max(8, m // 64), max(8, n // 64), max(8, k // 64), ta, tb, dt)
                for lbl, m, n, k, ta, tb, dt in shapes[::9]]
    return shapes


def part_gemm(out: Path, small: bool) -> None:
    import torch

    device = _device(small)
    rows = []
    for label, m, n, k, ta, tb, dtype in gemm_shapes(small):
        torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
        dt = torch.bfloat16 if dtype == "bf16" else torch.float32
        a = torch.randn((k, m) if ta else (m, k), device=device, dtype=dt)
        b = torch.randn((n, k) if tb else (k, n), device=device, dtype=dt)
        a, b = (a.t() if ta else a), (b.t() if tb else b)
        c = torch.empty(m, n, device=device, dtype=dt)
        s = timed(lambda a=a, b=b, c=c: torch.matmul(a, b, out=c), device)
        rows.append({"label": label, "m": m, "n": n, "k": k, "a_transposed": ta,
                     "b_transposed": tb, "dtype": dtype, "seconds": s,
                     "tflops": 2.0 * m * n * k / s / 1e12})
        del a, b, c
    _write(out, "gemm", {"device": str(device), "rows": rows})


def part_attention(out: Path, small: bool) -> None:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    device = _device(small)
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
    tokens, width = (512, 256) if small else (16384, 2048)
    seqs = (128, 256) if small else (512, 1024, 2048, 4096, 8192, 16384)
    configs = [(d, causal, s, width // d, width // d, tokens // s)
               for d in (64, 128) for causal in (False, True) for s in seqs]
    configs.append((128, True, 8192 if not small else 256, 32 if not small else 4,
                    8 if not small else 1, 1))      # Llama-3 8B's grouped-query attention
    rows = []
    for d, causal, s, hq, hkv, b in configs:
        dt = torch.bfloat16 if device.type == "cuda" else torch.float32
        q = torch.randn(b, hq, s, d, device=device, dtype=dt, requires_grad=True)
        k = torch.randn(b, hkv, s, d, device=device, dtype=dt, requires_grad=True)
        v = torch.randn(b, hkv, s, d, device=device, dtype=dt, requires_grad=True)
        g = torch.randn(b, hq, s, d, device=device, dtype=dt)
        for name, backend in backends.items():
            if name == "math" and s > 8192:
                continue
            row = {"backend": name, "head_dim": d, "causal": causal, "seq": s, "batch": b,
                   "heads": hq, "kv_heads": hkv}
            try:
                with sdpa_kernel([backend]):
                    def fwd(q=q, k=k, v=v):
                        return F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                              enable_gqa=hq != hkv)

                    def fwd_bwd(q=q, k=k, v=v, g=g):
                        torch.autograd.grad(fwd(q, k, v), (q, k, v), g)

                    row["forward_s"] = timed(fwd, device)
                    row["forward_backward_s"] = timed(fwd_bwd, device)
            except Exception as e:      # noqa: BLE001 - a back end refusing a shape is a row
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            rows.append(row)
        del q, k, v, g
        if device.type == "cuda":
            torch.cuda.empty_cache()
    _write(out, "attention", {"device": str(device), "rows": rows})


def _export(prof, path: Path) -> None:
    raw = path.with_suffix("")
    prof.export_chrome_trace(str(raw))
    with open(raw, "rb") as src, gzip.open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()
    print(f"capture_gpu: wrote {path.name}", flush=True)


def part_ops(out: Path, small: bool) -> None:
    import torch
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile, schedule

    device = _device(small)
    bf16 = torch.bfloat16
    sizes = [2 ** e for e in range(13, 30 if not small else 18, 2)]   # elements
    cases = []
    for n in sizes:
        rows, width = max(1, n // 4096), min(n, 4096)
        x = torch.randn(n, device=device, dtype=bf16)
        y = torch.randn(n, device=device, dtype=bf16)
        x2 = x.view(rows, width)
        w = torch.ones(width, device=device, dtype=bf16)
        cases += [(lambda x=x: x.clone()), (lambda x=x, y=y: x + y),
                  (lambda x=x: x.float()), (lambda x=x: F.silu(x)),
                  (lambda x=x, y=y: x.mul_(y)),
                  (lambda x2=x2: torch.softmax(x2, -1)),
                  (lambda x2=x2: x2.float().sum(-1)),
                  (lambda x2=x2, w=w: F.layer_norm(x2, (x2.shape[-1],), w)),
                  (lambda x2=x2, w=w: F.rms_norm(x2, (x2.shape[-1],), w))]
    for tokens, vocab in ((1024, 32000), (4096, 32000), (8192, 128256)):
        if small:
            tokens, vocab = tokens // 64, vocab // 64
        logits = torch.randn(tokens, vocab, device=device, dtype=torch.float32)
        target = torch.randint(0, vocab, (tokens,), device=device)
        cases.append(lambda lg=logits, t=target: F.cross_entropy(lg, t))
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA]
                                           if device.type == "cuda" else [])
    with profile(activities=activities, record_shapes=True,
                 schedule=schedule(wait=1, warmup=1, active=1)) as prof:
        for _ in range(3):
            for case in cases:
                for _ in range(3):
                    case()
            sync()
            prof.step()
    _export(prof, out / "ops_trace.json.gz")


if __name__ == "__main__":
    main()
