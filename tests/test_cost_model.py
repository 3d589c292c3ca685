"""Cost model pieces: units, specs and what-ifs, network formulas, schedule, estimate CLI."""
import dataclasses
import json

import pytest

from conftest import communicator, run_flint
from flint.cluster import Cluster
from flint.errors import FlintError
from flint.graph import Collective, Communicator, Node, NodeKind, WorkloadGraph
from flint.hardware_models.cost_model import DefaultCostModel, default_cost_model
from flint.hardware_models.estimate import estimate
from flint.hardware_models.network import NetworkModel
from flint.hardware_models.spec import apply_overrides, load_spec
from flint.hardware_models.units import parse_quantity

SPEC = """
name: test-gpu
kind: gpu
model: test
compute:
  peak_flops:
    fp32: {value: "50 TFLOP/s", source: "test sheet"}
    bf16: {value: "1000 TFLOP/s", source: "test sheet"}
memory:
  hbm_capacity: {value: "80 GB", source: "test sheet"}
  hbm_bandwidth: {value: "4 TB/s", source: "test sheet"}
interconnect:
  scale_up: {name: link, bandwidth_per_direction: {value: "400 GB/s", source: "t"},
             latency: {value: "2 us", source: "t"}}
  scale_out: {name: nic, bandwidth_per_direction: {value: "400 Gb/s", source: "t"},
              latency: {value: "5 us", source: "t"}}
system:
  devices_per_node: {value: "8 devices", source: "t"}
  scale_up_domain: {value: "8 devices", source: "t"}
"""


@pytest.fixture()
def spec_path(tmp_path):
    p = tmp_path / "test-gpu.yaml"
    p.write_text(SPEC)
    return p


def test_units():
    assert parse_quantity("3.35 TB/s", "bandwidth") == 3.35e12
    assert parse_quantity("400 Gb/s", "bandwidth") == 50e9
    assert parse_quantity("80 GiB", "bytes") == 80 * 2**30
    assert parse_quantity("2 us", "time") == 2e-6
    assert parse_quantity("989.4 TFLOP/s", "flops") == pytest.approx(989.4e12)
    for text, kind, msg in [("4.8", "bandwidth", "has no unit"), (4.8, "bandwidth", "no unit"),
                            ("-1 TB/s", "bandwidth", "negative"), ("80 GB", "bandwidth",
                                                                   "not a bandwidth unit"),
                            ("fast", "time", "not a number")]:
        with pytest.raises(FlintError, match=msg):
            parse_quantity(text, kind, "hbm_bandwidth")


def test_spec_and_what_if_overrides(spec_path):
    s = load_spec(str(spec_path))
    assert s.hbm_bandwidth == 4e12 and s.nic_bandwidth == 50e9 and s.peak("bf16") == 1e15
    assert s.peak("f32") == 50e12 and s.sources["hbm_bandwidth"] == "test sheet"
    w = apply_overrides(s, ["hbm_bandwidth=4.8TB/s", "nic_bandwidth=800Gb/s", "peak_bf16=2PFLOP/s"])
    assert (w.hbm_bandwidth, w.nic_bandwidth, w.peak("bf16")) == (4.8e12, 100e9, 2e15)
    assert w.sources["nic_bandwidth"] == "what-if override"
    for bad, msg in [("hbm_bandwidth=4.8", "no unit"), ("hbm_bandwidth=-1TB/s", "negative"),
                     ("peak_fp7=1PFLOP/s", "unknown dtype"), ("warp_speed=9", "unknown hardware"),
                     ("hbm_bandwidth", "expected NAME=VALUE")]:
        with pytest.raises(FlintError, match=msg):
            apply_overrides(s, [bad])


