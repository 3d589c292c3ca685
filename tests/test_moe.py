"""Mixture of experts: model description, expert parallelism (all-to-all dispatch and
combine), routing skew, grouped GEMMs and the all-to-all network model."""
import json

import pytest

from flint.errors import FlintError
from flint.frontends.jax import capture
from flint.models.decoder import ZOO, param_count
from flint.models.describe import PRESETS, resolve_model
from flint.models.moe import active_matmul_params
from flint.models.train import build
from flint.passes.moe_routing import MoeRouting, expert_shares

TINY_MOE = {"base": "tiny", "layers": 3, "experts": 8, "top_k": 2, "moe_ffn": 64,
            "shared_experts": 1, "first_dense": 1}


@pytest.mark.parametrize("name, total, active", [
    ("mixtral-8x7b", 46.7e9, 12.9e9),      # Mistral AI model card: 46.7B total, 12.9B active
    ("qwen3-30b-a3b", 30.5e9, 3.3e9),      # Qwen3 report: 30.5B total, 3.3B activated
    ("deepseek-v3", 671e9, 37e9),          # DeepSeek-V3 report: 671B total, 37B activated
    ("qwen3-235b-a22b", 235e9, 22e9),
])
def test_presets_match_published_parameter_counts(name, total, active):
    cfg = PRESETS[name]
    embed = cfg.vocab * cfg.d_model
    assert param_count(cfg) == pytest.approx(total, rel=0.01)
    assert active_matmul_params(cfg) + embed == pytest.approx(active, rel=0.03)


def test_hf_moe_configs_are_described(tmp_path):
    deepseek = {"model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432,
                "moe_intermediate_size": 2048, "num_attention_heads": 128,
                "num_key_value_heads": 128, "num_hidden_layers": 61, "n_routed_experts": 256,
                "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 3,
                "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
                "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 129280,
                "max_position_embeddings": 163840, "hidden_act": "silu", "rms_norm_eps": 1e-6}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(deepseek))
    cfg = resolve_model(str(path), {"seq": 4096})
    want = PRESETS["deepseek-v3"]
    assert param_count(cfg) == param_count(want)
    assert active_matmul_params(cfg) == active_matmul_params(want)
    mixtral = {"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336,
               "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32,
               "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 32000,
               "max_position_embeddings": 32768, "hidden_act": "silu"}
    path.write_text(json.dumps(mixtral))
    assert param_count(resolve_model(str(path))) == param_count(PRESETS["mixtral-8x7b"])
    path.write_text(json.dumps({**mixtral, "num_experts_per_tok": None}))
    with pytest.raises(FlintError, match="num_experts_per_tok"):
        resolve_model(str(path))


@pytest.mark.parametrize("bad, match", [
    ({"top_k": 9}, "top_k"), ({"first_dense": 3}, "first_dense"),
    ({"capacity_factor": -1}, "capacity_factor"), ({"experts": 0}, "need experts"),
])
def test_bad_moe_dims_are_refused(bad, match):
    with pytest.raises(FlintError, match=match):
        resolve_model({**TINY_MOE, **bad})


@pytest.fixture(scope="module")
def ep_graph():
    """Tiny MoE on 8 host devices: data 2 x expert 2 x model 2 (ETP = TP)."""
    mesh = (("data", 2), ("expert", 2), ("model", 2))
    w = build(TINY_MOE, mesh, batch_per_replica=2, scan=False)
    step = capture(w.step, devices=8, mesh=dict(mesh), hardware="cpu",
                   in_specs=w.in_specs, out_specs=w.out_specs, donate_argnums=w.donate_argnums)
    return w, step.lower(*w.args).compile().workload()


