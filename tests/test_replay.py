"""flint replay: a graph becomes a standalone JAX program with the graph's GEMMs, memory
traffic and collectives; it runs on host CPU devices, and its profile joins the graph."""
import json
import os
import re
import subprocess
import sys

import pytest

from conftest import run_flint
from flint.graph import WorkloadGraph
from flint.replay import load_replay, replay_spec
from flint.replay.spec import prepared

COLLECTIVE = re.compile(r"^\s*(?:ROOT )?%\S+ = .*? (all-reduce|all-gather|reduce-scatter|"
                        r"all-to-all|collective-permute)(?:-start)?\((.*)", re.M)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny zoo model's step compiled for 8 host devices on a 2-axis mesh, its graph
    saved, and the graph's replay compiled in this process."""
    from flint.validate.live import compile_zoo_step

    graph, _, _ = compile_zoo_step("tiny", 8, "fsdp=4,model=2")
    path = tmp_path_factory.mktemp("tiny") / "graph.json"
    graph.save(path)
    return graph, path, load_replay(graph)


def test_spec_keeps_every_gemm_and_the_memory_traffic(tiny):
    graph, _, replay = tiny
    g = prepared(graph)
    spec = replay.spec
    assert [op["name"] for op in spec["ops"]] == [n.name for n in g.nodes]   # graph order
    gemm_nodes = [n for n in g if n.op_class in ("gemm", "attention")]
    gemms = [op for op in spec["ops"] if op["op"] == "gemm"]
    assert len(gemms) == len(gemm_nodes) > 0
    for op, n in zip(gemms, gemm_nodes):
        b, m, k, nn = op["bmkn"]
        # fused attention: its flops as one batched matmul, the width rounded
        assert 2 * b * m * k * nn == pytest.approx(n.flops, rel=0 if n.op_class == "gemm"
                                                   else 0.01)
    ew = [op for op in spec["ops"] if op["op"] == "ew"]
    by_id = {n.id: n for n in g}
    assert all(op["read_bytes"] == int(by_id[op["id"]].bytes_read) for op in ew)
    assert spec["approximations"] == {}


def test_compiled_replay_has_the_graphs_collectives(tiny):
    """Every collective node is in the compiled replay as the same collective over groups of
    the same size, tagged with its node id, and none merged with another node's."""
    graph, _, replay = tiny
    g = prepared(graph)
    found: dict[int, set] = {}
    for m in COLLECTIVE.finditer(replay.compiled.as_text()):
        tag = re.search(r"flint_n(\d+)/", m.group(2))
        groups = re.search(r"replica_groups=\{(\{[^}]*\})", m.group(2))
        size = len(groups.group(1).split(",")) if groups else 2
        if tag:
            found.setdefault(int(tag.group(1)), set()).add((m.group(1), size))
    want = {n.id: {(n.collective.type, g.communicator(n).size)} for n in g.collectives()}
    assert len(want) > 20
    assert set(want) == set(found)
    assert found == want


def test_replay_step_runs_and_is_deterministic(tiny):
    _, _, replay = tiny
    a = replay.run()
    b = replay.run()
    assert len(a) == len(replay.spec["sinks"]) > 0
    import numpy as np
    assert all(np.array_equal(np.asarray(x), np.asarray(y), equal_nan=True) for x, y in zip(a, b))


def test_program_is_standalone_runs_on_host_devices_and_its_profile_validates(tiny, tmp_path):
    graph, path, _ = tiny
    bench = tmp_path / "bench.py"
    r = run_flint("replay", str(path), "--out", str(bench), "--json")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["ops"] == len(prepared(graph)) and summary["devices"] == 8
    text = bench.read_text()
    assert not re.search(r"^\s*(import|from) flint", text, re.M)     # needs only JAX
    assert run_flint("replay", str(path), "--out", str(tmp_path / "again.py")).returncode == 0
    assert (tmp_path / "again.py").read_text() == text.replace("again.py", "bench.py") or \
        (tmp_path / "again.py").read_bytes() == bench.read_bytes()
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)
    prof = tmp_path / "prof"
    run = subprocess.run([sys.executable, str(bench), "--steps", "3", "--warmup", "1",
                          "--json", "--profile", str(prof)], capture_output=True, text=True,
                         env=env, cwd=tmp_path, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["devices"] == 8 and result["platform"] == "cpu"
    assert len(result["step_s"]) == 3 and all(t > 0 for t in result["step_s"])

    from flint.hardware_models.spec import load_spec
    from flint.validate.workflow import open_input, run_validate

    inp = open_input(str(prof), graph, "cpu")
    v = run_validate(inp, load_spec("cpu"))
    assert v.join_share >= 0.95, v.unmatched
    # XLA fuses some neighbouring memory-bound ops of the replay (their graph nodes then share
    # one measured kernel), so not every node has its own op in the trace.
    assert v.joined_ops >= 0.6 * len({n.name for n in graph})
    cli = run_flint("validate", str(path), "--trace", str(prof), "--hardware", "cpu", "--json")
    assert cli.returncode == 0, cli.stderr


def test_imported_chakra_graph_replays_from_its_bytes(tiny, tmp_path):
    graph, path, _ = tiny
    et_dir = tmp_path / "et"
    r = run_flint("export", str(path), "--format", "chakra", "--out", str(et_dir))
    assert r.returncode == 0, r.stderr
    from flint.frontends import load_graph

    imported = load_graph(str(et_dir))
    spec = replay_spec(prepared(imported))
    assert {op["op"] for op in spec["ops"]} >= {"coll"}
    replay = load_replay(imported)
    assert len(replay.run()) == len(spec["sinks"])


def test_bad_inputs_one_line_exit_2_and_no_output(tiny, tmp_path):
    graph, path, _ = tiny
    out = tmp_path / "bench.py"
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "flint.workload", "version": 1, "nodes": [')
    from flint.passes.pipeline import PipelineParallel

    mpmd = tmp_path / "mpmd.json"
    try:
        PipelineParallel(stages=2, microbatches=2).run(prepared(graph)).save(mpmd)
    except Exception:                                   # noqa: BLE001 - fall back below
        g = WorkloadGraph.load(path)
        for n in g.nodes:
            n.meta["device"] = n.id % 2
        g.save(mpmd)
    for args, needle in (([str(bad)], "not valid JSON"), ([str(tmp_path / "none.json")],
                                                          "not found"),
                         ([str(mpmd)], "SPMD"),
                         ([str(path), "--out", str(tmp_path / "no" / "b.py")], "does not exist")):
        argv = ["replay", *args] + ([] if "--out" in args else ["--out", str(out)])
        r = run_flint(*argv)
        assert r.returncode == 2, (args, r.stderr)
        lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
        assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
        assert needle in lines[0] or needle.lower() in lines[0].lower(), lines[0]
        assert not out.exists()