@pytest.mark.parametrize("edit,msg", [
    (("4 TB/s", "4"), "has no unit"),
    (("4 TB/s", "-4 TB/s"), "negative"),
    (('source: "test sheet"}\n    bf16', 'source: "test sheet"}\n    bf17'), "unknown key 'bf17' in compute.peak_flops .did you mean 'bf16'"),
    (('{value: "80 GB", source: "test sheet"}', '{value: "80 GB"}'), "has no source"),
])
def test_bad_specs(tmp_path, edit, msg):
    p = tmp_path / "bad.yaml"
    p.write_text(SPEC.replace(*edit, 1))
    with pytest.raises(FlintError, match=msg):
        load_spec(str(p))


def test_network_levels_and_algorithms(spec_path):
    spec = load_spec(str(spec_path))
    net = NetworkModel(spec, Cluster(64, (("data", 8), ("model", 8))))
    s = 1 << 30
    node = Node(0, "ar", NodeKind.COLLECTIVE, "all-reduce", "collective",
                collective=Collective("all-reduce", 0, s, s, "bf16"))
    inside = communicator("[8,8]<=[64]", 64)          # model axis: one NVLink domain
    across = communicator("[8,8]<=[8,8]T(1,0)", 64)   # data axis: one rank per node
    # NCCL ring, Simple protocol at 1 GiB: base latency 8.4 us + 14 steps of the spec's
    # stated 2 us + the bus bytes at 80% of the link (bus efficiency) + filling the
    # pipeline (nccl.PIPELINE_FILL_BYTES of the buffer at the ring's algorithm bandwidth,
    # i.e. 2(p-1)/p of them at the bus bandwidth).
    ring_inside = 8.4e-6 + 2 * 7 / 8 * (s + 12 * 2**20) / (400e9 * 0.8) + 2 * 7 * 2e-6
    assert net.time(node, inside) == pytest.approx(ring_inside)
    assert net.placement(across).domains == 8
    assert net.time(node, across) > 5 * net.time(node, inside)  # NIC is 8x slower
    everyone = communicator("[1,64]<=[64]", 64)
    # Across nodes NCCL's rings stripe their channels over the node's 8 NICs while the
    # NVLink carries them too: bus bandwidth min(NVLink, 8 x NIC), not one NIC's.
    ring = dataclasses.replace(net, algorithm="ring", latency_free=True).time(node, everyone)
    assert ring == pytest.approx(2 * 63 / 64 * s / min(400e9 * 0.8, 8 * 50e9 * 0.9))
    assert net.time(node, everyone) < 1.01 * dataclasses.replace(
        net, algorithm="ring").time(node, everyone)
    # hierarchical (not one of NCCL's algorithms) only when asked for, and slower here
    hierarchical = dataclasses.replace(net, algorithm="hierarchical")
    assert "hierarchical" not in net.options(node, everyone)
    assert hierarchical.time(node, everyone) > net.time(node, everyone)


def test_oversubscription_applies_past_one_leaf_group(spec_path):
    spec = load_spec(str(spec_path), ["leaf_group=32 devices", "oversubscription=2"])
    net = NetworkModel(spec, Cluster(64, (("data", 8), ("model", 8))))
    s = 1 << 30
    node = Node(0, "ag", NodeKind.COLLECTIVE, "all-gather", "collective",
                collective=Collective("all-gather", 0, s, s, "bf16"))
    two_leaves = communicator("[8,8]<=[8,8]T(1,0)", 64)  # one rank per node, nodes 0-7
    four_nodes = Communicator(1, "groups", "{{0,8,16,24},{32,40,48,56}}", 64, 4, 2, ("data",))
    assert net.placement(two_leaves).leaves == 2 and net.placement(four_nodes).leaves == 1
    flat = load_spec(str(spec_path), ["leaf_group=32 devices"])
    base = NetworkModel(flat, Cluster(64, (("data", 8), ("model", 8))))
    assert net.time(node, four_nodes) == pytest.approx(base.time(node, four_nodes))
    ratio = net.time(node, two_leaves) / base.time(node, two_leaves)
    assert 1.9 < ratio <= 2.0   # bandwidth term halves; latency term does not


