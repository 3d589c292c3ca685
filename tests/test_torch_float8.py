"""torchao's Float8 training in the torch twin (flint.models.torch_float8): the blocks'
linears run FP8 GEMMs with tensorwise dynamic scaling, the LM head stays bf16, the casts
are amax reductions and saturating conversions that torch.compile fuses, and a run of a
PyTorch framework takes precision fp8 with current scaling only."""
from __future__ import annotations

import collections
import functools

import pytest

torch = pytest.importorskip("torch")


@functools.lru_cache(maxsize=None)     # one trace per configuration in a test process
def _zoo(precision, fuse=True, mesh="fsdp=4", world=4, remat="none"):
    import flint.torch as ft

    return ft.zoo("tiny", world, mesh, batch_per_replica=2, seq_len=64, remat=remat,
                  gemm_precision=precision, fuse=fuse)


def _gemm_dtypes(graph):
    return collections.Counter(
        (n.op, n.operands[0].split("[")[0]) for n in graph.nodes if n.op_class == "gemm")


def test_float8_linears_run_fp8_gemms_and_the_head_stays_bf16():
    bf16, fp8 = _zoo("bf16"), _zoo("fp8")
    assert not any(n.op == "_scaled_mm" for n in bf16.nodes)
    ops = _gemm_dtypes(fp8)
    # tiny: 2 blocks x 7 linears; forward one GEMM each, backward two
    assert ops[("_scaled_mm", "f8e4m3fn")] == 14           # forward: e4m3 input first
    assert ops[("_scaled_mm", "f8e5m2")] == 14 * 2         # both backward GEMMs: e5m2 first
    assert sum(v for (op, _), v in ops.items() if op == "mm") == 3     # the LM head
    # same GEMM flops as bf16: FP8 changes the rate, not the work
    flops = lambda g: sum(n.flops for n in g.nodes if n.op_class == "gemm")  # noqa: E731
    assert flops(fp8) == pytest.approx(flops(bf16))
    assert fp8.meta["training"]["gemm_precision"] == "fp8"


def test_float8_casts_are_amax_reductions_and_fused_conversions():
    eager, fused = _zoo("fp8", fuse=False), _zoo("fp8", fuse=True)
    casts = [n for n in fused.nodes if n.outputs and n.outputs[0].startswith("f8")
             and n.op == "_to_copy"]
    # scale, clamp and convert: one Inductor kernel that reads bf16 and writes FP8
    assert casts and all(n.op_class == "elementwise" and n.meta.get("fused_from") == 3
                         for n in casts)
    amax = [n for n in fused.nodes if n.op == "max" and n.op_class == "reduction"]
    assert len(amax) == len(casts) and all(n.meta.get("fused_from") == 2 for n in amax)
    # eager PyTorch casts each linear's input itself; torch.compile casts an input that Q,
    # K and V (gate and up) share once (AOTAutograd's CSE): 3 casts fewer per block
    eager_casts = sum(n.op == "_to_copy" and n.outputs[0].startswith("f8")
                      for n in eager.nodes)
    assert eager_casts == len(casts) + 3 * 2
    assert len(eager.nodes) > len(fused.nodes)


def test_selective_checkpointing_counts_fp8_gemms_as_matmuls():
    """torchtitan's op SAC recomputes every second matmul; torchao's FP8 GEMM reaches it
    as aten.mm on its Float8Tensor, so the FP8 twin recomputes as many as the bf16 one."""
    bf16, fp8 = _zoo("bf16", remat="selective"), _zoo("fp8", remat="selective")
    count = lambda g, op: sum(n.op == op for n in g.nodes)  # noqa: E731
    assert count(fp8, "_scaled_mm") + count(fp8, "mm") == count(bf16, "mm")


def test_float8_with_tensor_parallelism_all_reduces_the_amax():
    """A column/row-parallel weight's absolute maximum is the max over its TP shards:
    DTensor all-reduces it, as torchao's Float8 tensor-parallel styles do."""
    fp8 = _zoo("fp8", mesh="fsdp=2,model=2")
    bf16 = _zoo("bf16", mesh="fsdp=2,model=2")
    def reduces(graph):
        return sum(n.collective is not None and n.collective.type == "all-reduce"
                   for n in graph.nodes)

    assert reduces(fp8) > reduces(bf16)


def test_a_pytorch_run_takes_fp8_with_current_scaling_only():
    from flint.errors import FlintError
    from flint.run import TrainingRun
    from flint.run_checks import check_run

    fine = TrainingRun(model="llama3-8b", devices=8, seq_len=8192, framework="torch-compile",
                       precision="fp8", zero=3)
    check_run(fine)
    for bad, words in ((dict(fp8_recipe="delayed"), "delayed scaling"),
                       (dict(precision="mxfp8"), "mxfp8")):
        with pytest.raises(FlintError, match=words):
            check_run(TrainingRun(**{**fine.to_json(), **bad}))


def test_extract_takes_fp8_for_the_torch_twin_and_refuses_other_recipes():
    from flint.errors import FlintError
    from flint.frontends.options import check_options
    from flint.frontends.request import ExtractRequest

    check_options(ExtractRequest(model="tiny", framework="torch", gemm_precision="fp8"))
    with pytest.raises(FlintError, match="fp8-delayed"):
        check_options(ExtractRequest(model="tiny", framework="torch",
                                         gemm_precision="fp8-delayed"))


def test_fp8_gemms_are_priced_at_the_fp8_rate():
    from flint.engine import predict
    from flint.run import TrainingRun

    base = dict(model="tiny", devices=4, seq_len=64, micro_batch=8, global_batch=32,
                framework="torch-compile", zero=3, hardware="h100-sxm")
    bf16 = predict(TrainingRun(**base))
    fp8 = predict(TrainingRun(**base, precision="fp8"))
    assert fp8.by_class_s["gemm"] < bf16.by_class_s["gemm"]
    assert fp8.by_class_s["reduction"] > bf16.by_class_s["reduction"]     # the amaxes
    assert "torchao Float8Linear" in fp8.facts["fp8_scaling"]


def test_cli_extracts_the_torch_twin_with_fp8_linears(tmp_path):
    """README: `--framework torch --gemm-precision fp8` (torchao's Float8 linears)."""
    import json

    from conftest import run_flint

    out = tmp_path / "g.json"
    r = run_flint("extract", "--framework", "torch", "--model", "tiny", "--devices", "4",
                  "--mesh", "fsdp=4", "--gemm-precision", "fp8", "--json", "--out", str(out))
    assert r.returncode == 0, r.stderr
    graph = json.loads(out.read_text())
    assert any(n["op"] == "_scaled_mm" for n in graph["nodes"])
    r = run_flint("extract", "--framework", "torch", "--model", "tiny", "--devices", "4",
                  "--gemm-precision", "mxfp8", "--out", str(tmp_path / "bad.json"))
    assert r.returncode == 2 and "mxfp8" in r.stderr and not (tmp_path / "bad.json").exists()
