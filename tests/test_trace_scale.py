"""Trace readers at scale: HLO protos with module-wide instruction ids, multi-process nsys-jax
runs, the busiest module, the device count, the traced GPU, and per-duration errors."""
import importlib.util
import json

import pytest

from conftest import REPO, SHARED_TRACES, run_flint
from flint.errors import FlintError
from flint.hlo.module import parse_module
from flint.hlo.proto_ids import compact_instruction_ids, hlo_module_of, table_entries


def _bench():
    spec = importlib.util.spec_from_file_location("bench_hlo_load",
                                                  REPO / "scripts" / "bench_hlo_load.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = _bench()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A 2-process synthetic run (one GPU per archive) of a 4-way FSDP program."""
    out = tmp_path_factory.mktemp("run")
    paths, proto = bench.write_archives(out, layers=3, fusions=4, processes=2, steps=3,
                                        stride=8)
    return [str(p) for p in paths], proto


def test_module_wide_ids_are_compacted_and_the_module_is_unchanged(run):
    from jaxlib import _hlo

    module = hlo_module_of(run[1])
    count, entries = table_entries(module)
    assert entries > 10 * count                      # as dumped: tables of the largest id
    compact = compact_instruction_ids(module)
    assert table_entries(compact) == (count, count)  # one entry per instruction
    before = parse_module(_hlo.HloModule.from_serialized_hlo_module_proto(module).to_string())
    after = parse_module(_hlo.HloModule.from_serialized_hlo_module_proto(compact).to_string())
    for name, comp in before.computations.items():
        assert [(i.name, i.opcode, i.operands) for i in comp.instructions] == \
               [(i.name, i.opcode, i.operands) for i in after.computations[name].instructions]
    assert compact_instruction_ids(compact) == compact   # already compact: left as is


def test_load_failures_name_their_cause(monkeypatch):
    from jaxlib import _hlo

    from flint.hlo.loaders import hlo_text_from_proto

    with pytest.raises(FlintError, match=r"not protobuf"):
        hlo_text_from_proto(b"\xff\xff\xff", "x.pb")
    with pytest.raises(FlintError, match=r"XLA: .*program shape"):
        hlo_text_from_proto(b"\x0a\x03abc", "x.pb")

    def out_of_memory(blob):
        raise MemoryError("std::bad_alloc")

    text = "HloModule m\n\nENTRY %e (a: f32[2]) -> f32[2] {\n  ROOT %a = f32[2]{0} parameter(0)\n}\n"
    proto = _hlo.hlo_module_from_text(text).as_serialized_hlo_module_proto()
    monkeypatch.setattr(_hlo.HloModule, "from_serialized_hlo_module_proto", out_of_memory)
    with pytest.raises(FlintError, match="out of memory loading the HLO module"):
        hlo_text_from_proto(proto, "x.pb")


def test_multi_process_run_busiest_module_and_device_count(run):
    from flint.validate.workflow import open_input

    paths, _ = run
    both = open_input(paths, hardware="h100-sxm")
    t = both.trace
    assert t.module == "jit_step_fn"                 # not jit_train_step: the busiest
    assert sorted(t.steps[0].ops) == ["0:2000", "1:2001"]
    assert t.hardware == "NVIDIA H100 80GB HBM3" and t.hardware_memory_bytes > 80e9
    assert both.graph.cluster.devices == 4           # the HLO's groups span 4 devices
    one = open_input(paths[0], hardware="h100-sxm")
    assert len(one.trace.steps[0].ops) == 1 and one.graph.cluster.devices == 4
    assert open_input(paths[0], hardware="h100-sxm", devices=8).graph.cluster.devices == 8
    with pytest.raises(FlintError, match="name device 3"):
        open_input(paths[0], hardware="h100-sxm", devices=2)
    with pytest.raises(FlintError, match="given twice"):
        open_input([paths[0], paths[0]])


def test_cli_run_json_buckets_and_gpu_warning(run, tmp_path):
    paths, _ = run
    args = [a for p in paths for a in ("--trace", p)]
    r = run_flint("validate", *args, "--hardware", "a100-40gb-sxm", "--json")
    assert r.returncode == 0, r.stderr
    warning = [line for line in r.stderr.splitlines() if line.startswith("warning:")]
    assert len(warning) == 1 and "NVIDIA H100 80GB HBM3" in warning[0] \
        and "a100-40gb-sxm" in warning[0]
    d = json.loads(r.stdout)
    assert d["join_share"] == 1.0 and d["step_error"] is not None
    assert d["op_abs_error_median"] is not None
    assert [b["bucket"] for b in d["by_duration"]] == ["<5 us", "5-20 us", "20-100 us",
                                                       "100 us-1 ms", ">1 ms"]
    assert sum(b["ops"] for b in d["by_duration"]) == sum(c["ops"] for c in d["by_class"].values())
    other = tmp_path / "x.json"
    other.write_text("{}")
    r = run_flint("validate", "--trace", paths[0], "--trace", str(other))
    assert r.returncode == 2 and "all be nsys-jax archives" in r.stderr
    r = run_flint("validate", *args, "--hardware", "h100-sxm")
    assert r.returncode == 0 and "warning" not in r.stderr
    assert "By kernel duration" in r.stdout


def test_gpu_mismatch_lines():
    from flint.hardware_models.spec import load_spec
    from flint.validate.trace_gpu import gpu_mismatch

    a100_40 = ("NVIDIA A100-PG509-200", 42297524224)
    assert gpu_mismatch(*a100_40, load_spec("a100-40gb-sxm")) is None
    assert "another memory size" in gpu_mismatch(*a100_40, load_spec("a100-80gb-sxm"))
    line = gpu_mismatch(*a100_40, load_spec("h100-sxm"))
    assert "NVIDIA A100-PG509-200" in line and "h100-sxm" in line and "\n" not in line
    assert gpu_mismatch("", 0.0, load_spec("h100-sxm")) is None
    assert gpu_mismatch("NVIDIA H100 80GB HBM3", 84929478656, load_spec("h100-sxm")) is None


def test_kineto_trace_records_its_gpu():
    from flint.validate.load import read_trace

    path = SHARED_TRACES / "tracelens_qwen1.5-0.5b_fwd_1xH100.json.gz"
    if not path.exists():
        pytest.skip("shared TraceLens trace not present")
    t = read_trace(path)
    assert t.hardware == "NVIDIA H100 80GB HBM3" and t.hardware_memory_bytes > 80e9