def _toy_graph(async_comm: bool) -> WorkloadGraph:
    comm = communicator("[1,8]<=[8]", 8)
    mm = dict(kind=NodeKind.COMPUTE, op="dot", op_class="gemm", flops=2e12,
              operands=["bf16[8192,8192]"])
    nodes = [Node(0, "g0", **mm),
             Node(1, "ar", NodeKind.COLLECTIVE, "all-reduce", "collective", inputs=[0],
                  collective=Collective("all-reduce", 0, 1 << 30, 1 << 30, "bf16",
                                        is_async=async_comm, window=(2, 2))),
             Node(2, "g1", inputs=[0], **mm),
             Node(3, "use", NodeKind.COMPUTE, "add", "elementwise", inputs=[1, 2], flops=1)]
    return WorkloadGraph(Cluster(8, (("data", 8),)), nodes, [comm])


def test_schedule_overlaps_async_collectives(spec_path):
    sync = estimate(_toy_graph(False), str(spec_path))
    overlapped = estimate(_toy_graph(True), str(spec_path))
    assert overlapped.step_time_s < sync.step_time_s
    assert sync.exposed_communication_s > overlapped.exposed_communication_s
    tl = overlapped.timeline
    assert tl.stream[1] == "collectives" and tl.start[1] < tl.finish[2]  # overlap
    assert tl.critical_path[-1] == 3


def test_replacing_the_compute_model(spec_path):
    """The documented seam: swap the compute half, keep the network."""
    graph = _toy_graph(True)

    class FixedCompute:
        def time(self, node):
            return 1e-3

    model = default_cost_model(graph, str(spec_path))
    custom = dataclasses.replace(model, compute=FixedCompute())
    assert isinstance(custom, DefaultCostModel)
    e = estimate(graph, cost_model=custom)
    assert e.by_class_s["gemm"] == pytest.approx(2e-3)


def test_cli_estimate(spec_path, tmp_path):
    g = tmp_path / "g.json"
    _toy_graph(True).save(g)
    trace, png = tmp_path / "t.json", tmp_path / "b.png"
    r = run_flint("estimate", str(g), "--hardware", str(spec_path), "--set",
                  "nic_bandwidth=800Gb/s", "--json", "--trace", str(trace), "--plot", str(png))
    assert r.returncode == 0, r.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    first = png.read_bytes()
    run_flint("estimate", str(g), "--hardware", str(spec_path), "--set",
              "nic_bandwidth=800Gb/s", "--plot", str(png))
    assert png.read_bytes() == first  # same input, same bytes
    e = json.loads(r.stdout)
    assert e["step_time_s"] > 0 and e["hardware"] == "test-gpu"
    events = json.loads(trace.read_text())["traceEvents"]
    assert {ev["name"] for ev in events if ev["ph"] == "X"} == {"g0", "ar", "g1", "use"}
    # Chrome trace-event format: complete events carry pid/tid/ts/dur in microseconds
    assert all({"pid", "tid", "ts", "dur"} <= set(ev) and ev["dur"] >= 0
               for ev in events if ev["ph"] == "X")
    r = run_flint("estimate", str(g), "--hardware", str(spec_path), "--set",
                  "hbm_bandwidth=-3TB/s")
    assert r.returncode == 2 and "negative" in r.stderr and "Traceback" not in r.stderr
    r = run_flint("estimate", str(g), "--hardware", str(spec_path), "--set",
                  "devices_per_node=3 devices", "--trace", str(tmp_path / "no.json"))
    assert r.returncode == 2 and "do not fill whole test-gpu nodes of 3" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "no.json").exists()


