"""Kineto kernel -> aten operator join and the GEMM / attention nodes built from it
(scripts/compare_tracelens.py), on the shared TraceLens Qwen trace and a small synthetic one."""
import gzip
import json
from collections import Counter

import pytest

from conftest import SHARED_TRACES
from flint.errors import FlintError
from flint.validate.kernel_nodes import execution_node, executions
from flint.validate.kineto_kernels import step_kernels
from flint.validate.trace_events import read_trace_events

QWEN = SHARED_TRACES / "tracelens_qwen1.5-0.5b_fwd_1xH100.json.gz"


@pytest.fixture(scope="module")
def qwen_step6():
    if not QWEN.exists():
        pytest.skip("shared TraceLens trace not present")
    found = step_kernels(read_trace_events(QWEN), 6, str(QWEN))
    execs, others = executions(found.kernels)
    return found, execs, others


def test_every_step6_kernel_links_to_its_operator(qwen_step6):
    found, execs, others = qwen_step6
    compute = [k for k in found.kernels if k.category == "kernel"]
    assert found.step == 6 and len(compute) == 1029 and found.unlinked == 0     # MANIFEST
    assert found.span_s == pytest.approx(34.89e-3, rel=1e-3)
    by_kernel = Counter((ex.op_class, "sm90_xmma_gemm" in ex.kernels[0].name,
                         "flash_fwd_kernel" in ex.kernels[0].name) for ex in execs)
    assert by_kernel == {("gemm", True, False): 168,          # cuBLAS bf16 tensor-core GEMMs
                         ("gemm", False, False): 1,           # rotary inv_freq f32 bmm (SIMT)
                         ("attention", False, True): 24}      # one flash_fwd per layer
    assert sum(len(ex.kernels) for ex in execs) + len(others) == len(compute)
    gemm_ms = sum(ex.measured_s for ex in execs if "sm90_xmma_gemm" in ex.kernels[0].name)
    assert gemm_ms == pytest.approx(8.86e-3, rel=0.01)
    assert all(len(ex.other) == 1 for ex in execs if "sm90" in ex.kernels[0].name)  # memsets


def test_gemm_and_attention_nodes_from_recorded_shapes(qwen_step6):
    _, execs, _ = qwen_step6
    nodes = [execution_node(ex, i) for i, ex in enumerate(execs)]
    assert all(n is not None for n in nodes)
    m, s = 16 * 559, 559
    down = [n for n in nodes if n.operands == ["bf16[8944,2816]", "bf16[2816,1024]"]]
    assert len(down) == 24 and down[0].op == "mm" and down[0].op_class == "gemm"
    assert down[0].flops == 2 * m * 1024 * 2816
    assert down[0].outputs == ["bf16[8944,1024]"]
    assert down[0].bytes_read == 2 * (m * 2816 + 2816 * 1024)
    qkv = [n for n in nodes if n.op == "addmm"]
    assert len(qkv) == 72 and qkv[0].flops == 2 * m * 1024 * 1024 + m * 1024   # + bias
    attn = [n for n in nodes if n.op_class == "attention"]
    assert len(attn) == 24
    assert attn[0].meta["attention"] == {"batch": 16, "heads": 16, "kv_heads": 16, "seq_q": s,
                                         "seq_kv": s, "head_dim": 64, "causal": True,
                                         "backward": False, "dtype": "bf16", "impl": "flash2"}
    assert attn[0].meta["causal_recorded"]
    assert attn[0].flops == pytest.approx(4 * 16 * 16 * s * s * 64 / 2)   # causal: half


def _event(name, cat, ts, dur, tid=1, **args):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 1, "tid": tid,
            "args": args}


def test_join_by_time_without_external_ids_and_unlinked_kernels(tmp_path):
    """An operator without `External id` is still found by time on the launch's thread; a
    launch outside every operator is counted unlinked; a kernel of a flash op recorded in
    [batch, seq, heads, dim] order gets [batch, heads, seq, dim] attention meta."""
    flash = {"Input Dims": [[2, 128, 8, 64], [2, 128, 2, 64], [2, 128, 2, 64]] + [[]] * 7,
             "Input type": ["c10::BFloat16"] * 3 + ["", "", "Scalar", "Scalar", "Scalar",
                                                   "Scalar", "Scalar"],
             "Concrete Inputs": ["", "", "", "", "", "128", "128", "0.", "False", "False"]}
    events = [
        _event("ProfilerStep#2", "user_annotation", 0, 100),
        _event("aten::matmul", "cpu_op", 1, 20, **{"Input Dims": [[4, 8], [8, 16]]}),
        _event("aten::mm", "cpu_op", 2, 10, **{"Input Dims": [[4, 8], [8, 16]],
                                               "Input type": ["float", "float"]}),
        _event("cudaLaunchKernel", "cuda_runtime", 3, 1, correlation=7),
        _event("aten::_flash_attention_forward", "cpu_op", 30, 10, **flash),
        _event("cudaLaunchKernel", "cuda_runtime", 31, 1, correlation=8),
        _event("cudaLaunchKernel", "cuda_runtime", 50, 1, correlation=9),
        _event("gemm_kernel", "kernel", 60, 5, tid=7, correlation=7),
        _event("flash_fwd_kernel", "kernel", 66, 9, tid=7, correlation=8),
        _event("copy_kernel", "kernel", 76, 2, tid=7, correlation=9),
        _event("before_step", "kernel", -5, 2, tid=7, correlation=99),
    ]
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode()))
    found = step_kernels(read_trace_events(path), None, str(path))
    assert found.step == 2 and len(found.kernels) == 3 and found.unlinked == 1
    assert [op.name for op in found.kernels[0].stack] == ["aten::matmul", "aten::mm"]
    execs, others = executions(found.kernels)
    assert [k.name for k in others] == ["copy_kernel"]
    gemm, attn = (execution_node(ex) for ex in execs)
    assert gemm.op == "mm" and gemm.flops == 2 * 4 * 8 * 16 and gemm.operands[0] == "f32[4,8]"
    assert attn.meta["attention"] == {"batch": 2, "heads": 8, "kv_heads": 2, "seq_q": 128,
                                      "seq_kv": 128, "head_dim": 64, "causal": False,
                                      "backward": False, "dtype": "bf16", "impl": "flash2"}
    assert attn.flops == 4 * 2 * 8 * 128 * 128 * 64
    with pytest.raises(FlintError, match="no ProfilerStep#5"):
        step_kernels(events, 5)
