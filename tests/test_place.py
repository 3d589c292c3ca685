"""Baechi placement (passes/place*.py) and `flint place`."""
import json

import pytest

from flint.cluster import Cluster
from flint.errors import FlintError
from flint.frontends.jax import capture
from flint.graph import Node, NodeKind, WorkloadGraph
from flint.hardware_models.estimate import estimate, node_durations
from flint.models.train import build
from flint.passes import parse_pipeline
from flint.passes.pipeline_stages import layer_index
from flint.passes.place import ALGORITHMS, link_time, place, transfers
from flint.passes.place_units import Problem, coplacement_units, output_bytes

from conftest import run_flint

HW = "h100-sxm"


@pytest.fixture(scope="module")
def step_graph():
    """A real training step: the zoo's tiny decoder, 8 unrolled layers, one device."""
    mesh = (("data", 1),)
    w = build("tiny", mesh, scan=False, layers=8, seq_len=64)
    step = capture(w.step, devices=1, mesh=dict(mesh), hardware=HW, in_specs=w.in_specs,
                   out_specs=w.out_specs, donate_argnums=w.donate_argnums)
    return step.workload(*w.args)


def _problem(graph, limit=1e15):
    flat, durations, model = node_durations(graph, HW)
    return Problem(flat, durations, link_time(model.spec), output_bytes(flat), 8, limit, "t")


@pytest.fixture(scope="module")
def spread_limit(step_graph):
    """A limit that forces the step over several devices: twice an even share (a tiny
    decoder's layers are large next to a share; whole layers must fit)."""
    return 2 * _problem(step_graph).even_share


@pytest.fixture(scope="module")
def placements(step_graph, spread_limit):
    return {a: place(step_graph, a, 8, spread_limit, HW) for a in ALGORITHMS}


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_places_every_node_within_the_limit(step_graph, spread_limit, placements, algorithm):
    r = placements[algorithm]
    assert len(r.device_of) == len(step_graph.nodes)
    assert all(0 <= d < 8 for d in r.device_of)
    assert len(set(r.device_of)) >= 2                  # the limit forces spreading
    assert max(r.per_device_bytes) <= spread_limit
    # the bound checked during placement covers what the cost model reports
    peaks = estimate(r.graph, HW).memory["per_device_bytes"]
    assert all(p <= b * (1 + 1e-9) for p, b in zip(peaks, r.per_device_bytes))
    meta = r.graph.meta["placement"]
    assert meta["algorithm"] == algorithm and meta["placement_time_s"] > 0
    assert meta["memory_limit_bytes"] == spread_limit


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_coplaced_units_and_forward_backward_pairs_share_a_device(step_graph, placements,
                                                                  algorithm):
    device_of = placements[algorithm].device_of
    flat, durations, _ = node_durations(step_graph, HW)
    units = coplacement_units(flat, durations, 8)
    where: dict = {}
    for v, g in enumerate(units):
        assert where.setdefault(g, device_of[v]) == device_of[v]
    by_layer: dict = {}
    phases = set()
    for n in flat.nodes:
        li = layer_index(n.meta.get("layer"))
        if li is not None:
            assert by_layer.setdefault(li, device_of[n.id]) == device_of[n.id], n.name
            phases.add(n.meta.get("phase"))
    assert {"forward", "backward"} <= phases and len(by_layer) == 8


def test_units_never_join_two_layers(step_graph):
    flat, durations, _ = node_durations(step_graph, HW)
    units = coplacement_units(flat, durations, 8)
    layers: dict = {}
    for n, g in zip(flat.nodes, units):
        li = layer_index(n.meta.get("layer"))
        if li is not None:
            layers.setdefault(g, set()).add(li)
    assert all(len(s) == 1 for s in layers.values())
    # a gradient's only consumer, its optimizer update, runs where the layer's weights are
    users = flat.users
    joined = [n for n in flat.nodes if n.meta.get("phase") == "optimizer" and any(
        layer_index(flat.nodes[i].meta.get("layer")) is not None and users[i] == [n.id]
        for i in n.inputs)]
    assert joined and all(any(units[i] == units[n.id] for i in n.inputs) for n in joined)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_deterministic(step_graph, spread_limit, placements, algorithm):
    assert place(step_graph, algorithm, 8, spread_limit, HW).device_of == \
        placements[algorithm].device_of


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_infeasible_limit_is_one_clear_error(step_graph, algorithm):
    with pytest.raises(FlintError, match="infeasible") as e:
        place(step_graph, algorithm, 8, 64 * 1024, HW)
    assert "\n" not in str(e.value) and algorithm in str(e.value)
    # an even share just below the step's need cannot be met by any algorithm either
    need = _problem(step_graph).even_share
    with pytest.raises(FlintError, match="infeasible"):
        place(step_graph, algorithm, 8, 0.9 * need, HW)


