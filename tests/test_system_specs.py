"""A system's spec beyond its GPU: the NCCL environment it runs (`nccl_protocol`) and specs
that start from a shipped one (`based_on`), as GCP's A3 Mega does (hardware_models/specs/
a3-mega.yaml)."""
from __future__ import annotations

import dataclasses
import json

import pytest

from conftest import communicator, run_flint
from flint.cluster import Cluster
from flint.errors import FlintError
from flint.graph import Collective, Node, NodeKind, WorkloadGraph
from flint.hardware_models.network import NetworkModel
from flint.hardware_models.spec import load_spec
def test_a_systems_nccl_protocol_holds_everywhere_and_takes_nvls_away_unless_simple(tmp_path):
    """`nccl_protocol` (interconnect.scale_out, or --set) is the NCCL_PROTO a system's
    environment sets: every collective is priced as that protocol, and NVLS (Simple only)
    is offered only where Simple is allowed."""
    h100 = load_spec("h100-sxm")
    assert h100.nccl_protocol == "auto"
    comm = communicator("[1,8]<=[8]", 8)
    cluster = Cluster(8, (("data", 8),))

    def ar(spec, size):
        node = Node(0, "ar", NodeKind.COLLECTIVE, "all-reduce", "collective",
                    collective=Collective("all-reduce", 0, size, size, "bf16"))
        net = NetworkModel(spec, cluster)
        return net.time(node, comm), set(net.options(node, comm))

    simple = load_spec("h100-sxm", ["nccl_protocol=Simple"])
    ll = load_spec("h100-sxm", ["nccl_protocol=LL"])
    assert simple.sources["nccl_protocol"] == "what-if override"
    # 8 bytes: NCCL's pick is LL; Simple-only pays Simple's base and per-step latency
    assert ar(h100, 8)[0] < ar(simple, 8)[0]
    assert ar(simple, 8)[0] == pytest.approx(
        dataclasses.replace(NetworkModel(h100, cluster), protocol="Simple").time(
            Node(0, "ar", NodeKind.COLLECTIVE, "all-reduce", "collective",
                 collective=Collective("all-reduce", 0, 8, 8, "bf16")), comm))
    big = 1 << 30
    assert "nvls" in ar(simple, big)[1] and ar(simple, big)[0] == ar(h100, big)[0]
    assert "nvls" not in ar(ll, big)[1] and ar(ll, big)[0] > ar(h100, big)[0]
    # in a spec file, under interconnect.scale_out; a word it does not know is one line
    import yaml

    from flint.hardware_models.spec import SPECS_DIR

    doc = yaml.safe_load((SPECS_DIR / "h100-sxm.yaml").read_text())
    doc["interconnect"]["scale_out"]["nccl_protocol"] = "Simple"
    path = tmp_path / "simple.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert load_spec(str(path)).nccl_protocol == "Simple"
    doc["interconnect"]["scale_out"]["nccl_protocol"] = "LL256"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(FlintError, match="nccl_protocol 'LL256' is not one of auto, Simple"):
        load_spec(str(path))
    with pytest.raises(FlintError, match="--set nccl_protocol: 'fast' is not one of"):
        load_spec("h100-sxm", ["nccl_protocol=fast"])


def test_readme_a3_mega_spec_prices_a_16_gpu_all_reduce_as_simple_without_nvls(tmp_path):
    """The README's `--hardware a3-mega` (based_on h100-sxm): the DGX H100 spec with its
    NICs, NVLS off and Simple only, as those three what-ifs on h100-sxm price it; a small
    all-reduce over two nodes pays Simple's latency; a bad protocol word is one line,
    exit 2."""
    comm = communicator("[1,16]<=[16]", 16)
    nodes = [Node(0, "ar", NodeKind.COLLECTIVE, "all-reduce", "collective",
                  collective=Collective("all-reduce", 0, 4096, 4096, "bf16"))]
    g = tmp_path / "g.json"
    WorkloadGraph(Cluster(16, (("data", 16),)), nodes, [comm]).save(g)
    a3 = ["--set", "nic_bandwidth=200Gb/s", "--set", "switch_reduction=none",
          "--set", "nccl_protocol=Simple"]
    steps = {}
    for name, args in (("dgx", ["--hardware", "h100-sxm"]), ("a3", ["--hardware", "a3-mega"]),
                       ("sets", ["--hardware", "h100-sxm", *a3])):
        r = run_flint("estimate", str(g), *args, "--json")
        assert r.returncode == 0, r.stderr
        steps[name] = json.loads(r.stdout)["step_time_s"]
    assert steps["a3"] == steps["sets"]
    # NCCL's tree latencies over two nodes: Simple ~92 us, LL (NCCL's pick) ~25 us
    assert steps["a3"] > 3 * steps["dgx"] and 80e-6 < steps["a3"] < 110e-6
    r = run_flint("estimate", str(g), "--hardware", "h100-sxm", "--set", "nccl_protocol=LL64")
    assert r.returncode == 2 and "nccl_protocol" in r.stderr and "Traceback" not in r.stderr


def test_a_spec_based_on_a_shipped_one_states_only_where_it_differs(tmp_path):
    """`based_on`: the shipped spec's document under this one's; a figure is replaced
    whole, a section key by key; a base that is not a shipped spec is one line."""
    h100, a3 = load_spec("h100-sxm"), load_spec("a3-mega")
    assert a3.peak_flops == h100.peak_flops and a3.hbm_bandwidth == h100.hbm_bandwidth
    assert a3.sources["peak_bf16"] == h100.sources["peak_bf16"]
    assert a3.scale_up_bandwidth == h100.scale_up_bandwidth     # scale_up merged by key
    assert (a3.nic_bandwidth, a3.switch_reduction, a3.nccl_protocol) == (25e9, "none",
                                                                         "Simple")
    assert "TCPXO" in a3.sources["nic_bandwidth"] and a3.compile_target == "h100-sxm"
    mine = tmp_path / "mine.yaml"
    mine.write_text("based_on: a3-mega\nname: mine\nmemory:\n  hbm_bandwidth: "
                    "{value: 3.0 TB/s, source: my measurement}\n")
    s = load_spec(str(mine))
    assert (s.name, s.hbm_bandwidth, s.hbm_capacity, s.nccl_protocol) == (
        "mine", 3.0e12, h100.hbm_capacity, "Simple")
    assert s.sources["hbm_bandwidth"] == "my measurement"
    mine.write_text("based_on: h100-sxxm\nname: mine\n")
    with pytest.raises(FlintError, match="based_on 'h100-sxxm' is not a shipped spec"):
        load_spec(str(mine))
