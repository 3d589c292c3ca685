"""Graph passes: pipeline strings and loop expansion."""
import networkx as nx
import pytest

from flint.errors import FlintError
from flint.frontends.jax import capture
from flint.models.train import build
from flint.passes import parse_pipeline, run_pipeline
from flint.passes.expand_loops import ExpandLoops


def _graph(scan):
    mesh = (("fsdp", 2), ("model", 4))
    w = build("gpt2-small", mesh, scan=scan, layers=3, seq_len=128)
    step = capture(w.step, devices=8, mesh=dict(mesh), hardware="h100-sxm",
                   in_specs=w.in_specs, out_specs=w.out_specs, donate_argnums=w.donate_argnums)
    return step.workload(*w.args)


@pytest.fixture(scope="module")
def scanned():
    return _graph(True)


def test_pipeline_parsing():
    (p,) = parse_pipeline("expand-loops{max_nodes=10}")
    assert isinstance(p, ExpandLoops) and p.max_nodes == 10
    for bad, msg in [("nope", "unknown pass"), ("expand-loops{zzz=1}", "no option"),
                     ("expand-loops{max_nodes=x}", "bad value")]:
        with pytest.raises(FlintError, match=msg):
            parse_pipeline(bad)


def test_expand_loops_preserves_totals_and_orders_iterations(scanned):
    dumps = []
    flat = run_pipeline(scanned, parse_pipeline("expand-loops"),
                        callback=lambda p, g: dumps.append((p.name, g.as_text())))
    assert dumps and dumps[0][0] == "expand-loops" and dumps[0][1].startswith("# workload")
    assert flat.loops == [] and all(n.repeat == 1 for n in flat.nodes)
    assert len(flat.nodes) == sum(n.repeat for n in scanned.nodes)
    assert flat.total_flops() == pytest.approx(scanned.total_flops())
    assert flat.summary()["collectives_by_type"] == scanned.summary()["collectives_by_type"]
    flat.check()
    g = flat.to_networkx()
    assert nx.is_directed_acyclic_graph(g)
    # loop state flows: the first GEMM of each forward iteration depends (transitively) on
    # the previous iteration's GEMMs
    fwd_loop = next(lp for lp in scanned.loops if lp.trip_count == 3)
    tags = [f"{fwd_loop.name}:{i}" for i in range(3)]
    gemms = {t: [n.id for n in flat.nodes if n.meta.get("iteration") == t and
                 n.op_class == "gemm"] for t in tags}
    assert all(gemms.values())
    assert nx.has_path(g, gemms[tags[0]][-1], gemms[tags[1]][0])
    assert nx.has_path(g, gemms[tags[1]][-1], gemms[tags[2]][0])


def test_expanded_scan_resembles_unrolled_twin(scanned):
    flat = ExpandLoops().run(scanned)
    unrolled = _graph(False)
    assert flat.total_flops() == pytest.approx(unrolled.total_flops(), rel=0.01)
    gemm = lambda g: sum(1 for n in g.nodes if n.op_class == "gemm")  # noqa: E731
    assert gemm(flat) == gemm(unrolled)


def test_expand_loops_refuses_blow_up(scanned):
    with pytest.raises(FlintError, match="expanding loops would make"):
        ExpandLoops(max_nodes=10).run(scanned)
