"""What the zoo workloads must look like to a cost model: one fused attention call per
layer and phase whatever XLA's schedule (GQA, selective remat), and per-microbatch work
repeated for every microbatch while only gradient sums run once per step."""
import pytest

from flint.models.describe import resolve_model, to_mapping


def _program(**over):
    dims = resolve_model("tiny").with_(n_layers=2, d_model=512, n_heads=8, n_kv_heads=2,
                                       d_ff=1024, vocab=1024, seq_len=512)
    return {"framework": "jax", "model": to_mapping(dims), "devices": 2,
            "mesh": [["data", 2]], "batch_per_replica": 1, "remat": "selective",
            "sequence_parallel": False, "scan": True, "seq_len": 512, "layers": 2,
            "hardware": "h100-sxm", **over}


@pytest.fixture(scope="module")
def fp8_graph():
    from flint.template_cache import extract_program

    return extract_program(_program(gemm_precision="fp8"))


def test_gqa_attention_collapses_under_selective_remat(fp8_graph):
    # XLA schedules a consumer of the backward core before one of its inputs; the call
    # still becomes one node (the pass reorders around it instead of giving up)
    g = fp8_graph
    assert g.meta.get("attention_uncollapsed") is None
    attn = [n for n in g.nodes if n.op_class == "attention"]
    assert sorted(n.meta["attention"]["backward"] for n in attn) == [False, True]
    assert all(n.meta["attention"]["kv_heads"] == 2 and n.repeat == 2 for n in attn)
    g.check()


def test_only_gradient_sums_run_once_per_step(fp8_graph):
    # FP8 current scaling all-reduces each activation gradient's amax over the data axis
    # (a max): per-microbatch work, not the gradient reduction
    from flint.passes.expand_loops import ExpandLoops
    from flint.passes.pipeline import PipelineParallel

    g = ExpandLoops().run(fp8_graph)
    maxes = [n for n in g.nodes if n.collective is not None
             and n.collective.reduction == "maximum"]
    assert maxes, "the FP8 workload should reduce amax over the data axis"
    piped = PipelineParallel(1, 3).run(g)
    gemm = lambda graph: sum(n.flops for n in graph.nodes if n.op_class in  # noqa: E731
                             ("gemm", "attention"))
    assert gemm(piped) == pytest.approx(3 * gemm(g), rel=1e-9)
    once = [n for n in piped.nodes if n.meta.get("task") == "R" and n.collective is not None]
    assert once and all(n.collective.reduction == "add" for n in once)


def test_collapse_reorders_around_an_interleaved_schedule():
    # XLA's order: core dot A, a consumer of A outside the call, an input the call's
    # second dot B needs, then B. No single slot in that order takes the fused kernel;
    # moving the consumer after it (and the late input before it) does.
    from flint.cluster import Cluster
    from flint.graph import Node, NodeKind, WorkloadGraph
    from flint.passes.attention import CollapseAttention, scope_name

    scope = "jit(step)/attn/" + scope_name("bwd", 1, 4, 2, 128, 128, 64, True)
    nodes = []

    def add(name, inputs, op_name="", op_class="elementwise"):
        nodes.append(Node(len(nodes), name, NodeKind.COMPUTE, "fusion", op_class,
                          list(inputs), flops=1.0, outputs=["bf16[8]"],
                          meta={"op_name": op_name, "phase": "backward"}))
        return len(nodes) - 1

    q = add("q", [])
    a = add("core_a", [q], scope, "gemm")
    use = add("use_of_a", [a])
    late = add("late_input", [q])
    b = add("core_b", [a, late], scope, "gemm")
    add("after", [use, b])
    g = WorkloadGraph(Cluster(2, (("data", 2),), "h100-sxm"), nodes, [], [], {})
    out = CollapseAttention().run(g)
    assert out.meta["attention_calls"] == 1 and "attention_uncollapsed" not in out.meta
    names = [n.name for n in out.nodes]
    attn = next(n for n in out.nodes if n.op_class == "attention")
    assert names.index("late_input") < attn.id < names.index("use_of_a")
    assert attn.meta["attention"]["backward"] and len(out.nodes) == 5


