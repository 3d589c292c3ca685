"""Chakra ET export / import: exact round trip, what Chakra's own tools and ASTRA-sim's
conventions require of every rank's file, imports of Chakra-made traces, bad input."""
import io
import json
import sys
from collections import defaultdict
from pathlib import Path

import networkx as nx
import pytest
import yaml
from chakra.schema.protobuf import et_def_pb2 as pb
from chakra.src.third_party.utils.protolib import encodeMessage

from conftest import run_flint
from flint.exporters.chakra import export_chakra
from flint.exporters.chakra_format import attrs, read_et
from flint.frontends.chakra import import_chakra
from flint.graph import WorkloadGraph, dumps_json
from flint.passes.expand_loops import ExpandLoops

DATA = Path(__file__).parent / "data" / "chakra"
SIMULATED = {pb.ALL_REDUCE, pb.ALL_GATHER, pb.ALL_TO_ALL, pb.REDUCE_SCATTER}


@pytest.fixture(scope="module")
def tiny_graph(tmp_path_factory):
    """A real extraction with scanned layers, FSDP x TP collectives and permutes."""
    path = tmp_path_factory.mktemp("tiny") / "tiny16.json"
    r = run_flint("extract", "--model", "tiny", "--devices", "16", "--mesh", "fsdp=2,model=8",
                  "--out", str(path), "--json")
    assert r.returncode == 0, r.stderr
    return WorkloadGraph.load(path)


