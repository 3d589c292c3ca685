"""The live check: a real JAX profiler trace of a built-in model on 8 host CPU devices,
validated against the graph Flint extracts for the same step, before and after calibration."""
import statistics

import pytest

from flint.hardware_models.spec import load_spec
from flint.validate.live import profile_zoo_step
from flint.validate.workflow import open_input, run_calibrate, run_validate


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    # gpt2-small shaped, 2 layers, 64 tokens per device: big enough that the step is
    # arithmetic and memory traffic rather than runtime overhead, small enough for CI.
    return profile_zoo_step("gpt2-small", 8, "fsdp=8", tmp_path_factory.mktemp("prof"),
                            steps=5, layers=2, seq_len=64)


def test_cpu_profile_validates_and_calibration_brings_step_error_under_15pct(profiled):
    graph, log_dir = profiled
    spec = load_spec("cpu")
    inp = open_input(str(log_dir), graph, "cpu")
    assert inp.trace.kind == "jax-profiler" and len(inp.trace.steps) == 5
    v = run_validate(inp, spec)
    assert v.join_share >= 0.95
    report = run_calibrate([inp], spec, "2-3", "4-5")
    check = next(r for r in report.rows if r["set"] == "check")
    assert abs(check["after"]["step_error"]) < 0.15, report.rows
    assert abs(check["after"]["step_error"]) < abs(check["before"]["step_error"])
    assert statistics.median(s.duration_s for s in inp.trace.steps) > 0.2   # not overhead


def test_xplane_reads_like_the_json_trace(profiled):
    pytest.importorskip("xprof.convert.raw_to_tool_data", reason="xprof extra not installed")
    from flint.validate.load import read_trace

    _, log_dir = profiled
    (xplane,) = log_dir.rglob("*.xplane.pb")
    a, b = read_trace(str(xplane)), read_trace(str(log_dir))
    assert [s.duration_s for s in a.steps] == pytest.approx([s.duration_s for s in b.steps])
    for device, ops in b.steps[1].ops.items():
        assert a.steps[1].ops[device] == pytest.approx(ops)
