"""Metamorphic relations over `flint estimate` (hardware_models.estimate on a saved graph):
an extracted stage program, layer-templated graphs (dense and MoE) and pipelined ones (the
zoo's tiny and a 6-layer Llama-3-8B),
each saved as `flint extract --out` writes it and read back as `flint estimate` reads it.

The graphs come from the engine's own compiled programs (tests/metamorphic_cases.py), so
no example compiles anything: hypothesis varies specs, what-ifs, rank orders and names."""
from __future__ import annotations

import copy
import json
import random
from pathlib import Path

import pytest
import yaml
from hypothesis import given, strategies as st

from conftest import run_cli
from metamorphic_cases import (FEW, LLAMA6, METAMORPHIC, QWEN_MOE, SLACK_SHIFT, binds, factors,
                               faster, resources)

from flint.errors import FlintError
from flint.frontends.saved import load_graph
from flint.graph import WorkloadGraph
from flint.hardware_models.estimate import estimate
from flint.hardware_models.spec import SPECS_DIR, load_spec, spec_names
from flint.run import TrainingRun
from flint.what_if_effects import what_if_effects

KINDS = ("extracted", "templated", "pipelined", "preset", "moe")


@pytest.fixture(scope="module")
def graphs(tmp_path_factory) -> dict[str, Path]:
    """Each kind of graph saved to a file, as `flint extract --out` leaves it."""
    from flint import engine

    out = tmp_path_factory.mktemp("metamorphic-graphs")
    store = engine._cache(None)
    tiny = TrainingRun(model="tiny", seq_len=64, devices=16, tp=2, pp=2, global_batch=16)
    moe = TrainingRun(model=QWEN_MOE, devices=16, ep=4, global_batch=32, routing="zipf:1.2")
    llama = TrainingRun(model=LLAMA6, devices=16, tp=4, pp=2, global_batch=16)
    made = {"extracted": store.get(engine.stage_program(tiny))[0],
            "templated": engine.layered_graph(tiny.replace(pp=1), store)[0],
            "pipelined": engine._pipelined(tiny, store, [], None, tiny.microbatches)[0],
            "preset": engine._pipelined(llama, store, [], None, llama.microbatches)[0],
            "moe": engine.layered_graph(moe, store)[0]}
    paths = {}
    for kind, graph in made.items():
        paths[kind] = out / f"{kind}.json"
        graph.save(paths[kind])
    return paths


_LOADED: dict = {}


def _graph(graphs, kind: str) -> WorkloadGraph:
    if kind not in _LOADED:
        _LOADED[kind] = load_graph(graphs[kind])
    return _LOADED[kind]


def _step(graph, hardware="h100-sxm", what_if=()) -> float:
    return estimate(graph, hardware, list(what_if)).step_time_s


kinds = st.sampled_from(KINDS)


@METAMORPHIC
@given(kind=kinds, resource=resources, factor=factors,
       hardware=st.sampled_from(("h100-sxm", "b200", "gb200-nvl72")))
def test_a_faster_resource_never_slows_a_saved_graph(graphs, kind, resource, factor,
                                                     hardware):
    g = _graph(graphs, kind)
    stated = [faster(hardware, resource, 1.0)] if resource.endswith("latency") else []
    try:
        base = estimate(g, hardware, stated)
    except FlintError:
        return                  # this spec cannot lay out the cluster (nodes of 4 GPUs)
    what_if = faster(hardware, resource, factor)
    fast = estimate(g, hardware, [what_if])
    assert fast.step_time_s <= base.step_time_s * (1 + SLACK_SHIFT), (kind, resource)
    assert fast.memory_bytes == base.memory_bytes
    (effect,) = what_if_effects(g, hardware, [what_if])
    if factor >= 2 and binds(base, resource, effect):
        assert fast.step_time_s < base.step_time_s * 0.99, (kind, resource)


def _priced_figures(spec, devices: int) -> dict:
    """Every figure a step of `devices` reads (the capacity only decides the memory
    verdict, the name and sources are labels; a node's size does not bind a graph that
    one node holds)."""
    skip = {"name", "model", "sources", "hbm_capacity", "compile_target"}
    if min(spec.devices_per_node, spec.scale_up_domain) >= devices:
        skip |= {"devices_per_node", "scale_up_domain"}
    return {k: v for k, v in spec.__dict__.items() if k not in skip}


@FEW
@given(kind=kinds)
def test_another_spec_changes_the_step_unless_its_figures_are_the_same(graphs, kind):
    g = _graph(graphs, kind)
    steps = {}
    for name in spec_names():
        try:
            steps[name] = _step(g, name)
        except FlintError:          # a spec that cannot lay out this cluster (TPU slices)
            continue
    assert {"h100-sxm", "h200", "b200", "a100-80gb-sxm"} <= set(steps)
    names = sorted(steps)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            if steps[a] == steps[b]:
                devices = g.cluster.devices
                assert (_priced_figures(load_spec(a), devices)
                        == _priced_figures(load_spec(b), devices)), (a, b)