@pytest.fixture(scope="module")
def exported(tiny_graph, tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "et"
    stats = export_chakra(tiny_graph, out, hardware="h100-sxm")
    return out, stats


def test_round_trip_of_a_real_graph_is_exact(tiny_graph, exported):
    out, stats = exported
    assert tiny_graph.loops, "the fixture should exercise loop expansion"
    flat = ExpandLoops().run(tiny_graph)
    assert stats.nodes_per_rank == len(flat.nodes)
    assert dumps_json(import_chakra(out).to_json()) == dumps_json(flat.to_json())


def test_fast_path_bytes_are_mlc_chakras_encoding(exported):
    """Specialized files (template + appended pg_name) are byte for byte what mlc-chakra's
    encodeMessage writes for the parsed messages."""
    out, stats = exported
    for rank in (0, 5, 15):
        data = (out / f"workload.{rank}.et").read_bytes()
        meta, nodes = read_et(out / f"workload.{rank}.et")
        buf = io.BytesIO()
        for message in [meta, *nodes]:
            encodeMessage(buf, message)
        assert buf.getvalue() == data


def test_every_file_follows_astra_sim_conventions(exported, tiny_graph):
    out, stats = exported
    groups = json.loads((out / "comm_groups.json").read_text())
    assert all(int(k) >= 1 for k in groups)
    issued = defaultdict(dict)          # pg -> rank -> [(type, size), ...]
    sends, recvs = set(), set()
    # all-to-alls go out as per-peer sends and receives (NCCL's way: chakra_alltoallv)
    n_coll = sum(1 for n in ExpandLoops().run(tiny_graph).nodes
                 if n.collective is not None
                 and n.op not in ("collective-permute", "all-to-all", "ragged-all-to-all"))
    for rank in range(stats.ranks):
        meta, nodes = read_et(out / f"workload.{rank}.et")
        assert meta.version == "1.0.0" and attrs(meta)["rank"] == rank
        ids = [n.id for n in nodes]
        assert len(ids) == len(set(ids))
        g = nx.DiGraph()
        g.add_nodes_from(ids)
        for n in nodes:
            for d in list(n.data_deps) + list(n.ctrl_deps):
                assert d in g, f"rank {rank}: node {n.id} depends on missing {d}"
                g.add_edge(d, n.id)
            assert list(n.data_deps) == sorted(n.data_deps)
            kinds = {a.name: a.WhichOneof("value") for a in n.attr}
            assert kinds["is_cpu_op"] == "bool_val"
            assert kinds["num_ops"] == "int64_val" and kinds["tensor_size"] == "uint64_val"
            a = attrs(n)
            if n.type == pb.COMM_COLL_NODE:
                assert kinds["comm_type"] == "int64_val" and kinds["comm_size"] == "int64_val"
                assert a["comm_type"] in SIMULATED and a["comm_size"] >= 0
                if "involved_dim" in a:     # whole network dimensions: no process group
                    assert kinds["involved_dim"] == "bool_list" and "pg_name" not in a
                    pg = "dims" + str(a["involved_dim"])
                    groups.setdefault(pg, list(range(stats.ranks)))
                else:
                    assert kinds["pg_name"] == "string_val"
                    assert rank in groups[a["pg_name"]]
                    pg = a["pg_name"]
                issued[pg].setdefault(rank, []).append((a["comm_type"], a["comm_size"]))
            elif n.type in (pb.COMM_SEND_NODE, pb.COMM_RECV_NODE):
                for key in ("comm_src", "comm_dst", "comm_tag"):
                    assert kinds[key] == "int32_val"
                entry = (a["comm_src"], a["comm_dst"], a["comm_tag"], a["comm_size"])
                assert (a["comm_src"] if n.type == pb.COMM_SEND_NODE else a["comm_dst"]) == rank
                (sends if n.type == pb.COMM_SEND_NODE else recvs).add(entry)
        assert nx.is_directed_acyclic_graph(g)
        assert sum(n.type == pb.COMM_COLL_NODE for n in nodes) == n_coll
    # every member of a process group issues the same collectives in the same order
    for pg, per_rank in issued.items():
        assert sorted(per_rank) == sorted(groups[pg])
        assert len({tuple(v) for v in per_rank.values()}) == 1, pg
    assert sends and sends == recvs                 # every SEND has its matching RECV


def test_chakra_tools_read_every_file(exported, tmp_path, monkeypatch):
    """mlc-chakra's jsonizer reads every rank's file; its visualizer loads one as a graph."""
    from chakra.src.jsonizer import jsonizer
    from chakra.src.visualizer import visualizer

    out, stats = exported
    for rank in range(stats.ranks):
        target = tmp_path / f"{rank}.json"
        monkeypatch.setattr(sys, "argv", ["chakra_jsonizer", "--input_filename",
                                          str(out / f"workload.{rank}.et"),
                                          "--output_filename", str(target)])
        jsonizer.main()
        text, decoder, pos, count = target.read_text(), json.JSONDecoder(), 0, 0
        while pos < len(text):
            _, pos = decoder.raw_decode(text, pos)
            count += 1
        assert count == 1 + len(read_et(out / f"workload.{rank}.et")[1])
    graphml = tmp_path / "rank3.graphml"
    monkeypatch.setattr(sys, "argv", ["chakra_visualizer", "--input_filename",
                                      str(out / "workload.3.et"), "--output_filename",
                                      str(graphml)])
    visualizer.main()
    assert nx.read_graphml(graphml).number_of_nodes() == len(read_et(out / "workload.3.et")[1])


def test_astra_sim_inputs_describe_the_cluster(exported, tmp_path, tiny_graph):
    """network.yml carries Flint's own network model in ASTRA-sim's units: bus bandwidth
    (link rate x bus efficiency) / 2^30, latency per link (a Switch hop is two links)."""
    from flint.cluster import Cluster
    from flint.exporters.astra_sim import network_dimensions
    from flint.hardware_models.network import NetworkModel
    from flint.hardware_models.spec import load_spec

    out, _ = exported
    net = yaml.safe_load((out / "network.yml").read_text())
    assert net["topology"] == ["Switch", "Switch"] and net["npus_count"] == [8, 2]
    spec = load_spec("h100-sxm")
    model = NetworkModel(spec, tiny_graph.cluster)
    assert net["bandwidth"] == pytest.approx([model.up.bandwidth / 2**30,
                                              model.out().bandwidth / 2**30], rel=1e-6)
    # latency: per link, fitted so that ASTRA-sim's latency terms add up to Flint's own
    # (NCCL launch + per-step latency) over the graph's collectives (tests below)
    assert all(0.1 < ns / 1e3 < 20 for ns in net["latency"])
    system = json.loads((out / "system.json").read_text())
    assert len(system["all-reduce-implementation"]) == 2 and system["peak-perf"] == 989.4
    assert system["preferred-dataset-splits"] == 1
    assert json.loads((out / "remote_memory.json").read_text())["memory-type"]
    # 4096 H100s: NVLink node x 32-node leaf group (SuperPOD SU) x 16 leaf groups
    dims = network_dimensions(NetworkModel(spec, Cluster(4096, (("data", 4096),), "h100-sxm")))
    assert [d["npus"] for d in dims] == [8, 32, 16]
    spec = load_spec("tpu-v5p")
    dims = network_dimensions(NetworkModel(spec, Cluster(4096, (("data", 4096),), "tpu-v5p")))
    assert [d["topology"] for d in dims] == ["Ring", "Ring", "Ring"]
    assert [d["npus"] for d in dims] == [16, 16, 16]


def test_astra_sim_latency_reproduces_flints_latency_terms():
    """One 8-rank all-reduce on the NVLink Switch dimension: ASTRA-sim's ring charges
    2(p-1) steps x 2 links x the written latency, which must equal the latency part of
    Flint's time (its time minus its bandwidth-only time)."""
    from dataclasses import replace

    from flint.cluster import Cluster
    from flint.exporters.astra_latency import matched_latencies
    from flint.exporters.astra_sim import FAMILIES, network_dimensions
    from flint.exporters.chakra_format import SIMULATED
    from flint.graph import Collective, Communicator, Node, NodeKind, WorkloadGraph
    from flint.hardware_models.network import NetworkModel
    from flint.hardware_models.spec import load_spec

    cluster = Cluster(8, (("data", 8),), "h100-sxm")
    comm = Communicator(0, "groups", "[1,8]<=[8]", 8, 8, 1, ("data",))
    node = Node(0, "ar", NodeKind.COLLECTIVE, "all-reduce", "collective",
                collective=Collective("all-reduce", 0, 1 << 20, 1 << 20, "bf16"))
    graph = WorkloadGraph(cluster, [node], [comm])
    net = NetworkModel(load_spec("h100-sxm"), cluster)
    t = net.time(node, comm)
    dims = network_dimensions(net)
    (dim,) = matched_latencies(net, dims, {"all-reduce": ["ring"]}, graph, [t], FAMILIES,
                               SIMULATED)
    latency = t - replace(net, latency_free=True).time(node, comm)
    assert dim["latency_ns"] * 1e-9 * 2 * 2 * 7 == pytest.approx(latency)


def test_export_is_deterministic_and_replaces_stale_ranks(tiny_graph, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    export_chakra(tiny_graph, a, workers=1)
    export_chakra(tiny_graph, b, workers=4)
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    (a / "workload.99.et").write_bytes(b"stale")
    export_chakra(tiny_graph, a)
    assert not (a / "workload.99.et").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".partial")]


