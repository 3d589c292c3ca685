"""Trace readers on the shared traces: nsys-jax (MaxText, 4x H100) and Kineto (HTA, 2x A100)."""
import pytest

from conftest import SHARED_TRACES
from flint.errors import FlintError
from flint.validate.kineto import nccl_kernels, read_kineto
from flint.validate.nsys_jax import read_nsys_jax


def test_kineto_nccl_all_reduce_buckets_cover_resnet50():
    path = SHARED_TRACES / "hta_resnet50_ddp_2xA100_nccl_data.json.gz"
    if not path.exists():
        pytest.skip("shared HTA trace not present")
    kernels = [k for k in nccl_kernels(read_kineto(path)) if k.collective == "allreduce"]
    assert kernels and all(k.group_size == 2 for k in kernels)
    # DDP's gradient buckets add up to ResNet-50's 25,557,032 fp32 parameters (MANIFEST)
    assert sum(set(k.in_bytes for k in kernels)) == 25_557_032 * 4


def test_nsys_jax_steps_and_thunks(maxtext_archive):
    trace = read_nsys_jax(maxtext_archive)
    steps = trace.steps()
    assert len(steps) == 5 and all(len(s) == 4 for s in steps)
    step_ms = [max(r.duration_ns for r in s) / 1e6 for s in steps[1:]]
    assert all(115 < ms < 135 for ms in step_ms)  # MANIFEST: about 120-130 ms after warm-up
    leaf_ms = sum(steps[1][0].ops_ns.values()) / 1e6
    assert 0.9 * step_ms[0] < leaf_ms < 1.2 * step_ms[0]  # leaf thunks, loops not counted twice


def test_bad_trace_files(tmp_path):
    bad = tmp_path / "x.json.gz"
    bad.write_bytes(b"\x1f\x8b garbage")
    with pytest.raises(FlintError, match="not a readable Kineto trace"):
        read_kineto(bad)
    with pytest.raises(FlintError, match="not an nsys-jax archive"):
        read_nsys_jax(bad)
