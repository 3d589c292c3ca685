"""Physics questions a first capture raised, measured on a real GPU (run where a GPU is;
torch and JAX only): the GEMM rate and SM clock under the board's power cap (random vs
zero data), cuBLAS on widths that are not multiples of 16 bytes and on the attention
core's batched GEMMs at many head dims, memory-bound kernels timed as launched and as
replayed from a CUDA graph (no launch gaps), cuDNN attention with grouped-query heads,
and examples/gpu_llama_jax.py's step without XLA's command buffers.
`scripts/compare_gpu_capture.py --section physics` prints the capture against Flint.

    python3 scripts/capture_gpu_physics.py OUT_DIR      # writes OUT_DIR/physics.json
"""
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import capture_gpu  # noqa: E402  (the timing loop shared with the first capture)

OUT = Path(sys.argv[1])
OUT.mkdir(parents=True, exist_ok=True)
RES: dict = {}
DEV = torch.device("cuda")
BF16 = torch.bfloat16


def save() -> None:
    (OUT / "physics.json").write_text(json.dumps(RES, indent=1))


def log(*a) -> None:
    print("physics:", *a, flush=True)


def part(fn) -> None:
    """Run one part; a failure is recorded and the next part runs."""
    t = time.time()
    try:
        fn()
    except Exception as e:      # noqa: BLE001 - recorded in the output, not fatal
        import traceback

        traceback.print_exc()
        RES.setdefault("errors", {})[fn.__name__] = f"{type(e).__name__}: {e}"[:500]
    log(fn.__name__, f"{time.time() - t:.1f} s")
    save()


def timed(fn, target: float = 0.03) -> float:
    """capture_gpu.timed on the GPU, up to 500 calls a round (short kernels)."""
    return capture_gpu.timed(fn, DEV, target, max_reps=500)


def graphed(fn, n: int = 20) -> float:
    """Seconds per call of fn replayed inside a CUDA graph of n calls (no launch gaps)."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(g):
        for _ in range(n):
            fn()
    return timed(g.replay) / n


def smi_sampler(stop, samples) -> None:
    p = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu",
                          "--format=csv,noheader,nounits", "-lms", "100"],
                         stdout=subprocess.PIPE, text=True)
    while not stop.is_set():
        line = p.stdout.readline()
        if line:
            samples.append(line.strip())
    p.terminate()


def _column(samples, i):
    out = []
    for x in samples:
        cols = x.split(",")
        if len(cols) > i and cols[i].strip().replace(".", "").isdigit():
            out.append(float(cols[i]))
    return out


def gemm_power() -> None:
    """8192^3 bf16 for 2 s each: TFLOP/s with the SM clock and board power sampled."""
    rows = []
    m = n = k = 8192
    for label, maker, use_out in (("randn a@b", torch.randn, False),
                                  ("randn out=", torch.randn, True),
                                  ("zeros a@b", torch.zeros, False),
                                  ("randn a@b again", torch.randn, False)):
        a, b = maker(m, k, device=DEV, dtype=BF16), maker(k, n, device=DEV, dtype=BF16)
        c = torch.empty(m, n, device=DEV, dtype=BF16)
        fn = (lambda: torch.matmul(a, b, out=c)) if use_out else (lambda: a @ b)
        stop, samples = threading.Event(), []
        th = threading.Thread(target=smi_sampler, args=(stop, samples))
        th.start()
        t_end, ts = time.time() + 2.0, []
        while time.time() < t_end:
            ts.append(timed(fn, 0.1))
        stop.set()
        th.join()
        clocks, power = _column(samples, 0), _column(samples, 1)
        flop = 2 * m * n * k
        rows.append({"label": label, "tflops_first": flop / ts[0] / 1e12,
                     "tflops_median": flop / statistics.median(ts) / 1e12,
                     "tflops_last": flop / ts[-1] / 1e12,
                     "sm_clock_mhz_median": statistics.median(clocks) if clocks else None,
                     "power_w_median": statistics.median(power) if power else None,
                     "samples": samples[-5:]})
        log(label, round(rows[-1]["tflops_median"]), rows[-1]["sm_clock_mhz_median"],
            rows[-1]["power_w_median"])
    RES["gemm_power"] = rows


def alignment() -> None:
    """8192 x 4096 x 4096 with one of M, N, K moved off a multiple of 8 elements; then the
    unfused attention core's batched GEMMs (scores over the head dim, context into it),
    contiguous and in Megatron's strided layout (q, k, v split from one [s, B, 3d])."""
    rows = []
    for which in ("n", "k", "m"):
        for d in (4096, 4097, 4098, 4099, 4100, 4102, 4104, 4112, 4128):
            m, n, k = 8192, 4096, 4096
            if which == "n":
                n = d
            elif which == "k":
                k = d
            else:
                m = d
            a = torch.randn(m, k, device=DEV, dtype=BF16)
            b = torch.randn(n, k, device=DEV, dtype=BF16).t()
            t = timed(lambda: a @ b)
            rows.append({"dim": which, "size": d, "m": m, "n": n, "k": k, "seconds": t,
                         "tflops": 2 * m * n * k / t / 1e12})
    B, s = 64, 2048
    for d in (64, 72, 80, 96, 100, 112, 120, 125, 127, 128, 160, 225, 256):
        q = torch.randn(B, s, d, device=DEV, dtype=BF16)
        kk = torch.randn(B, s, d, device=DEV, dtype=BF16)
        p = torch.randn(B, s, s, device=DEV, dtype=BF16)
        t1 = timed(lambda: torch.bmm(q, kk.transpose(1, 2)))
        t2 = timed(lambda: torch.bmm(p, kk))
        mixed = torch.randn(s, B, 3 * d, device=DEV, dtype=BF16)
        qs, ks = mixed[..., :d].transpose(0, 1), mixed[..., d:2 * d].transpose(0, 1)
        t3 = timed(lambda: torch.bmm(qs, ks.transpose(1, 2)))
        f = 2.0 * B * s * s * d
        rows.append({"dim": "head", "size": d, "scores_s": t1, "context_s": t2,
                     "strided_scores_s": t3, "scores_tflops": f / t1 / 1e12,
                     "context_tflops": f / t2 / 1e12, "strided_scores_tflops": f / t3 / 1e12})
    RES["alignment"] = rows