def test_import_of_chakra_text_converter_output_estimates(tmp_path):
    """Chakra's own Text converter (ASTRA-sim's layer-wise DATA-parallel description)."""
    from chakra.src.converter.text_converter import TextConverter

    (tmp_path / "dp.txt").write_text(
        "DATA\n2\n"
        "layer0 -1 100 NONE 0 120 NONE 0 130 ALLREDUCE 8388608 10\n"
        "layer1 -1 200 NONE 0 220 NONE 0 230 ALLREDUCE 16777216 10\n")
    TextConverter(str(tmp_path / "dp.txt"), str(tmp_path / "dp"), 8, 1).convert()
    graph = import_chakra(tmp_path)
    assert graph.cluster.devices == 8
    colls = [n for n in graph.nodes if n.collective]
    assert [c.collective.bytes_in for c in colls] == [16777216, 8388608]
    assert all(c.collective.type == "all-reduce" and
               graph.communicator(c).size == 8 for c in colls)
    from flint.hardware_models.estimate import estimate

    est = estimate(graph, "h100-sxm")
    assert est.compute_busy_s == pytest.approx((100 + 200 + 130 + 230 + 220) * 1e-6)
    assert est.step_time_s > est.compute_busy_s
    r = run_flint("estimate", str(tmp_path), "--hardware", "h100-sxm", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["step_time_s"] == pytest.approx(est.step_time_s)


def test_import_of_chakra_pytorch_converter_output():
    """tests/data/chakra/torch_mlp.0.et: chakra_converter PyTorch on a real host execution
    trace (scripts/make_chakra_fixture.py)."""
    graph = import_chakra(DATA / "torch_mlp.0.et")
    _, nodes = read_et(DATA / "torch_mlp.0.et")
    kept = [n for n in nodes if n.type != pb.METADATA_NODE]
    assert len(graph.nodes) == len(kept) and len(kept) < len(nodes)
    names = {n.name for n in graph.nodes}
    assert {"aten::addmm", "aten::linear", "c10d::allreduce_"} <= names
    assert all(n.meta["host"] for n in graph.nodes)
    assert sum(len(n.inputs) + len(n.control) for n in graph.nodes) > len(graph.nodes)
    r = run_flint("estimate", str(DATA / "torch_mlp.0.et"), "--json")
    assert r.returncode == 0, r.stderr


def _write(path, nodes, meta=None):
    buf = io.BytesIO()
    encodeMessage(buf, meta or pb.GlobalMetadata(version="1.0.0"))
    for n in nodes:
        encodeMessage(buf, n)
    path.write_bytes(buf.getvalue())


def _comp(i, deps=()):
    return pb.Node(id=i, name=f"n{i}", type=pb.COMP_NODE, data_deps=list(deps),
                   duration_micros=5, attr=[pb.AttributeProto(name="is_cpu_op", bool_val=False)])


@pytest.mark.parametrize("case,message", [
    ("truncated", "is truncated"),
    ("garbage", "is corrupt"),
    ("gzip", "gzip-compressed"),
    ("dangling", "depends on node 7, which is not in the file"),
    ("cycle", "dependency cycle"),
    ("duplicate", "appears twice"),
    ("unknown_collective", "unknown comm_type 42"),
    ("unknown_group", "names process group '9'"),
])
def test_bad_et_is_one_line_exit_2(tmp_path, exported, case, message):
    out, _ = exported
    path = tmp_path / "bad.0.et"
    good = (out / "workload.1.et").read_bytes()
    if case == "truncated":
        path.write_bytes(good[: len(good) // 2])
    elif case == "garbage":
        path.write_bytes(good[:40] + b"\xff" * 64 + good[104:])
    elif case == "gzip":
        import gzip

        path.write_bytes(gzip.compress(good))
    elif case == "dangling":
        _write(path, [_comp(0), _comp(1, [7])])
    elif case == "cycle":
        a, b = _comp(0, [1]), _comp(1, [0])
        _write(path, [a, b])
    elif case == "duplicate":
        _write(path, [_comp(0), _comp(0)])
    else:
        coll = pb.Node(id=1, name="c", type=pb.COMM_COLL_NODE, attr=[
            pb.AttributeProto(name="comm_type", int64_val=42 if case == "unknown_collective" else 0),
            pb.AttributeProto(name="comm_size", int64_val=1024),
            pb.AttributeProto(name="pg_name", string_val="9")])
        _write(path, [_comp(0), coll])
    for cmd in (["import", str(path), "--out", str(tmp_path / "g.json")],
                ["estimate", str(path)]):
        r = run_flint(*cmd)
        assert r.returncode == 2, (case, r.stdout, r.stderr)
        lines = [x for x in r.stderr.strip().splitlines() if x.strip()]
        assert len(lines) == 1 and message in lines[0], (case, r.stderr)
        assert "Traceback" not in r.stderr
    assert not (tmp_path / "g.json").exists()


def test_export_cli_bad_input_leaves_nothing(tiny_graph, tmp_path):
    graph = tmp_path / "g.json"
    tiny_graph.save(graph)
    cases = [(["--format", "onnx"], "unknown --format"),
             (["--set", "nic_bandwidth=-3Gb/s"], "nic_bandwidth"),
             (["--set", "devices_per_node=3"], "do not fill"),
             (["--ranks", "3-99"], "outside the graph's 16 ranks"),
             (["--annotate", "some"], "--annotate")]
    for extra, message in cases:
        r = run_flint("export", str(graph), "--out", str(tmp_path / "out"), *extra)
        assert r.returncode == 2 and message in r.stderr, (extra, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1
        assert not (tmp_path / "out").exists()
        assert not [p for p in tmp_path.iterdir() if p.name.endswith(".partial")]
    r = run_flint("export", str(graph), "--out", str(tmp_path / "missing" / "out"))
    assert r.returncode == 2 and "does not exist" in r.stderr


def test_export_cli_formats(tiny_graph, tmp_path):
    graph = tmp_path / "g.json"
    tiny_graph.save(graph)
    r = run_flint("export", str(graph), "--out", str(tmp_path / "o"), "--ranks", "0-3",
                  "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["files_written"] == 4 and report["MB_per_s"] > 0
    assert sorted(p.name for p in (tmp_path / "o").glob("*.et")) == [
        f"workload.{i}.et" for i in range(4)]
    for fmt, name in (("json", "workload.json"), ("perfetto", "workload.trace.json")):
        r = run_flint("export", str(graph), "--format", fmt, "--out", str(tmp_path / "o"))
        assert r.returncode == 0, r.stderr
        assert json.loads((tmp_path / "o" / name).read_text())
    assert WorkloadGraph.load(tmp_path / "o" / "workload.json").to_json() == tiny_graph.to_json()
