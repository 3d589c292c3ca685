"""What a real GPU run gives Flint to read: a jax 0.11 H200 run's XLA dump and profile
(scripts/tables/h200_capture, written by scripts/capture_gpu.py), the HLO forms it uses,
cuDNN attention in a user's JAX code, and the capture script itself on the host CPU."""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from flint.errors import FlintError
from flint.hlo.module import parse_module

ROOT = Path(__file__).resolve().parents[1]
CAPTURE = ROOT / "scripts/tables/h200_capture"
GiB = 2 ** 30


@pytest.fixture(scope="module")
def dump_graph():
    from flint.frontends.hlo_dump import load_dump

    return load_dump(str(CAPTURE / "dump"), hardware="h200")


def test_tuple_element_operands_read_as_get_tuple_element():
    """`%p#1` (newer XLA's element of a tuple-valued instruction) is element 1 of p."""
    text = """HloModule m

ENTRY %main (p: (f32[4], f32[1024])) -> f32[1024] {
  %p = (f32[4]{0}, f32[1024]{0}) parameter(0)
  ROOT %n = f32[1024]{0} negate(%p#1)
}
"""
    comp = parse_module(text).entry_computation
    gte = comp.by_name["p#1"]
    assert gte.opcode == "get-tuple-element" and gte.attr("index") == "1"
    assert str(gte.shape).startswith("f32[1024]")
    assert [i.name for i in comp.instructions] == ["p", "p#1", "n"]


def test_a_jax_011_gpu_dump_reads_its_operands_and_memory(dump_graph):
    nodes = {n.name: n for n in dump_graph.nodes}
    # the layer's bf16 cast of the normalized residual reads its f32 operands
    assert nodes["loop_convert_fusion"].bytes_read >= 128 * 2 ** 20
    # XLA's buffer assignment beside the module: 46.04 GiB; the H200 measured 46.07 GiB
    from flint.hardware_models.estimate import estimate

    est = estimate(dump_graph, "h200")
    measured = json.loads((CAPTURE / "measurements.json").read_text())[
        "jax_step"]["memory_stats"]["peak_bytes_in_use"]
    assert est.memory["verdict_source"] == "XLA buffer assignment"
    assert abs(est.memory["verdict_bytes"] / measured - 1) < 0.01
    # the async-wrapped in-place updates run on the compute stream, writing their slice
    wrapped = [n for n in dump_graph.nodes if n.meta.get("wrapped_kernel")]
    assert wrapped and all(n.bytes_written < 200 * 2 ** 20 for n in wrapped)
    assert est.communication_busy_s == 0.0


def test_command_buffer_kernels_join_the_dump_op_by_op(dump_graph):
    from flint.hardware_models.spec import load_spec

    from flint.validate.workflow import open_input, run_validate

    inp = open_input(CAPTURE / "trace", dump_graph)
    assert len(inp.trace.steps) == 3                       # three profiled executions
    v = run_validate(inp, load_spec("h200"))
    assert v.join_share > 0.9
    assert 0.20 < v.measured_step_s < 0.22
    gemm = v.by_class()["gemm"]
    assert gemm["ops"] >= 16 and abs(gemm["ratio"] - 1) < 0.10
    assert "memcpy128" in v.unmatched                      # the loops' buffer copies


