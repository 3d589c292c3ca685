"""The anonymize pass (passes/anonymize.py) and `flint anonymize`."""
import json
import math
from pathlib import Path

import pytest

from flint.cluster import Cluster
from flint.errors import FlintError
from flint.frontends.jax import capture
from flint.graph import (Loop, Node, NodeKind, WorkloadGraph, collective_size_bytes,
                         dumps_json)
from flint.hardware_models.estimate import estimate
from flint.hardware_models.memory import argument_category
from flint.hlo.shapes import parse_shape
from flint.models.train import build
from flint.passes import parse_pipeline
from flint.passes.anonymize import Anonymize
from flint.passes.pipeline_stages import layer_index
from flint.passes.place import place

from conftest import run_flint

HW = "h100-sxm"
MODEL = "tiny-decoder-secret"


@pytest.fixture(scope="module")
def graph():
    """A real step with collectives and a scanned layer loop: the zoo's tiny decoder on
    fsdp=2 x model=4, sequence length 96 (so that not every dim is a power of two)."""
    mesh = (("fsdp", 2), ("model", 4))
    w = build("tiny", mesh, scan=True, layers=2, seq_len=96)
    step = capture(w.step, devices=8, mesh=dict(mesh), hardware=HW, in_specs=w.in_specs,
                   out_specs=w.out_specs, donate_argnums=w.donate_argnums)
    g = step.workload(*w.args)
    g.meta.update(model=MODEL, model_flops_per_device=w.info["model_flops"] / 8)
    return g


@pytest.fixture(scope="module")
def anon(graph):
    return Anonymize().run(graph)


@pytest.fixture(scope="module")
def saved(graph, tmp_path_factory):
    path = tmp_path_factory.mktemp("anon") / "src.json"
    graph.save(path)
    return path


def _secrets(g: WorkloadGraph) -> set[str]:
    """Names, scopes, layer paths, source files and model strings of a graph, less the op
    vocabulary that is kept on purpose (XLA names an instruction `copy` or `fusion`)."""
    ops = {n.op for n in g.nodes}
    out = {n.name for n in g.nodes} | {lp.name for lp in g.loops}
    for n in g.nodes:
        for key in ("op_name", "scope", "source", "layer", "wrapped_name", "fused_collective"):
            v = n.meta.get(key)
            if isinstance(v, str) and v not in ("", "optimizer"):
                out.add(v)
                if key == "source":
                    out.add(Path(v.split(":")[0]).name)      # decoder.py
    out |= {v for v in g.meta.values() if isinstance(v, str)}
    out |= {name for name, _ in g.meta["arguments"]}
    return out - ops


def test_no_name_path_or_source_survives(graph, anon):
    secrets = _secrets(graph)
    assert MODEL in secrets and any(s.endswith(".py") for s in secrets)
    assert any("jit(" in s for s in secrets)
    text = dumps_json(anon.to_json())
    leaks = sorted(s for s in secrets if json.dumps(s) in text or
                   (len(s) > 3 and not s.isalpha() and s in text))
    assert not leaks, leaks[:10]
    assert MODEL not in text and ".py" not in text and "jit(" not in text
    assert all(n.name == f"{n.op}#{n.id}" for n in anon.nodes)


def test_structure_and_estimate_are_kept_exactly(graph, anon):
    before = dumps_json(graph.to_json())
    again = Anonymize().run(graph)
    assert dumps_json(graph.to_json()) == before                 # the input is not modified
    assert dumps_json(again.to_json()) == dumps_json(anon.to_json())
    for a, b in zip(graph.nodes, anon.nodes, strict=True):
        assert (a.kind, a.op, a.op_class, a.inputs, a.control, a.repeat, a.outputs,
                a.operands, a.collective) == (b.kind, b.op, b.op_class, b.inputs, b.control,
                                              b.repeat, b.outputs, b.operands, b.collective)
        assert (a.flops, a.transcendentals, a.bytes_read, a.bytes_written) == \
            (b.flops, b.transcendentals, b.bytes_read, b.bytes_written)
        assert layer_index(a.meta.get("layer")) == layer_index(b.meta.get("layer"))
        assert a.meta.get("phase") == b.meta.get("phase")
    # one new label per old one: the groups the pipeline and placement passes form survive
    pairs = {(a.meta.get("layer") or None, b.meta.get("layer"))
             for a, b in zip(graph.nodes, anon.nodes)}
    assert len({p[0] for p in pairs}) == len({p[1] for p in pairs}) == len(pairs)
    assert anon.communicators == graph.communicators and anon.cluster == graph.cluster
    assert [(lp.trip_count, lp.first, lp.last, lp.carried) for lp in anon.loops] == \
        [(lp.trip_count, lp.first, lp.last, lp.carried) for lp in graph.loops]
    assert [argument_category(n) for n, _ in anon.meta["arguments"]] == \
        [argument_category(n) for n, _ in graph.meta["arguments"]]
    e0, e1 = estimate(graph, HW), estimate(anon, HW)
    assert e1.step_time_s == e0.step_time_s                      # exact, so within 1 % too
    assert abs(e1.step_time_s / e0.step_time_s - 1) < 0.01
    assert (e1.memory_bytes, e1.mfu, e1.compute_busy_s, e1.collectives_s) == \
        (e0.memory_bytes, e0.mfu, e0.compute_busy_s, e0.collectives_s)
    assert sorted(e1.by_layer_s.values()) == sorted(e0.by_layer_s.values())


