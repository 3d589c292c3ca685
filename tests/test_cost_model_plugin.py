"""A third-party network model (examples/flat_ring_network.py: every collective a flat ring
over the NIC) reaches every consumer that prices a graph: estimate, validate, place, the
time-split pipeline, the Chakra export and sweeps, in Python and through `--cost-model`."""
import json
import os
import subprocess
import sys

import pytest

from conftest import REPO
from flint.errors import FlintError
from flint.graph import WorkloadGraph

EXAMPLES = REPO / "examples"
SPEC = "flat_ring_network:cost_model"
sys.path.insert(0, str(EXAMPLES))
import flat_ring_network  # noqa: E402


def flint(*args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [str(EXAMPLES), os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-m", "flint", *args], capture_output=True,
                          text=True, env=env, timeout=600)


class Spy:
    """The example factory, counting the graphs it was asked to price."""

    def __init__(self):
        self.calls = 0

    def __call__(self, graph, hardware=None, overrides=()):
        self.calls += 1
        return flat_ring_network.cost_model(graph, hardware, overrides)


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """`flint sweep --cost-model` over one tiny program (2 pipeline stages split by
    predicted time, 1F1B and GPipe), then the same space with the built-in model, which
    finds the program in the graph cache."""
    out = tmp_path_factory.mktemp("sweep")
    space = out.parent / "space.yaml"
    space.write_text("model: tiny\nseq_len: 64\ndevices: [8]\ntp: [2]\npp: [2]\n"
                     "micro_batch: [1]\nglobal_batch: 8\npipeline_split: time\n"
                     "schedule: [1f1b, gpipe]\n")
    third = flint("sweep", str(space), "--out", str(out), "--cost-model", SPEC, "--json")
    assert third.returncode == 0, third.stderr
    builtin = flint("sweep", str(space), "--out", str(out), "--json")
    assert builtin.returncode == 0, builtin.stderr
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    (graph_file,) = (out / "templates").glob("*.json")
    return out, rows, graph_file


def test_sweep_rows_are_priced_by_the_named_model(swept):
    _, rows, _ = swept
    mine = {r["schedule"]: r for r in rows if r.get("cost_model") == SPEC}
    ours = {r["schedule"]: r for r in rows if "cost_model" not in r}
    assert sorted(mine) == sorted(ours) == ["1f1b", "gpipe"]
    assert not any(r["extracted"] for r in ours.values())     # the graph cache is shared
    for schedule in mine:
        assert mine[schedule]["status"] == ours[schedule]["status"] == "ok"
        # a flat ring over 400 Gb/s NICs is slower than NVLink inside one H100 node
        assert mine[schedule]["step_time_s"] > ours[schedule]["step_time_s"]


def test_every_python_consumer_calls_the_factory(swept, tmp_path):
    from flint.exporters.chakra import check_export, export_chakra
    from flint.hardware_models.estimate import estimate
    from flint.hardware_models.pluggable import cost_model_for
    from flint.passes.pipeline import PipelineParallel
    from flint.passes.place import Place

    graph = WorkloadGraph.load(swept[2])
    spy = Spy()
    mine, ours = estimate(graph, cost_model=spy), estimate(graph)
    assert spy.calls == 1 and mine.step_time_s > ours.step_time_s
    # the all-reduces cost what the ring formula says, with the spec's NIC figures
    model = cost_model_for(graph, None, (), spy)
    node = next(n for n in graph.nodes if n.collective and n.collective.type == "all-reduce"
                and graph.communicator(n).size > 1)
    n, size = graph.communicator(node).size, node.collective.size_bytes
    ring = 2 * (n - 1) * (model.spec.nic_latency + size / n / model.spec.nic_bandwidth)
    assert model.node_time(node, graph) == pytest.approx(ring)

    for run in (lambda: Place(devices=2, cost_model=spy).run(graph),
                lambda: PipelineParallel(stages=2, split="time", cost_model=spy).run(graph),
                lambda: check_export(graph, cost_model=spy)):
        spy.calls = 0
        run()
        assert spy.calls >= 1
    spy.calls = 0
    export_chakra(graph, tmp_path / "et", cost_model=spy)
    manifest = json.loads((tmp_path / "et" / "flint_export.json").read_text())
    assert spy.calls == 1 and manifest["cost_model"].endswith(":Spy")
    assert "network.yml" in os.listdir(tmp_path / "et")   # ASTRA-sim inputs still written


def test_export_and_estimate_take_cost_model_on_the_command_line(swept, tmp_path):
    graph_file = str(swept[2])
    r = flint("export", graph_file, "--out", str(tmp_path / "et"), "--cost-model", SPEC,
              "--json")
    assert r.returncode == 0, r.stderr
    manifest = json.loads((tmp_path / "et" / "flint_export.json").read_text())
    assert manifest["cost_model"] == SPEC
    r = flint("export", graph_file, "--out", str(tmp_path / "et0"), "--json")
    builtin = json.loads((tmp_path / "et0" / "flint_export.json").read_text())
    assert "cost_model" not in builtin
    assert manifest["flint_step_s"] > builtin["flint_step_s"]
    r = flint("estimate", graph_file, "--cost-model", SPEC, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["step_time_s"] == pytest.approx(manifest["flint_step_s"])
    for bad, says in [("flat_ring_network", "package.module:factory"),
                      ("flat_ring_network:nothing", "no callable"),
                      ("no_such_module_here:f", "cannot import"),
                      ("../x.py:f", "package.module:factory")]:
        r = flint("estimate", graph_file, "--cost-model", bad)
        assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1


def test_factory_must_return_a_cost_model(swept):
    from flint.hardware_models.estimate import estimate

    with pytest.raises(FlintError, match="not a CostModel"):
        estimate(WorkloadGraph.load(swept[2]), cost_model=lambda g, h, o: 42)


def test_validate_predicts_with_the_third_party_model(maxtext_archive):
    from flint.hardware_models.estimate import estimate
    from flint.hardware_models.spec import load_spec
    from flint.validate.workflow import open_input, run_validate

    inp = open_input(str(maxtext_archive), hardware="h100-sxm")
    spy = Spy()
    v = run_validate(inp, load_spec("h100-sxm"), cost_model=spy)
    assert spy.calls >= 1
    assert v.predicted_step_s == pytest.approx(
        estimate(inp.graph, cost_model=flat_ring_network.cost_model).step_time_s)
    assert v.predicted_step_s != pytest.approx(run_validate(inp, load_spec("h100-sxm"))
                                               .predicted_step_s)