def test_cudnn_attention_in_user_jax_code_traces_for_a_gpu():
    import flint

    def step(q, k, v):
        def loss(q):
            return jax.nn.dot_product_attention(q, k, v, is_causal=True,
                                                implementation="cudnn").sum()
        return jax.grad(loss)(q)

    q = jax.ShapeDtypeStruct((2, 512, 8, 64), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((2, 512, 2, 64), jnp.bfloat16)
    graph = flint.extract(jax.jit(step), q, kv, kv, devices=1, hardware="h200")
    fwd = [n for n in graph.nodes if n.op_class == "attention"
           and not n.meta["attention"]["backward"]]
    assert len(fwd) == 1 and fwd[0].meta["attention"]["causal"]
    assert fwd[0].meta["attention"]["kv_heads"] == 2

    def masked(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, mask=jnp.ones((512, 512), bool),
                                            implementation="cudnn")
    with pytest.raises(FlintError, match="mask"):
        flint.extract(jax.jit(masked), q, kv, kv, devices=1, hardware="h200")


def test_gpu_llama_examples_match_the_measured_h200_memory():
    from flint.hardware_models.estimate import estimate

    from flint.frontends.request import ExtractRequest, extract

    measured = json.loads((CAPTURE / "measurements.json").read_text())
    graph, _ = extract(ExtractRequest(target=str(ROOT / "examples/gpu_llama_jax.py:train_step"),
                                      devices=1, hardware="h200"))
    directions = sorted(n.meta["attention"]["backward"] for n in graph.nodes
                        if n.op_class == "attention")
    assert directions == [False, True]          # cuDNN's forward and backward kernels
    est = estimate(graph, "h200")
    peak = measured["jax_step"]["memory_stats"]["peak_bytes_in_use"]
    assert abs(est.memory["verdict_bytes"] / peak - 1) < 0.05
    assert graph.meta["model_flops_per_device"] > 0


def test_capture_script_runs_on_the_host_cpu(tmp_path):
    """The device script's GEMM part, shrunk (--small), on this machine's CPU."""
    r = subprocess.run([sys.executable, str(ROOT / "scripts/capture_gpu.py"), "--out",
                        str(tmp_path), "--small", "--part", "gemm", "--part", "env"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads((tmp_path / "measurements.json").read_text())
    assert got["gemm"]["rows"] and all(row["seconds"] > 0 for row in got["gemm"]["rows"])
    assert "torch" in got["env"]


def test_validate_cli_takes_the_runs_dump_as_its_graph():
    from conftest import run_cli

    code, out, err = run_cli(["validate", CAPTURE / "dump", "--trace", CAPTURE / "trace",
                              "--hardware", "h200", "--json"])
    assert code == 0, err
    got = json.loads(out)
    assert got["join_share"] > 0.9 and len(got["steps"]) == 2


def test_gpu_llama_torch_example_extracts_as_documented():
    from conftest import run_flint

    r = run_flint("extract", "examples/gpu_llama_torch.py:llama", "--framework", "torch",
                  "--devices", "1", "--hardware", "h200", "--no-fuse", "--attention", "cudnn",
                  "--estimate", "--json", cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    measured = json.loads((CAPTURE / "measurements.json").read_text())["torch_step"]
    est = json.loads(r.stdout)["estimate"]
    assert abs(est["memory"]["verdict_bytes"] / measured["max_reserved"] - 1) < 0.05
    assert abs(est["step_time_s"] / statistics.median(measured["step_s"]) - 1) < 0.10
    # SDPA's kernel is the torch step's to name; a JAX step's attention is XLA's
    r = run_flint("extract", "examples/gpu_llama_jax.py:train_step", "--devices", "1",
                  "--hardware", "h200", "--attention", "cudnn", cwd=ROOT)
    assert r.returncode == 2 and "--attention shapes the built-in --model" in r.stderr


def test_compare_gpu_capture_prints_the_kernel_sections():
    r = subprocess.run([sys.executable, str(ROOT / "scripts/compare_gpu_capture.py"),
                        "--section", "gemm", "--section", "attention", "--section", "physics",
                        "--json"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout)
    assert len(got["gemm"]) == len(json.loads((CAPTURE / "measurements.json").read_text())[
        "gemm"]["rows"])
    flash = [row["error"] for row in got["attention"] if row["backend"] == "flash"]
    assert flash and all(-0.5 < e < 0.5 for e in flash)
    # the GEMM model's alignment shares against the first capture's misaligned widths
    misaligned = [row["error"] for row in got["gemm"] if row["shape"].split()[-1] in
                  ("4097", "4100")]
    assert len(misaligned) == 4 and all(abs(e) < 0.3 for e in misaligned)
    power = {row["label"]: row for row in got["physics"]["gemm_power"]}
    assert power["zeros a@b"]["sm_clock_mhz_median"] > power["randn a@b"]["sm_clock_mhz_median"]