spec_labels = st.sampled_from(("my-cluster", "a100-lookalike", "b200-renamed", "x", "tpu-v9"))


@FEW
@given(kind=kinds, spec=st.sampled_from(("h100-sxm", "b200", "a100-80gb-sxm")),
       label=spec_labels)
def test_a_renamed_copy_of_a_spec_prices_the_same(graphs, tmp_path_factory, kind, spec,
                                                   label):
    """A spec's name (and its file's) is a label: a copy under another one prices the same."""
    doc = yaml.safe_load((SPECS_DIR / f"{spec}.yaml").read_text())
    doc["name"] = label
    path = tmp_path_factory.mktemp("spec") / f"{label}.yaml"
    path.write_text(yaml.safe_dump(doc))
    g = _graph(graphs, kind)
    assert _step(g, str(path)) == _step(g, spec)


def _renamed(doc: dict) -> dict:
    """Every node named after its id (the template a layered graph carries too)."""
    doc = copy.deepcopy(doc)
    for node in doc["nodes"]:
        node["name"] = f"op{node['id']}"
    template = (doc.get("meta", {}).get("layer_template") or {}).get("template")
    if template is not None:
        doc["meta"]["layer_template"]["template"] = _renamed(template)
    return doc


def _reordered(doc: dict, seed: int, per_node: int = 8) -> dict:
    """The same cluster with its ranks relabelled: nodes shuffled, ranks shuffled inside
    each node, and every communicator's groups (and the ranks in each) listed in another
    order. Which rank is which GPU is a label; what a group spans is not."""
    from flint.hlo.replica_groups import parse_replica_groups

    rng = random.Random(seed)
    doc = copy.deepcopy(doc)
    for comm in doc["communicators"]:
        n = comm["num_devices"]
        block = min(per_node, n)
        nodes = list(range(n // block))
        rng.shuffle(nodes)
        perm = []
        for node in nodes:
            local = list(range(block))
            rng.shuffle(local)
            perm += [node * block + r for r in local]
        groups = [[perm[r] for r in g] for g in parse_replica_groups(comm["spec"], n).tolist()]
        if comm["kind"] != "pairs":         # a pair is source -> target: its order stays
            for g in groups:
                rng.shuffle(g)
        rng.shuffle(groups)
        comm["spec"] = "{" + ",".join("{" + ",".join(map(str, g)) + "}" for g in groups) + "}"
    template = (doc.get("meta", {}).get("layer_template") or {}).get("template")
    if template is not None:
        doc["meta"]["layer_template"]["template"] = _reordered(template, seed, per_node)
    return doc


@METAMORPHIC
@given(kind=kinds, seed=st.integers(0, 2**16),
       hardware=st.sampled_from(("h100-sxm", "b200", "gb200-nvl72")))
def test_rank_order_and_node_names_never_change_a_result(graphs, kind, seed, hardware):
    g = _graph(graphs, kind)
    doc = g.to_json()
    try:
        base = estimate(g, hardware)
    except FlintError:
        return                  # this spec cannot lay out the cluster (nodes of 4 GPUs)
    for changed in (_renamed(doc), _reordered(doc, seed)):
        other = estimate(WorkloadGraph.from_json(changed), hardware)
        assert other.step_time_s == base.step_time_s, kind
        assert other.memory_bytes == base.memory_bytes
        assert other.by_class_s == base.by_class_s


@FEW
@given(kind=kinds, resource=resources, factor=factors)
def test_cli_and_library_estimate_the_same_number(graphs, kind, resource, factor):
    what_if = faster("b200", resource, factor)
    code, out, err = run_cli(["estimate", graphs[kind], "--hardware", "b200", "--set",
                              what_if, "--json"])
    assert code == 0, err
    cli = json.loads(out)
    lib = estimate(_graph(graphs, kind), "b200", [what_if])
    assert cli["step_time_s"] == lib.step_time_s
    assert cli["mfu"] == lib.mfu and cli["hfu"] == lib.hfu
    (effect,) = cli["what_if_effects"]
    assert effect["what_if"] == what_if and effect["effect"] in ("applied", "none")


@METAMORPHIC
@given(kind=kinds, hardware=st.sampled_from(("h100-sxm", "b200", "a100-80gb-sxm")))
def test_saved_graphs_add_up_and_stay_under_the_peak(graphs, kind, hardware):
    """Per-class time adds up to the busy time of the streams it splits; MFU and HFU
    stay under one; the save/load round trip prices the same."""
    g = _graph(graphs, kind)
    e = estimate(g, hardware)
    assert sum(e.by_class_s.values()) == pytest.approx(
        e.compute_busy_s + e.communication_busy_s, rel=1e-9)
    assert 0 < e.hfu <= 1 and (e.mfu is None or 0 < e.mfu <= 1)
    again = WorkloadGraph.from_json(json.loads(json.dumps(g.to_json())))
    assert estimate(again, hardware).step_time_s == e.step_time_s