def test_placement_and_pipelines_see_the_same_graph(graph, anon):
    """What the kept meta is for: placement groups and pipeline stages come out the same,
    and an MPMD (pipelined) graph keeps its estimate through anonymizing."""
    assert place(anon, "m-sct", 4, 0, HW).device_of == place(graph, "m-sct", 4, 0, HW).device_of
    piped = parse_pipeline("pipeline{stages=2,microbatches=4,split=time}")[0].run(graph)
    e0, e1 = estimate(piped, HW), estimate(Anonymize().run(piped), HW)
    assert (e1.step_time_s, e1.memory_bytes, e1.pipeline) == \
        (e0.step_time_s, e0.memory_bytes, e0.pipeline)


def test_labels_iterations_arguments_and_free_text_ops():
    """Layer labels keep their index and identity, loop names go from iteration tags,
    argument names keep their category and layer, unknown meta is dropped."""
    layers = ["Net/dec/layers_3/mlp", "Net/enc/layers_3", "head", "optimizer", "head"]
    nodes = [Node(i, f"secret_{i}", NodeKind.COMPUTE, "fusion", "elementwise",
                  inputs=[i - 1] if i else [], outputs=["f32[4]"],
                  meta={"layer": lab, "phase": "forward", "iteration": "while.5:2/while.9:0",
                        "my_new_key": "Net/dec", "device": 1})
             for i, lab in enumerate(layers)]
    nodes.append(Node(5, "Net/fc1", NodeKind.COMPUTE, "Net/fc1", "gemm", inputs=[4]))
    args = [["params['layers']['layer_3']['w']", 8], ["opt_state.mu['layer_3']['w']", 8],
            ["batch['tokens']", 4], ["rng_key", 2]]
    g = WorkloadGraph(Cluster(1, (("data", 1),)), nodes, [],
                      [Loop(0, "while.9", 2, None, 1, 2)], {"arguments": args, "file": "x"})
    a = Anonymize().run(g)
    assert [n.meta.get("layer") for n in a.nodes[:5]] == \
        ["layer_3", "layer_3/1", "scope0", "optimizer", "scope0"]
    assert a.nodes[0].meta == {"layer": "layer_3", "phase": "forward", "device": 1,
                               "iteration": "loop1:2/loop0:0"}
    assert a.loops[0].name == "loop0"
    assert (a.nodes[5].op, a.nodes[5].name) == ("gemm", "gemm#5")  # free text is a name
    assert [n for n, _ in a.meta["arguments"]] == \
        ["parameters/layer_3", "optimizer_state/layer_3", "inputs", "other_arguments"]
    assert [argument_category(n) for n, _ in args] == \
        [argument_category(n) for n, _ in a.meta["arguments"]]
    assert "file" not in a.meta and "Net" not in dumps_json(a.to_json())


def _dims(g: WorkloadGraph):
    for n in g.nodes:
        for s in n.outputs + n.operands:
            for leaf in parse_shape(s).leaves():
                yield leaf