def test_context_parallel_activation_gradients_stay_per_microbatch():
    # dK/dV are summed over the context axis (a DP-like axis) in every microbatch's
    # backward; only the weight gradients' sums run once per step
    from flint.passes.expand_loops import ExpandLoops
    from flint.passes.pipeline import PipelineParallel
    from flint.template_cache import extract_program

    g = ExpandLoops().run(extract_program(_program(
        devices=4, mesh=[["data", 2], ["context", 2]], scan=False)))
    piped = PipelineParallel(1, 3).run(g)
    gemm = lambda graph: sum(n.flops for n in graph.nodes if n.op_class in  # noqa: E731
                             ("gemm", "attention"))
    assert gemm(piped) == pytest.approx(3 * gemm(g), rel=1e-9)


def test_distributed_optimizer_reduce_scatters_and_gathers_each_bucket():
    from flint.hardware_models.estimate import estimate
    from flint.passes.distributed_optimizer import DistributedOptimizer
    from flint.passes.layer_template import LayerTemplate
    from flint.passes.pipeline import PipelineParallel
    from flint.template_cache import extract_program

    template = extract_program(_program(devices=4, mesh=[["data", 4]], scan=False, layers=3))
    layered = LayerTemplate(8).run(template)
    zero1 = DistributedOptimizer().run(layered)
    before = [n for n in layered.nodes if n.collective is not None
              and n.collective.type == "all-reduce" and n.collective.bytes_in > 1024]
    scattered = [n for n in zero1.nodes if n.meta.get("distributed_optimizer")
                 == "grad-reduce-scatter"]
    gathered = [n for n in zero1.nodes if n.meta.get("distributed_optimizer") == "param-gather"]
    assert len(scattered) == len(gathered) == len(before) > 0
    for ar, rs, ag in zip(before, scattered, gathered):
        grad = {"f32": 4, "bf16": 2}[ar.collective.dtype]
        # Megatron's fp32 main gradients: every bucket reduced in f32, whatever dtype the
        # extracted step's all-reduce had (bf16 for the matrices XLA reduced before the cast)
        main = ar.collective.bytes_in * 4 // grad
        assert (rs.collective.dtype, rs.collective.bytes_in) == ("f32", main)
        assert rs.collective.bytes_out == main // 4                     # 1/DP each
        assert ag.collective.bytes_out == ar.collective.bytes_in * 2 // grad   # bf16 params
    # every parameter all-gather feeds a forward node, and the step gets no slower
    users = zero1.users
    assert all(zero1.nodes[u].meta.get("phase") == "forward" for g in gathered
               for u in users[g.id]) and all(users[g.id] for g in gathered)
    t = lambda g: estimate(PipelineParallel(1, 4).run(g), "h100-sxm").step_time_s  # noqa: E731
    assert t(zero1) <= t(layered)
    # memory: Megatron's 6 + 12/d bytes per parameter: the moments (8 B) become this rank's
    # 1/4 of fp32 main parameters and moments (12 B); the parameters themselves stay
    from flint.hardware_models.memory import estimate_memory

    before, after = estimate_memory(layered), estimate_memory(zero1)
    assert after.arguments_bytes["optimizer_state"] == pytest.approx(
        before.arguments_bytes["optimizer_state"] * 12 / 8 / 4, rel=1e-3)
    # the fp32 gradient buffer stays; the gathered bf16 parameters (2 B) are kept too
    bf16 = sum(g.collective.bytes_out for g in gathered)
    assert after.arguments_bytes["parameters"] == pytest.approx(
        before.arguments_bytes["parameters"] + bf16)