def test_expert_parallel_all_to_all_bytes_match_closed_form(ep_graph):
    w, graph = ep_graph
    cfg = resolve_model(TINY_MOE)
    a2a = [n for n in graph.collectives() if n.collective.type == "all-to-all"]
    moe_layers = cfg.n_layers - cfg.first_dense
    # dispatch + combine, forward and backward, per MoE layer, over the expert axis only
    assert len(a2a) == 4 * moe_layers
    assert {graph.communicator(n).mesh_axes for n in a2a} == {("expert",)}
    # closed form: tokens per rank x top_k x d_model elements, balanced capacity (bf16 on
    # GPUs; XLA's CPU backend computes bf16 as f32)
    tokens_per_rank = 2 * cfg.seq_len
    size = {"bf16": 2, "f32": 4}
    assert {n.collective.bytes_in // size[n.collective.dtype] for n in a2a} == \
        {tokens_per_rank * 2 * cfg.d_model}
    # expert weights: gradients reduced over the data axis only (EP ranks hold distinct
    # experts); dense weights over data and expert
    axes = {graph.communicator(n).mesh_axes for n in graph.collectives()
            if n.collective.type == "all-reduce"}
    assert ("data",) in axes and ("data", "expert") in axes
    assert w.info["ep"] == 2 and w.info["experts"] == 8


def test_routing_skew_reprices_straggler(ep_graph):
    _, graph = ep_graph
    from flint.hardware_models.estimate import estimate

    base = MoeRouting("balanced", top_k=2).run(graph)
    skew = MoeRouting("imbalance:4", top_k=2).run(graph)
    rb, rs = base.meta["moe_routing"], skew.meta["moe_routing"]
    assert rb["straggler_factor"] == pytest.approx(1.0)
    # one expert at 4x the mean among 4 local experts: (4 + 3 x 4/7) / 4 of a balanced rank
    assert rs["straggler_factor"] == pytest.approx((4 + 3 * 4 / 7) / 4)
    assert rs["all_to_all_straggler_bytes_per_rank"] == pytest.approx(
        rb["all_to_all_balanced_bytes_per_rank"] * rs["straggler_factor"], abs=1)
    grouped = [n for n in skew.nodes if "grouped_gemm" in n.meta]
    assert grouped and all(len(n.meta["grouped_gemm"]) == 4 for n in grouped)
    assert skew.total_flops() > base.total_flops()
    assert estimate(skew).step_time_s > estimate(base).step_time_s
    with pytest.raises(FlintError, match="routing distribution"):
        MoeRouting("pareto:2").run(graph)
    with pytest.raises(FlintError, match="histogram has 3 counts"):
        MoeRouting("histogram:1,2,3").run(graph)


def test_expert_shares():
    assert expert_shares("balanced", 4).tolist() == [0.25] * 4
    z = expert_shares("zipf:1.0", 64, seed=3)
    assert z.sum() == pytest.approx(1.0) and z.max() / z.mean() == pytest.approx(
        64 / sum(1 / r for r in range(1, 65)))
    assert (expert_shares("zipf:1.0", 64, seed=3) == z).all()          # deterministic
    h = expert_shares("histogram:1,1,2,4", 4)
    assert h.tolist() == [0.125, 0.125, 0.25, 0.5]
    with pytest.raises(FlintError):
        expert_shares("imbalance:9", 8)


def test_grouped_gemm_tile_waste():
    from flint.hardware_models.grouped_gemm import grouped_gemm_time
    from flint.hardware_models.kernels import GemmShape, gemm_time

    rate, sms = 800e12, 132
    even = [[512, 4096, 2048]] * 8
    assert grouped_gemm_time(even, rate, sms) == pytest.approx(
        gemm_time(GemmShape(8, 512, 4096, 2048), rate, sms))
    # the same 1024 tokens, balanced (one 128-row tile per expert and column: 128 tiles, one
    # wave on 132 SMs) or ragged (the hot expert's 135 rows take a second row of tiles)
    even = [[128, 4096, 2048]] * 8
    ragged = [[127, 4096, 2048]] * 7 + [[135, 4096, 2048]]
    assert grouped_gemm_time(ragged, rate, sms) >= 1.5 * grouped_gemm_time(even, rate, sms)
    assert grouped_gemm_time([[0, 4096, 2048]] * 8, rate, sms) == 0.0


def test_hierarchical_all_to_all_deduplicates_across_nodes():
    from flint.cluster import Cluster
    from flint.graph import Collective, Communicator, Node, NodeKind
    from flint.hardware_models.network import NetworkModel
    from flint.hardware_models.spec import load_spec

    spec = load_spec("h100-sxm")
    comm = Communicator(0, "groups", "[1,64]<=[64]", 64, 64, 1, ("expert",))
    size = 256 << 20

    def a2a(top_k):
        node = Node(0, "a2a", NodeKind.COLLECTIVE, "all-to-all", "collective",
                    collective=Collective("all-to-all", 0, size, size, "bf16"),
                    meta={"moe_top_k": top_k} if top_k else {})
        return NetworkModel(spec, Cluster(64, (("expert", 64),))).time(node, comm)

    assert a2a(8) < a2a(0)          # 8 picks over 8 nodes: ~5.25 distinct remote nodes of 7


def test_torch_twin_expert_parallel_all_to_all():
    import flint.torch as ft

    graph = ft.zoo(TINY_MOE, world_size=8, mesh={"data": 2, "expert": 4}, batch_per_replica=2)
    cfg = resolve_model(TINY_MOE)
    a2a = [n for n in graph.collectives() if n.collective.type == "all-to-all"]
    assert len(a2a) == 4 * (cfg.n_layers - cfg.first_dense)
    assert {graph.communicator(n).mesh_axes for n in a2a} == {("expert",)}
    assert {n.collective.bytes_in for n in a2a} == {2 * cfg.seq_len * 2 * cfg.d_model * 2}
    reduced = {graph.communicator(n).mesh_axes for n in graph.collectives()
               if n.collective.type == "all-reduce"}
    assert reduced == {("data",), ("expert",)}       # dense gradients over both, experts' data
    with pytest.raises(FlintError, match="data x expert"):
        ft.zoo(TINY_MOE, world_size=8, mesh={"expert": 4, "model": 2})


def test_sweep_ep_axis_builds_expert_meshes():
    from flint.sweep_space import SearchSpace

    points, skipped = SearchSpace.from_dict({"model": "qwen3-30b-a3b", "seq_len": 4096,
                                             "devices": [8], "ep": [1, 8],
                                             "tp": [1, 2]}).expand()
    meshes = {p.run.mesh() for p in points}
    assert (("expert", 8),) in meshes and (("data", 8),) in meshes
    assert [s["reason"] for s in skipped] == [
        "ep: 8 expert-parallel ranks do not divide the 4 data-parallel ranks (EP is carved "
        "out of data parallelism)"]
    _, skipped = SearchSpace.from_dict({"model": "llama3-8b", "seq_len": 4096,
                                        "devices": 8, "ep": [2]}).expand()
    assert "has no experts" in skipped[0]["reason"]


def test_cli_estimate_routing(ep_graph, tmp_path):
    from tests.conftest import run_flint

    _, graph = ep_graph
    path = tmp_path / "moe.json"
    graph.save(path)
    out = run_flint("estimate", str(path), "--routing", "imbalance:4", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)["moe_routing"]
    assert report["straggler_factor"] == pytest.approx((4 + 3 * 4 / 7) / 4)
    bad = run_flint("estimate", str(path), "--routing", "pareto:2")
    assert bad.returncode == 2 and "routing distribution" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


def test_hierarchical_all_to_all_prices_the_hottest_node_on_the_network():
    """DeepEP sends a node's remote tokens through all of its NICs: under skew the network
    part follows the hottest node's mean load, NVLink the hottest rank's."""
    from flint.cluster import Cluster
    from flint.graph import Collective, Communicator, Node, NodeKind
    from flint.hardware_models.network import NetworkModel, domain_skew
    from flint.hardware_models.spec import load_spec

    spec = load_spec("h100-sxm")
    comm = Communicator(0, "groups", "[1,64]<=[64]", 64, 64, 1, ("expert",))
    model = NetworkModel(spec, Cluster(64, (("expert", 64),)), algorithm="hierarchical")
    size = 256 << 20
    lone = [8.0] + [56 / 63] * 63                  # one hot rank among cold ones
    crowd = [8.0] * 8 + [0.0] * 56                 # a whole hot node

    def a2a(load):
        meta = {"moe_all_to_all": {"balanced_bytes": size, "into_experts": True,
                                   "rank_load": load}} if load else {}
        node = Node(0, "a2a", NodeKind.COLLECTIVE, "all-to-all", "collective",
                    collective=Collective("all-to-all", 0, 8 * size, 8 * size, "bf16"),
                    meta=meta)
        return node, model.time(node, comm)

    assert domain_skew(a2a(lone)[0], 8) == pytest.approx((8 + 7 * 56 / 63) / 8 / 8)
    assert domain_skew(a2a(crowd)[0], 8) == 1.0
    assert a2a(lone)[1] < 0.5 * a2a(crowd)[1]
    assert a2a(crowd)[1] == pytest.approx(a2a(None)[1])


def test_mla_attention_runs_its_own_value_head_dim():
    """Multi-head latent attention contracts scores over 192 dims and values over 128 in
    DeepSeek-V3; the fused kernel runs them unpadded (FlashAttention-3, cuDNN) and its
    node is priced so."""
    from flint.passes.attention import attention_cost

    mla = {**TINY_MOE, "q_lora": 32, "kv_lora": 32, "rope_dim": 16, "head_dim": 32,
           "v_head_dim": 24}
    mesh = (("data", 2),)
    w = build(mla, mesh, batch_per_replica=2, scan=False)
    step = capture(w.step, devices=2, mesh=dict(mesh), hardware="cpu",
                   in_specs=w.in_specs, out_specs=w.out_specs, donate_argnums=w.donate_argnums)
    graph = step.lower(*w.args).compile().workload()
    nodes = [n for n in graph.nodes if n.op_class == "attention"]
    assert len(nodes) == 2 * resolve_model(mla).n_layers          # forward and backward
    for n in nodes:
        a = n.meta["attention"]
        assert (a["head_dim"], a["v_head_dim"]) == (48, 24)
        want = attention_cost(a["batch"], a["heads"], a["kv_heads"], a["seq_q"], a["seq_kv"],
                              48, True, a["backward"], dv=24)[0]
        assert n.flops == want
    # equal dims: the familiar 4*B*H*S^2*D (causal half) and 2.5x for the backward
    assert attention_cost(1, 2, 2, 8, 8, 16, True, False)[0] == 4 * 2 * 64 * 16 / 2
    assert attention_cost(1, 2, 2, 8, 8, 16, True, True)[0] == 2.5 * 4 * 2 * 64 * 16 / 2


def test_context_parallel_moe_routes_each_ranks_sequence_chunk(tmp_path):
    """CP x EP: each context rank dispatches its own half of the sequence among its EP
    group; the experts' gradients are summed over the context axis."""
    from flint.graph import WorkloadGraph
    from tests.conftest import run_flint

    model = tmp_path / "moe.yaml"
    model.write_text(json.dumps(TINY_MOE))
    out = tmp_path / "cp.json"
    r = run_flint("extract", "--model", str(model), "--devices", "8", "--mesh",
                  "context=2,expert=4", "--unroll", "--batch-per-replica", "2", "--out", str(out))
    assert r.returncode == 0, r.stderr
    graph, cfg = WorkloadGraph.load(out), resolve_model(TINY_MOE)
    a2a = [n for n in graph.collectives() if n.collective.type == "all-to-all"]
    assert len(a2a) == 4 * (cfg.n_layers - cfg.first_dense)
    # batch per EP rank x its half of the sequence x top_k copies x d_model x bf16
    assert {n.collective.bytes_in for n in a2a} == {2 * cfg.seq_len // 2 * 2 * cfg.d_model * 2}
    assert {graph.communicator(n).mesh_axes for n in a2a} == {("expert",)}
    reduced = {graph.communicator(n).mesh_axes for n in graph.collectives()
               if n.collective.type in ("all-reduce", "reduce-scatter")}
    assert ("context",) in reduced and ("context", "expert") in reduced