def test_perturbed_shapes_stay_consistent_and_the_estimate_within_its_bound(graph):
    p = 0.1
    pert = parse_pipeline(f"anonymize{{perturb={p},seed=7}}")[0].run(graph)
    mapping: dict[int, set[int]] = {}
    for x, y in zip(_dims(graph), _dims(pert), strict=True):
        assert x.dtype == y.dtype and len(x.dims) == len(y.dims)
        for d, e in zip(x.dims, y.dims):
            mapping.setdefault(d, set()).add(e)
    assert all(len(v) == 1 for v in mapping.values())          # equal dims stay equal
    new = {d: v.pop() for d, v in mapping.items()}
    assert new.get(1, 1) == 1
    assert all(abs(e / d - 1) <= p + 1e-12 for d, e in new.items() if d)
    assert sum(e != d for d, e in new.items()) >= 3              # shapes did change
    ratios = [1.0]
    for a, b in zip(graph.nodes, pert.nodes):
        if a.flops:
            ratios.append(b.flops / a.flops)
        if a.bytes_read + a.bytes_written:
            ratios.append((b.bytes_read + b.bytes_written) / (a.bytes_read + a.bytes_written))
        if a.collective is not None:
            ca, cb = a.collective, b.collective
            ratios.append(collective_size_bytes(b) / collective_size_bytes(a))
            # a gathered result stays group-size times the shard
            assert cb.bytes_out * ca.bytes_in == pytest.approx(ca.bytes_out * cb.bytes_in)
    # Node times are affine in work and bytes and the step is max-plus in node times
    # (passes/anonymize.py), so the step moves by no more than the extreme node ratios.
    lo, hi = min(ratios), max(ratios)
    assert (1 - p) ** 5 <= lo and hi <= (1 + p) ** 5
    t0, t1 = estimate(graph, HW).step_time_s, estimate(pert, HW).step_time_s
    assert lo * (1 - 1e-9) <= t1 / t0 <= hi * (1 + 1e-9), (lo, t1 / t0, hi)
    assert t1 != t0


def test_same_seed_same_bytes_other_seed_other_shapes(graph, tmp_path):
    paths = [tmp_path / f"{i}.json" for i in range(3)]
    for path, seed in zip(paths, (3, 3, 4)):
        Anonymize(perturb=0.05, seed=seed).run(graph).save(path)
    assert paths[0].read_bytes() == paths[1].read_bytes()
    assert paths[0].read_bytes() != paths[2].read_bytes()


@pytest.mark.parametrize("bad", [0.5, -0.01, math.nan, 1.0])
def test_rejects_perturb_outside_zero_to_half(bad):
    with pytest.raises(FlintError, match="perturb"):
        Anonymize(perturb=bad)
    with pytest.raises(FlintError, match="perturb"):
        parse_pipeline(f"anonymize{{perturb={bad}}}")


def test_cli_writes_the_anonymized_graph_and_reports_both_estimates(graph, saved, tmp_path):
    out = tmp_path / "anon.json"
    r = run_flint("anonymize", str(saved), "--out", str(out), "--perturb", "0.05",
                  "--seed", "2", "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    expect = Anonymize(perturb=0.05, seed=2).run(WorkloadGraph.load(saved))
    assert out.read_text() == dumps_json(expect.to_json())       # same bytes across processes
    steps = report["step_time_s"]
    assert steps["original"] == estimate(graph, HW).step_time_s
    assert steps["anonymized"] == estimate(expect, HW).step_time_s
    assert report["step_time_difference"] == pytest.approx(
        steps["anonymized"] / steps["original"] - 1)
    assert report["nodes"] == report["names_replaced"] - len(graph.loops) == len(graph.nodes)
    assert "model" in report["graph_meta_keys_dropped"]
    assert 0 < report["largest_dim_change"] <= 0.05


@pytest.mark.parametrize("case", ["missing", "corrupt", "not-a-graph", "perturb-range",
                                  "perturb-text", "no-out-dir", "same-file"])
def test_cli_bad_input_is_one_line_and_exit_2(case, saved, tmp_path):
    src, out, extra = str(saved), tmp_path / "out.json", []
    if case == "missing":
        src = str(tmp_path / "nope.json")
    elif case in ("corrupt", "not-a-graph"):
        src = tmp_path / "bad.json"
        src.write_text('{"nodes": [' if case == "corrupt" else '{"format": "other"}')
    elif case.startswith("perturb"):
        extra = ["--perturb", "0.7" if case == "perturb-range" else "five"]
    elif case == "no-out-dir":
        out = tmp_path / "missing" / "out.json"
    else:
        out = saved
    before = saved.read_bytes()
    r = run_flint("anonymize", str(src), "--out", str(out), *extra)
    assert r.returncode == 2, (case, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("flint: error:"), lines
    assert "Traceback" not in r.stderr
    assert saved.read_bytes() == before
    assert case == "same-file" or not out.exists()
    assert not list(tmp_path.glob("**/.*.tmp"))