def test_shard_groups_and_internevo_broadcast_sync():
    """A shard group g of d ranks: each bucket reduce-scattered inside its group of g,
    the shard all-reduced across the d/g groups, the parameters gathered inside the
    group, the state 12/g (Megatron-Core's distributed-optimizer instances). InternEvo's
    sync: the all-reduces stay, and one broadcast of all the bf16 parameters in g pieces
    (one per owner) over the group feeds the forward; NCCL prices a broadcast as a ring
    of nRanks steps moving the buffer once over each link."""
    from flint.errors import FlintError
    from flint.hardware_models.memory import estimate_memory
    from flint.passes.distributed_optimizer import DistributedOptimizer
    from flint.passes.layer_template import LayerTemplate
    from flint.template_cache import extract_program

    template = extract_program(_program(devices=8, mesh=[["data", 8]], scan=False, layers=3))
    layered = LayerTemplate(8).run(template)
    before = [n for n in layered.nodes if n.collective is not None
              and n.collective.type == "all-reduce" and n.collective.bytes_in > 1024]
    grouped = DistributedOptimizer(group=2).run(layered)
    rs = [n for n in grouped.nodes if n.meta.get("distributed_optimizer") == "grad-reduce-scatter"]
    across = [n for n in grouped.nodes
              if n.meta.get("distributed_optimizer") == "grad-all-reduce-across"]
    gathers = [n for n in grouped.nodes if n.meta.get("distributed_optimizer") == "param-gather"]
    assert len(rs) == len(across) == len(gathers) == len(before) > 0
    comm = grouped.communicators
    for ar, r, a in zip(before, rs, across):
        main = ar.collective.bytes_in * 4 // {"f32": 4, "bf16": 2}[ar.collective.dtype]
        assert comm[r.collective.communicator].size == 2 and r.collective.bytes_out == \
            main // 2
        assert comm[a.collective.communicator].size == 4 and a.inputs == [r.id]
        assert a.collective.bytes_in == main // 2
        # the two groups partition the ranks: {0,1},{2,3}.. inside, {0,2,4,6},{1,3,5,7} across
        assert sorted(comm[r.collective.communicator].group_of(3)) == [2, 3]
        assert sorted(comm[a.collective.communicator].group_of(3)) == [1, 3, 5, 7]
    whole = DistributedOptimizer().run(layered)
    state = lambda g: estimate_memory(g).arguments_bytes["optimizer_state"]  # noqa: E731
    assert state(grouped) == pytest.approx(4 * state(whole), rel=1e-3)       # 12/2 vs 12/8

    bcast = DistributedOptimizer(sync="broadcast", group=4).run(layered)
    kinds = [n.collective.type for n in bcast.nodes if n.collective is not None
             and n.collective.bytes_in > 1024]
    assert kinds.count("all-reduce") == len(before) and "reduce-scatter" not in kinds
    head = [n for n in bcast.nodes if n.meta.get("distributed_optimizer") == "param-broadcast"]
    assert len(head) == 1 and head[0].meta["pieces"] == 4
    params = sum(ar.collective.bytes_in * 2 // {"f32": 4, "bf16": 2}[ar.collective.dtype]
                 for ar in before)
    assert head[0].collective.bytes_in == params
    assert bcast.communicators[head[0].collective.communicator].size == 4
    assert all(bcast.nodes[u].meta.get("phase") == "forward" for u in bcast.users[head[0].id])
    assert state(bcast) == pytest.approx(2 * state(whole), rel=1e-3)         # 12/4 vs 12/8
    with pytest.raises(FlintError, match="does not divide"):
        DistributedOptimizer(group=3).run(layered)
    with pytest.raises(FlintError, match="not reduce-scatter or broadcast"):
        DistributedOptimizer(sync="gather")


def test_nccl_broadcast_is_a_ring_of_n_steps_and_pieces_pay_each_launch():
    from flint.cluster import Cluster
    from flint.graph import Collective, Communicator, Node, NodeKind
    from flint.hardware_models.network import NetworkModel
    from flint.hardware_models.spec import load_spec

    spec = load_spec("a100-80gb-sxm")
    n = 16
    net = NetworkModel(spec, Cluster(n, (("data", n),), "a100-80gb-sxm", devices_per_host=8))
    comm = Communicator(0, "groups", "{{" + ",".join(map(str, range(n))) + "}}", n, n, 1,
                        ("data",))

    def t(kind, size, pieces=1):
        node = Node(0, kind, NodeKind.COLLECTIVE, kind, "collective",
                    collective=Collective(kind, 0, size, size, "bf16"),
                    meta={"pieces": pieces})
        return net.time(node, comm)

    big = 8e9
    # every link carries the buffer once: the bandwidth of the node's NICs, as all-gather's
    # ring, for S bytes instead of (n-1)/n S
    assert t("collective-broadcast", big) == pytest.approx(
        t("all-gather", big) * n / (n - 1), rel=0.05)
    one, sixteen = t("collective-broadcast", big), t("collective-broadcast", big, 16)
    assert sixteen > one and sixteen == pytest.approx(16 * t("collective-broadcast", big / 16))