def test_bad_arguments(step_graph):
    with pytest.raises(FlintError, match="unknown placement algorithm"):
        place(step_graph, "random", 8)
    with pytest.raises(FlintError, match="at least 1 device"):
        place(step_graph, "m-sct", 0)


def test_pass_in_pipeline_string(step_graph):
    (p,) = parse_pipeline("place{algorithm=m-etf,devices=4}")
    placed = p.run(step_graph)
    assert placed.meta["placement"]["algorithm"] == "m-etf"
    assert placed.meta["mpmd_devices"] == 4
    assert {n.meta["device"] for n in placed.nodes} <= set(range(4))


def _chains(n=48, branches=1, weights=1 << 30):
    """`branches` independent chains of GEMMs (32 MiB activations) joined by one add; each
    GEMM is a layer with `weights` bytes of parameters."""
    nodes, ends, arguments = [], [], []
    for _ in range(branches):
        prev = None
        for _ in range(n):
            i = len(nodes)
            nodes.append(Node(i, f"mm{i}", NodeKind.COMPUTE, "dot", "gemm",
                              inputs=[] if prev is None else [prev], flops=2e12,
                              bytes_read=64 << 20, bytes_written=32 << 20,
                              outputs=["bf16[4096,4096]"],
                              meta={"phase": "forward", "layer": f"layer_{i}"}))
            arguments.append([f"params['layers']['layer_{i}']['w']", weights])
            prev = i
        ends.append(prev)
    nodes.append(Node(len(nodes), "join", NodeKind.COMPUTE, "add", "elementwise", inputs=ends,
                      flops=1.6e7, bytes_read=64 << 20, bytes_written=32 << 20,
                      outputs=["bf16[4096,4096]"]))
    return WorkloadGraph(Cluster(1, (("data", 1),), HW), nodes, [], [],
                         {"arguments": arguments})


def test_sct_keeps_a_chain_together_where_topo_spreads_it():
    chain = _chains()
    roomy = 64 << 30
    sct, topo = (place(chain, a, 8, roomy, HW) for a in ("m-sct", "m-topo"))
    assert transfers(sct.graph)[0] == 0 and len(set(sct.device_of)) == 1
    # Baechi's uniform m-TOPO: an even share plus the largest unit per device, in turn
    assert transfers(topo.graph)[0] == len(set(topo.device_of)) - 1 >= 5
    assert estimate(sct.graph, HW).step_time_s < estimate(topo.graph, HW).step_time_s
    # room for 16 of the 48 layers' weights: three contiguous pieces, one hop between them
    tight = place(chain, "m-sct", 8, 17 << 30, HW)
    used = len(set(tight.device_of))
    assert 3 <= used <= 4 and transfers(tight.graph)[0] == used - 1
    assert max(tight.per_device_bytes) <= 17 << 30
    assert estimate(tight.graph, HW).step_time_s <= estimate(topo.graph, HW).step_time_s


@pytest.mark.parametrize("algorithm", ["m-etf", "m-sct"])
def test_list_scheduling_runs_independent_chains_in_parallel(algorithm):
    fork = _chains(n=24, branches=4, weights=64 << 20)
    one = estimate(place(fork, "m-topo", 1, 0, HW).graph, HW).step_time_s
    spread = place(fork, algorithm, 8, 0, HW)
    assert len(set(spread.device_of)) == 4          # one chain per device
    assert estimate(spread.graph, HW).step_time_s < 0.4 * one


def test_cli_report_and_output(tmp_path, step_graph):
    src, out = tmp_path / "g.json", tmp_path / "placed.json"
    step_graph.save(src)
    limit = 2 * _problem(step_graph).even_share
    r = run_flint("place", str(src), "--algorithm", "m-etf", "--devices", "8",
                  "--memory-limit", f"{limit / 2**20:.3f}MiB", "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["algorithm"] == "m-etf" and report["nodes"] == len(step_graph.nodes)
    assert report["step_time_s"] > 0 and report["placement_time_s"] > 0
    assert max(report["per_device_bytes"]) <= report["memory_limit_bytes"]
    placed = WorkloadGraph.load(out)
    assert transfers(placed) == (report["transfers"], report["transfer_bytes"])
    table = run_flint("place", str(src), "--memory-limit", f"{limit / 2**20:.3f}MiB")
    assert table.returncode == 0 and "predicted step time" in table.stdout


@pytest.mark.parametrize("args", [["--memory-limit", "64KiB"], ["--algorithm", "nope"],
                                  ["--devices", "0"], ["--memory-limit", "40"]])
def test_cli_bad_input_one_line_exit_2_no_output(tmp_path, step_graph, args):
    src, out = tmp_path / "g.json", tmp_path / "placed.json"
    step_graph.save(src)
    r = run_flint("place", str(src), *args, "--out", str(out))
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "error" in r.stderr
    assert not out.exists()
    missing = run_flint("place", str(tmp_path / "missing.json"))
    assert missing.returncode == 2 and "not found" in missing.stderr
