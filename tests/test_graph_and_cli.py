"""WorkloadGraph JSON round trip and determinism; the CLI's outputs and its bad-input errors."""
import json
import zipfile

import networkx as nx
import pytest

from conftest import run_flint
from flint.errors import FlintError
from flint.graph import WorkloadGraph
from flint.hlo.loaders import load_hlo
from flint.passes.lower_hlo import lower_hlo
from flint.cluster import Cluster


@pytest.fixture(scope="module")
def maxtext_graph(maxtext_archive, tmp_path_factory):
    with zipfile.ZipFile(maxtext_archive) as z:
        name = next(n for n in z.namelist()
                    if n.endswith("jit_train_step.sm_9.0_gpu_after_optimizations.hlo.pb.xz"))
        path = tmp_path_factory.mktemp("mt") / "train_step.hlo.pb.xz"
        path.write_bytes(z.read(name))
    return lower_hlo(load_hlo(path), Cluster(4, (("fsdp", 4),), "h100-sxm"))


def test_maxtext_h100_archive_lowers(maxtext_graph):
    g = maxtext_graph
    gemm_runs = sum(n.repeat for n in g.nodes if n.op_class == "gemm")
    # 8 layers x (9 forward + 18 backward GEMMs + QK^T and PV recomputed by remat, which XLA
    # wraps in __custom_fusion dynamic-slice fusions) + logits forward and its two gradients
    assert gemm_runs == 8 * (9 + 18 + 2) + 3
    assert sorted(lp.trip_count for lp in g.loops) == [2, 3]
    assert {n.collective.type for n in g.collectives()} >= {"all-gather", "reduce-scatter",
                                                            "all-reduce"}
    assert all(g.communicator(n).mesh_axes == ("fsdp",) for n in g.collectives())
    # forward GEMM flops per device (2 sequences x 2048 tokens) from the model's shapes:
    # q,k,v,o (2560x1024 each), gated MLP (3 x 2560x8192), QK^T and PV, and the logits
    tokens = 2 * 2048
    per_layer = 2 * tokens * (4 * 2560 * 1024 + 3 * 2560 * 8192) + 2 * 2 * 16 * 2048 * 2048 * 128
    expected_fwd = 8 * per_layer + 2 * tokens * 2560 * 32000
    fwd = sum(n.flops * n.repeat for n in g.nodes
              if n.op_class == "gemm" and n.meta.get("phase") == "forward")
    assert fwd == pytest.approx(expected_fwd, rel=0.01)


def test_json_round_trip_is_exact_and_deterministic(maxtext_graph, tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    maxtext_graph.save(a)
    again = WorkloadGraph.load(a)
    again.save(b)
    assert a.read_bytes() == b.read_bytes()
    assert again.summary() == maxtext_graph.summary()
    assert [n.to_json() for n in again.nodes] == [n.to_json() for n in maxtext_graph.nodes]


def test_networkx_view_is_a_dag(maxtext_graph):
    g = maxtext_graph.to_networkx()
    assert g.number_of_nodes() == len(maxtext_graph.nodes)
    assert nx.is_directed_acyclic_graph(g)
    assert all("node" in g.nodes[i] for i in g.nodes)


def test_corrupt_graph_files(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(FlintError, match="not valid JSON"):
        WorkloadGraph.load(bad)
    bad.write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(FlintError, match="not a Flint workload graph"):
        WorkloadGraph.load(bad)
    bad.write_text(json.dumps({"format": "flint.workload", "version": 1, "cluster": {}}))
    with pytest.raises(FlintError, match="corrupt"):
        WorkloadGraph.load(bad)


def test_cli_extract_json_and_out(tmp_path):
    out = tmp_path / "g.json"
    r = run_flint("extract", "--model", "tiny", "--devices", "16", "--mesh", "fsdp=4,model=4",
                  "--json", "--out", str(out))
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    s = report["summary"]
    assert s["devices"] == 16 and s["mesh"] == {"fsdp": 4, "model": 4}
    assert s["hardware"] == "h100-sxm" and s["flops_per_device"] > 0
    assert set(report["timings_s"]) >= {"compile_s", "lower_s", "graph_s"}
    graph = WorkloadGraph.load(out)
    assert graph.summary() == s
    first = out.read_bytes()
    r2 = run_flint("extract", "--model", "tiny", "--devices", "16", "--mesh", "fsdp=4,model=4",
                   "--out", str(out))
    assert r2.returncode == 0 and out.read_bytes() == first  # same input, same bytes
    assert "FLOP" in r2.stdout and "flops per device per step" in r2.stdout


SCRIPT = """
import jax, jax.numpy as jnp
from jax.sharding import PartitionSpec as P
rules = [(r"w$", P(None, "model")), (r"x$", P("data"))]
def train_step(params, x):
    return jax.grad(lambda p: (jnp.tanh(x @ p["w"]) ** 2).mean())(params)
def not_jittable(params, x):
    if x.sum() > 0:
        return params
    return params
def example_args():
    f = jnp.float32
    return ({"w": jax.ShapeDtypeStruct((128, 512), f)}, jax.ShapeDtypeStruct((64, 128), f))
"""


def test_cli_extract_user_script(tmp_path):
    script = tmp_path / "step.py"
    script.write_text(SCRIPT)
    r = run_flint("extract", f"{script}:train_step", "--devices", "8", "--mesh",
                  "data=2,model=4", "--json")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)["summary"]
    assert s["collectives_by_mesh_axis"]  # the weight gradient is reduced over data


@pytest.mark.parametrize("args,message", [
    (["--devices", "64", "--mesh", "data=8,model=4"], "has 32 devices but --devices is 64"),
    (["--devices", "8", "--hardware", "tpu-v9"], "unknown hardware 'tpu-v9'"),
    (["missing.py:f", "--devices", "8"], "file not found: missing.py"),
    (["{script}:nope", "--devices", "8"], "has no function 'nope'"),
    (["{script}:not_jittable", "--devices", "8", "--mesh", "data=2,model=4"],
     "cannot trace not_jittable"),
    (["{script}:train_step", "--devices", "8", "--mesh", "data=2,tensor=4"],
     "names mesh axis 'model', which is not in the mesh"),
    (["--devices", "8", "--model", "tiny", "--mesh", "data=8,oops"], "expected NAME=SIZE"),
    (["--devices", "8", "--model", "tiny", "--out", "/no/such/dir/g.json"], "does not exist"),
])
def test_cli_bad_input_is_one_line_exit_2(tmp_path, args, message):
    script = tmp_path / "step.py"
    script.write_text(SCRIPT)
    out = tmp_path / "never.json"
    args = [a.replace("{script}", str(script)) for a in args]
    r = run_flint("extract", *args, "--out", str(out)) if "--out" not in args else \
        run_flint("extract", *args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert message in r.stderr
    assert "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("flint: error")]
    assert len(lines) == 1
    assert not out.exists()
    assert not list(tmp_path.glob(".never.json.*"))
