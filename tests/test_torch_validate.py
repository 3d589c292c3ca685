"""A real CPU torch.profiler trace of the tiny torch twin joins to the graph Flint traces
with fake tensors, and validates through `flint validate`."""
import json

import pytest

import flint.torch as ft
from conftest import run_flint
from flint.validate.compare import MIN_JOIN_SHARE
from flint.validate.live_torch import profile_torch_zoo_step
from flint.validate.workflow import open_input


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    d = tmp_path_factory.mktemp("torchprof")
    trace = profile_torch_zoo_step("tiny", d / "tiny.json", steps=4)
    graph = ft.zoo("tiny", 1, {"data": 1}, fuse=False, hardware="cpu")
    graph.save(d / "graph.json")
    return trace, graph, d


def test_profile_joins_the_graph(profiled):
    trace, graph, _ = profiled
    inp = open_input(str(trace), graph, "cpu")
    assert len(inp.trace.steps) == 4
    nodes = [n for n in graph.nodes if n.collective is None]
    for step in inp.trace.steps[1:]:
        joined = [k for k in step.ops["cpu:0"] if not k.startswith("(")]
        assert len(joined) >= 0.95 * len(nodes), (len(joined), len(nodes))
        # every GEMM of the step is measured
        gemms = {n.name for n in nodes if n.op_class == "gemm"}
        assert gemms <= set(joined)


def test_flint_validate_on_the_profile(profiled):
    trace, graph, d = profiled
    r = run_flint("validate", str(d / "graph.json"), "--trace", str(trace), "--hardware",
                  "cpu", "--json")
    assert r.returncode == 0, r.stderr
    v = json.loads(r.stdout)
    assert v["joined_ops"] >= 0.95 * sum(1 for n in graph.nodes if n.collective is None)
    # the overhead around the kernels (dispatcher, autograd engine, SDPA's backward
    # wrapper) is a property of the machine and its load: 0.80-0.92 of the op time joined
    # on the dev machine, 0.59 on one CI run. The join itself is checked per node above and
    # in test_profile_joins_the_graph; here the trace must pass validate's own floor
    assert v["join_share"] > MIN_JOIN_SHARE
    assert v["measured_step_s"] > 0 and v["predicted_step_s"] > 0


def test_fused_graph_is_refused(profiled, tmp_path):
    trace, _, _ = profiled
    fused = ft.zoo("tiny", 1, {"data": 1}, hardware="cpu")
    fused.save(tmp_path / "fused.json")
    r = run_flint("validate", str(tmp_path / "fused.json"), "--trace", str(trace),
                  "--hardware", "cpu")
    assert r.returncode == 2 and "--no-fuse" in r.stderr