def memory_kernels() -> None:
    """Memory-bound kernels from 4 KiB to 1 GiB: as launched (events) and replayed from a
    CUDA graph (kernels back to back, no launch gaps)."""
    rows = []
    for e in range(12, 31, 2):
        nbytes = 2 ** e
        n = nbytes // 2
        x, y = torch.randn(n, device=DEV, dtype=BF16), torch.randn(n, device=DEV, dtype=BF16)
        out = torch.empty_like(x)
        out32 = torch.empty(n, device=DEV, dtype=torch.float32)
        w = 4096 if n >= 4096 else n
        x2 = x.view(-1, w)
        s2 = torch.empty(x2.shape[0], device=DEV, dtype=BF16)
        lw = torch.ones(w, device=DEV, dtype=BF16)
        cases = {"add": lambda: torch.add(x, y, out=out), "copy": lambda: out.copy_(x),
                 "cast_f32": lambda: out32.copy_(x),
                 "sum_rows": lambda: torch.sum(x2, -1, out=s2),
                 "softmax_rows": lambda: torch.softmax(x2, -1),
                 "layer_norm": lambda: F.layer_norm(x2, (w,), lw), "clone": lambda: x.clone()}
        for name, fn in cases.items():
            allocates = name in ("clone", "softmax_rows", "layer_norm")
            rows.append({"kernel": name, "bytes_in": nbytes, "events_s": timed(fn),
                         "graph_s": None if allocates else graphed(fn)})
        cases.clear()          # the closures hold the buffers
        x = y = out = out32 = x2 = s2 = None
        torch.cuda.empty_cache()
    RES["memory_kernels"] = rows


def cudnn_gqa() -> None:
    """SDPA's cuDNN and flash kernels at examples/gpu_llama_jax.py's attention shape with
    16, 4 and 1 key/value heads (torch's cuDNN path takes them expanded)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rows = []
    b, s, d, hq = 4, 4096, 128, 16
    for hkv in (16, 4, 1):
        for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION),
                         ("flash", SDPBackend.FLASH_ATTENTION)):
            q = torch.randn(b, hq, s, d, device=DEV, dtype=BF16, requires_grad=True)
            k = torch.randn(b, hkv, s, d, device=DEV, dtype=BF16, requires_grad=True)
            v = torch.randn(b, hkv, s, d, device=DEV, dtype=BF16, requires_grad=True)
            g = torch.randn(b, hq, s, d, device=DEV, dtype=BF16)
            row = {"backend": name, "kv_heads": hkv}
            try:
                with sdpa_kernel([be]):
                    if hkv != hq and name == "cudnn":
                        kk = k.repeat_interleave(hq // hkv, 1)
                        vv = v.repeat_interleave(hq // hkv, 1)

                        def fwd():
                            return F.scaled_dot_product_attention(q, kk, vv, is_causal=True)
                    else:
                        def fwd():
                            return F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                  enable_gqa=hkv != hq)
                    row["forward_s"] = timed(fwd)
                    row["forward_backward_s"] = timed(
                        lambda: torch.autograd.grad(fwd(), (q, k, v), g))
            except Exception as e:      # noqa: BLE001 - a back end refusing is a row
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            rows.append(row)
            log(row)
    RES["cudnn_gqa"] = rows


STEP = r'''
import os, sys, time, json
os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
sys.path[:0] = ["scripts", "examples"]
import capture_gpu_steps, gpu_llama_jax as model
state, batch = capture_gpu_steps.jax_llama_inputs(model)
for _ in range(4):
    state, loss = model.train_step(state, batch)
loss.block_until_ready()
ts = []
for _ in range(10):
    t = time.perf_counter()
    state, loss = model.train_step(state, batch)
    loss.block_until_ready()
    ts.append(time.perf_counter() - t)
print(json.dumps(ts))
'''


def xla_no_command_buffers() -> None:
    """The JAX example's step with XLA's command buffers off: every thunk launched alone."""
    env = dict(os.environ, XLA_FLAGS="--xla_gpu_enable_command_buffer=")
    r = subprocess.run([sys.executable, "-c", STEP], capture_output=True, text=True, env=env,
                       timeout=150)
    lines = [x for x in r.stdout.splitlines() if x.startswith("[")]
    RES["xla_no_command_buffers"] = {"step_s": json.loads(lines[-1]) if lines else None,
                                     "stderr": "" if lines else r.stderr[-1500:]}
    log("xla no command buffers", RES["xla_no_command_buffers"]["step_s"])


for fn in (gemm_power, alignment, memory_kernels, cudnn_gqa, xla_no_command_buffers):
    part(fn)