def test_every_shipped_spec_loads_with_sources():
    from flint.hardware_models.spec import FIELDS, spec_names

    names = spec_names()
    assert {"h100-sxm", "h200", "a100-40gb-sxm", "a100-80gb-sxm", "b200", "mi300x", "tpu-v4",
            "tpu-v5e", "tpu-v5p", "cpu"} <= set(names)
    for name in names:
        s = load_spec(name)
        assert s.peak("bf16") > 0 and s.hbm_bandwidth > 0 and s.hbm_capacity > 0
        for dtype in s.peak_flops:
            assert s.sources[f"peak_{dtype}"].strip()
        assert all(s.sources[k].strip() for k in FIELDS if k in s.sources)


def test_cli_extract_with_estimate_reports_mfu_and_memory():
    r = run_flint("extract", "--model", "tiny", "--devices", "16", "--mesh", "fsdp=2,model=8",
                  "--estimate", "--set", "hbm_capacity=1GB", "--json")
    assert r.returncode == 0, r.stderr
    e = json.loads(r.stdout)["estimate"]
    assert e["step_time_s"] > 0 and 0 < e["mfu"] <= e["hfu"] * 1.05
    assert e["memory_bytes"] > 0 and e["memory_capacity_bytes"] == 1e9 and e["oom"] is False
    # liveness on the graph agrees with XLA's buffer assignment (on this 1 MiB toy, XLA's
    # small per-collective buffers of the vocab-parallel lookup are ~17% of the peak)
    mem = e["memory"]
    assert mem["xla_bytes"] and abs(e["memory_bytes"] / mem["xla_bytes"] - 1) < 0.2
    assert mem["arguments_bytes"]["optimizer_state"] > mem["arguments_bytes"]["parameters"] > 0
    r = run_flint("extract", "--model", "tiny", "--devices", "16", "--estimate", "--set",
                  "hbm_capacity=1KB", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["estimate"]["oom"] is True
    r = run_flint("extract", "--model", "tiny", "--devices", "16", "--estimate", "--set",
                  "hbm_capacity=lots")
    assert r.returncode == 2 and "hbm_capacity" in r.stderr and "Traceback" not in r.stderr


def test_memory_from_buffer_liveness():
    from flint.hardware_models.memory import estimate_memory

    def node(i, out, inputs=()):
        return Node(i, f"n{i}", NodeKind.COMPUTE, "fusion", "elementwise", inputs=list(inputs),
                    outputs=[out])
    g = WorkloadGraph(Cluster(1, (("data", 1),)),
                      [node(0, "f32[25]"), node(1, "f32[10]", [0]), node(2, "f32[5]", [1]),
                       node(3, "f32[40]")])
    g.meta.update(arguments=[["params['w']", 400], ["opt_state.mu['w']", 800],
                             ["batch['x']", 8]], aliased_arguments=[0], output_bytes=420)
    m = estimate_memory(g)
    # n0 (100 B) + n1 (40 B) are alive together; n3 (160 B) runs alone after they are freed
    assert m.temporaries_peak_bytes == 160 and m.peak_node == "n3"
    assert m.arguments_bytes == {"inputs": 8, "optimizer_state": 800, "parameters": 400}
    assert m.unaliased_outputs_bytes == 20 and m.peak_bytes == 1208 + 20 + 160


def _trace_processor_shell():
    import os
    import shutil

    return os.environ.get("FLINT_TRACE_PROCESSOR_SHELL") or shutil.which("trace_processor_shell")


@pytest.mark.skipif(not _trace_processor_shell(),
                    reason="Perfetto's trace_processor_shell binary is not installed (the "
                           "perfetto package downloads it from get.perfetto.dev, which this "
                           "machine cannot reach); set FLINT_TRACE_PROCESSOR_SHELL to run")
def test_predicted_timeline_loads_in_perfetto_trace_processor(spec_path, tmp_path):
    from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig

    from flint.exporters.perfetto import write_timeline

    est = estimate(_toy_graph(True), str(spec_path))
    path = tmp_path / "t.json"
    write_timeline(est.timeline, path)
    tp = TraceProcessor(trace=str(path),
                        config=TraceProcessorConfig(bin_path=_trace_processor_shell()))
    rows = list(tp.query("select name, dur from slice order by ts"))
    tp.close()
    assert sorted(r.name for r in rows) == sorted(n.name for n in est.timeline.graph.nodes)
    assert sum(r.dur for r in rows) == pytest.approx(
        sum(f - s for s, f in zip(est.timeline.start, est.timeline.finish)) * 1e9, rel=1e-3)


def test_nccl_protocols_by_size():
    """Small messages take LL (latency), large ones Simple (bandwidth), as NCCL's tuner does;
    a forced protocol (NCCL_PROTO) is priced as that protocol."""
    from flint.hardware_models import nccl

    h100 = load_spec("h100-sxm")
    net = NetworkModel(h100, Cluster(8, (("data", 8),)))
    comm = communicator("[1,8]<=[8]", 8)

    def ar(size, **kw):
        node = Node(0, "ar", NodeKind.COLLECTIVE, "all-reduce", "collective",
                    collective=Collective("all-reduce", 0, size, size, "bf16"))
        return dataclasses.replace(net, **kw).time(node, comm) if kw else net.time(node, comm)

    bus = 450e9 * 0.8
    # 8 bytes: LL's base 6.6 us + 14 NVLink steps of 0.6 us (+ nothing to move)
    assert ar(8) == pytest.approx(6.6e-6 + 14 * 0.6e-6 + 2 * 7 / 8 * 8 / min(141e9, bus / 2))
    big = 1 << 30
    fill = nccl.PIPELINE_FILL_BYTES
    # the fill is counted on the buffer, as on the NVLS curve it was read off: a ring's
    # bus carries 2(p-1)/p of every buffer byte, so its fill takes that much longer
    assert ar(big, algorithm="ring") == pytest.approx(8.4e-6 + 14 * 3.4e-6
                                                      + 2 * 7 / 8 * (big + fill) / bus)
    # below the fill alike: a 1 MiB ring fills with the whole buffer (bus bytes at bus bw)
    mib = 1 << 20
    assert ar(mib, algorithm="ring", protocol="Simple") == pytest.approx(
        8.4e-6 + 14 * 3.4e-6 + 2 * (2 * 7 / 8 * mib) / bus)
    # LL is a latency protocol (flags in every line, nothing to pipeline): no fill
    assert ar(big, algorithm="ring", protocol="LL") == pytest.approx(
        6.6e-6 + 14 * 0.6e-6 + 2 * 7 / 8 * big / min(141e9, bus / 2))
    # NVLink SHARP on an H100 node: 25 us, then the buffer at NCCL's NVLS efficiency (0.85)
    # of the NVLink bandwidth x (p-1)/p: nccl-tests busBw ~470 GB/s (NVIDIA states ~480)
    nvls_bw = bus * 0.85 * 7 / 8
    nvls = 25e-6 + (big + fill) / nvls_bw
    assert ar(big) == pytest.approx(nvls)
    # below the fill a pipelined protocol's stages run one after the other: twice the
    # bandwidth term (a 4 MiB NVLS all-reduce), the protocol still NCCL's choice
    small = 4 << 20
    assert ar(small, algorithm="nvls") == pytest.approx(25e-6 + 2 * small / nvls_bw)
    assert nccl.collective_time(8.0, 14, bus, "nvlink", "ring", "hopper", 1, True) == \
        pytest.approx(6.6e-6 + 14 * 0.6e-6 + 8.0 / min(141e9, bus / 2))
    assert 460e9 < 2 * 7 / 8 * big / ar(big) < 480e9
    a100 = NetworkModel(load_spec("a100-40gb-sxm"), Cluster(8, (("data", 8),)))
    assert "nvls" not in a100.options(Node(0, "ar", NodeKind.COLLECTIVE, "all-reduce",
                                           "collective", collective=Collective(
                                               "all-reduce", 0, big, big, "bf16")), comm)
    assert nccl.architecture("a100-40gb-sxm") == "ampere"
