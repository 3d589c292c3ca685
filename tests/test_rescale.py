"""`flint rescale`: a rescaled graph against a real re-extraction at the target size, round
trips, impossible targets, and imported Chakra traces (one `ranks` axis)."""
import io
import json
import subprocess
import sys
from collections import defaultdict

import numpy as np
import pytest
from chakra.schema.protobuf import et_def_pb2 as pb
from chakra.src.third_party.utils.protolib import encodeMessage

from conftest import run_flint
from flint.errors import FlintError
from flint.frontends.chakra import import_chakra
from flint.graph import WorkloadGraph, collective_size_bytes
from flint.hardware_models.estimate import estimate
from flint.hlo.replica_groups import parse_replica_groups
from flint.passes import parse_pipeline
from flint.passes.rescale import Rescale

# Tiny model, sequence 128 (with 64, the sequence equals vocab / 8 and activations take the
# shape of embedding shards), default mesh fsdp=N/8,model=8. At 128 and 256 devices XLA
# makes the same choices, so the rescaled graph can be held to the re-extraction exactly.
SIZES = (128, 256)


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    """{devices: graph} extracted for real (two compiles side by side)."""
    d = tmp_path_factory.mktemp("rescale")
    procs = {n: subprocess.Popen(
        [sys.executable, "-m", "flint.cli", "extract", "--model", "tiny", "--seq-len", "128",
         "--devices", str(n), "--mesh", f"fsdp={n // 8},model=8",   # TP=8 on 4 heads
         "--out", str(d / f"tiny{n}.json"), "--json"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for n in SIZES}
    for n, p in procs.items():
        assert p.wait(timeout=300) == 0, p.stderr.read()
    return {n: WorkloadGraph.load(d / f"tiny{n}.json") for n in SIZES}


def _communicators(graph):
    """(kind, size, num_groups, mesh axes, groups as a set of member lists) per distinct
    group list: a replica-group list is a set of groups, so row order is not compared;
    member order inside a group (the all-gather concatenation order) is."""
    return {(c.kind, c.size, c.num_groups, c.mesh_axes,
             frozenset(tuple(r) for r in c.groups().tolist())) for c in graph.communicators}


def _bytes_by_type_and_axes(graph):
    out = defaultdict(lambda: [0, 0, 0])
    for n in graph.collectives():
        key = (n.collective.type, graph.communicator(n).mesh_axes)
        for i, b in enumerate((n.collective.bytes_in, n.collective.bytes_out,
                               collective_size_bytes(n))):
            out[key][i] += b * n.repeat
    return dict(out)


@pytest.mark.parametrize("source,target", [(128, 256), (256, 128)])
def test_communicators_equal_re_extraction(graphs, source, target):
    rescaled = Rescale(devices=target).run(graphs[source])
    real = graphs[target]
    assert rescaled.cluster == real.cluster
    assert _communicators(rescaled) == _communicators(real)
    assert any(c.size != o.size for c, o in zip(rescaled.communicators,
                                                graphs[source].communicators))
    for c in rescaled.communicators:
        assert c.num_devices == target
        if c.kind == "groups":   # written in XLA's iota syntax, which the reader expands
            assert "<=" in c.spec
            assert (parse_replica_groups(c.spec, target) == c.groups()).all()


@pytest.mark.parametrize("source,target", [(128, 256), (256, 128)])
def test_collective_bytes_equal_re_extraction(graphs, source, target):
    """Per (type, mesh axes): input, output and nccl-size bytes per step. Tolerance zero:
    the compiler emitted the same collectives at both sizes, so any difference is the
    rescale's (scripts/compare_rescale.py measures sizes where XLA changes its mind)."""
    rescaled = Rescale(devices=target).run(graphs[source])
    assert _bytes_by_type_and_axes(rescaled) == _bytes_by_type_and_axes(graphs[target])
    gathers = [n for n in rescaled.collectives() if n.collective.type == "all-gather"]
    assert gathers and all(n.collective.bytes_in * rescaled.communicator(n).size ==
                           n.collective.bytes_out for n in gathers)


def test_compute_and_memory_follow_the_shards(graphs):
    rescaled = Rescale(devices=256).run(graphs[128])
    real = graphs[256]
    for key in ("flops_per_device", "bytes_read_per_device", "bytes_written_per_device"):
        assert rescaled.summary()[key] == pytest.approx(real.summary()[key], rel=0.005)
    a, b = estimate(rescaled, "h100-sxm"), estimate(real, "h100-sxm")
    assert a.step_time_s == pytest.approx(b.step_time_s, rel=0.01)
    assert a.memory_bytes == pytest.approx(b.memory_bytes, rel=0.01)
    assert rescaled.meta["rescaled_from"] == {"devices": 128, "mesh": {"fsdp": 16, "model": 8}}
    assert "xla_memory" not in rescaled.meta
    assert rescaled.meta["model_flops_per_device"] == graphs[128].meta["model_flops_per_device"]
    assert graphs[128].cluster.devices == 128, "the input graph must not change"


def test_rescale_and_back_gives_the_original_estimate(graphs):
    original = graphs[128]
    there = Rescale(devices=512).run(original)
    back = Rescale(devices=128).run(there)
    assert _communicators(back) == _communicators(original)
    assert [n.operands for n in back.nodes] == [n.operands for n in original.nodes]
    a, b = estimate(back, "h100-sxm"), estimate(original, "h100-sxm")
    assert a.step_time_s == pytest.approx(b.step_time_s, rel=1e-9)
    assert a.memory_bytes == pytest.approx(b.memory_bytes, rel=1e-9)
    assert estimate(there, "h100-sxm").step_time_s > b.step_time_s


def test_pipeline_string_and_explicit_mesh(graphs):
    (p,) = parse_pipeline("rescale{devices=256,mesh=fsdp=32}")
    with pytest.raises(FlintError, match=r"mesh fsdp=32 has 32 devices"):
        p.run(graphs[128])
    explicit = Rescale(devices=256, mesh="fsdp=32,model=8").run(graphs[128])
    assert _communicators(explicit) == _communicators(graphs[256])
    staged = WorkloadGraph.from_json(graphs[128].to_json())
    staged.nodes[0].meta["device"] = 0
    with pytest.raises(FlintError, match="MPMD"):
        Rescale(devices=256).run(staged)


@pytest.mark.parametrize("args,message", [
    (["--devices", "0"], "cannot rescale to 0 devices"),
    (["--devices", "100"], "need a multiple of 8"),
    (["--devices", "256", "--mesh", "fsdp=16,model=8"], "has 128 devices but --devices is 256"),
    (["--devices", "256", "--mesh", "data=32,model=8"], "differ from the graph's (fsdp, model)"),
    (["--devices", "256", "--mesh", "fsdp=16,model=16"], "rescale changes data-parallel axes"),
    (["--devices", "2048"], "shards a dim of 128, which 256 does not divide"),
    (["--devices", "256", "--axis", "pipe"], "has no axis 'pipe'"),
])
def test_impossible_targets_are_one_line_exit_2(graphs, tmp_path, args, message):
    src = tmp_path / "g.json"
    graphs[128].save(src)
    out = tmp_path / "out.json"
    r = run_flint("rescale", str(src), *args, "--out", str(out))
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and message in lines[0], r.stderr
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["g.json"]


def test_cli_writes_the_graph_and_reports(graphs, tmp_path):
    src, out = tmp_path / "g.json", tmp_path / "r.json"
    graphs[128].save(src)
    r = run_flint("rescale", str(src), "--devices", "256", "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["before"]["devices"] == 128 and report["after"]["devices"] == 256
    assert report["after"]["mesh"] == {"fsdp": 32, "model": 8}
    assert report["communicators_resized"] > 0 and report["collectives_rescaled"] > 0
    assert report["after"]["step_time_s"] > report["before"]["step_time_s"] > 0
    assert _communicators(WorkloadGraph.load(out)) == _communicators(graphs[256])
    r = run_flint("rescale", str(src), "--devices", "256", "--out", str(out))
    assert r.returncode == 0 and "predicted step time" in r.stdout, r.stderr


def _chakra_trace(directory, world: int):
    """Rank 0 of a DP x TP job on `world` ranks (TP groups of 4 inside each block of 4,
    DP groups 4 apart): a TP all-reduce, a DP all-gather and reduce-scatter, and an
    all-reduce of every rank (no process group)."""
    def coll(i, kind, size, group=None, deps=()):
        attrs = [pb.AttributeProto(name="comm_type", int64_val=kind),
                 pb.AttributeProto(name="comm_size", int64_val=size)]
        if group:
            attrs.append(pb.AttributeProto(name="pg_name", string_val=group))
        return pb.Node(id=i, name=f"c{i}", type=pb.COMM_COLL_NODE, data_deps=list(deps),
                       attr=attrs)

    nodes = [pb.Node(id=0, name="aten::mm", type=pb.COMP_NODE, duration_micros=50,
                     attr=[pb.AttributeProto(name="is_cpu_op", bool_val=False)]),
             coll(1, pb.ALL_REDUCE, 1 << 20, "tp", [0]),
             coll(2, pb.ALL_GATHER, 1 << 16, "dp", [1]),
             coll(3, pb.REDUCE_SCATTER, 1 << 20, "dp", [2]),
             coll(4, pb.ALL_REDUCE, 4096, None, [3])]
    buf = io.BytesIO()
    encodeMessage(buf, pb.GlobalMetadata(version="1.0.0"))
    for n in nodes:
        encodeMessage(buf, n)
    directory.mkdir()
    for rank in range(world):
        (directory / f"trace.{rank}.et").write_bytes(buf.getvalue())
    groups = {"tp": [0, 1, 2, 3], "dp": list(range(0, world, 4))}
    (directory / "comm_groups.json").write_text(json.dumps(groups))
    return directory


def test_chakra_trace_rescales_along_its_ranks_axis(tmp_path):
    trace = _chakra_trace(tmp_path / "et", 16)
    graph = import_chakra(trace)
    assert graph.cluster.mesh == (("ranks", 16),)
    out = tmp_path / "r.json"
    r = run_flint("rescale", str(trace), "--devices", "64", "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    rescaled = WorkloadGraph.load(out)
    assert rescaled.cluster.mesh == (("ranks", 64),)
    by_name = {n.name: n for n in rescaled.nodes}
    groups = {name: rescaled.communicator(by_name[name]).groups().tolist()
              for name in ("c1", "c2", "c4")}
    assert groups["c1"] == [[0, 1, 2, 3]]                 # the TP block keeps its width
    assert groups["c2"] == [list(range(0, 64, 4))]        # the DP group grows
    assert groups["c4"] == [list(range(64))]
    ag, rs = by_name["c2"].collective, by_name["c3"].collective
    assert (ag.bytes_in, ag.bytes_out) == ((1 << 16) * 4 // 16, (1 << 16) * 4)
    assert (rs.bytes_in, rs.bytes_out) == (1 << 20, (1 << 20) // 16)
    assert by_name["c1"].collective.bytes_in == 1 << 20
    assert np.isclose(estimate(Rescale(devices=16).run(rescaled), "h100-sxm").step_time_s,
                      estimate(graph, "h100-sxm").step_time_s)
    r = run_flint("rescale", str(trace), "--devices", "6", "--out", str(out))
    assert r.returncode == 2 and "needs blocks of 4" in r.stderr, r.stderr
