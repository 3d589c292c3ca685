"""JAX extraction: flops against XLA's own count, scan vs unrolled, DP and TP collectives."""
import jax
import pytest

from flint.frontends.jax import capture
from flint.models.train import build
from flint.graph import collective_size_bytes


def compiled_for(model, mesh, hardware, **kw):
    w = build(model, mesh, **kw)
    step = capture(w.step, devices=8, mesh=dict(mesh), hardware=hardware, in_specs=w.in_specs,
                   out_specs=w.out_specs, donate_argnums=w.donate_argnums)
    return w, step.lower(*w.args).compile()


@pytest.mark.parametrize("mesh", [(("fsdp", 8),), (("fsdp", 2), ("model", 4))])
def test_loop_free_flops_equal_xla_cost_analysis(mesh):
    # the unfused reference attention: a flash node counts executed (causal) FLOPs, XLA's
    # cost analysis counts the materialized scores
    _, compiled = compiled_for("gpt2-small", mesh, "cpu", scan=False, layers=2, seq_len=256,
                               attention="xla")
    graph = compiled.workload()
    xla = compiled.cost_analysis()["flops"]
    assert graph.loops == []
    assert graph.total_flops() == pytest.approx(xla, rel=0.01)


@pytest.mark.parametrize("hardware", ["cpu", "h100-sxm"])
def test_scanned_flops_equal_unrolled_twin(hardware):
    mesh = (("fsdp", 2), ("model", 4))
    totals = {}
    for scan in (True, False):
        _, compiled = compiled_for("gpt2-small", mesh, hardware, scan=scan, layers=4,
                                   seq_len=256)
        graph = compiled.workload()
        totals[scan] = graph.total_flops()
        if scan:
            assert [lp.trip_count for lp in graph.loops if lp.trip_count_known].count(4) >= 2
    assert totals[True] == pytest.approx(totals[False], rel=0.01)


@pytest.mark.parametrize("hardware", ["cpu", "h100-sxm"])
def test_data_parallel_gradient_all_reduce_bytes(hardware):
    w, compiled = compiled_for("mlp", (("data", 8),), hardware, layers=4)
    graph = compiled.workload()
    param_bytes = w.info["params"] * 4  # float32 parameters
    reduces = [n for n in graph.collectives() if n.collective.type == "all-reduce"]
    assert reduces and all(graph.communicator(n).mesh_axes == ("data",) for n in reduces)
    assert all(graph.communicator(n).size == 8 for n in reduces)
    # every gradient once, plus the float32 loss the step returns
    assert sum(collective_size_bytes(n) for n in reduces) == param_bytes + 4
    assert not [n for n in graph.collectives() if n.collective.type != "all-reduce"]


@pytest.mark.parametrize("hardware", ["cpu", "h100-sxm"])
def test_megatron_tp_all_reduces_per_layer(hardware):
    layers, tp = 4, 4
    w, compiled = compiled_for("mlp", (("data", 2), ("model", tp)), hardware, layers=layers,
                               batch_per_replica=8)
    graph = compiled.workload()
    on_model = [n for n in graph.collectives() if graph.communicator(n).mesh_axes == ("model",)]
    assert all(n.collective.type == "all-reduce" and graph.communicator(n).size == tp
               for n in on_model)
    forward = [n for n in on_model if n.meta.get("phase") == "forward"]
    backward = [n for n in on_model if n.meta.get("phase") == "backward"]
    # one all-reduce after each row-parallel matmul; backward needs one per block except the
    # first, whose input (the batch) has no gradient
    assert len(forward) == layers and len(backward) == layers - 1
    assert {n.meta["layer"] for n in forward} == {f"block_{i}" for i in range(layers)}
    activation_bytes = (8 * 2 // 2) * w.info["d"] * 4  # per-device rows x d_model x f32
    assert {collective_size_bytes(n) for n in on_model} == {activation_bytes}
    on_data = [n for n in graph.collectives() if graph.communicator(n).mesh_axes == ("data",)]
    assert sum(collective_size_bytes(n) for n in on_data) == w.info["params"] * 4 // tp + 4


def test_async_collectives_keep_overlap_window():
    _, compiled = compiled_for("gpt2-small", (("fsdp", 8),), "h100-sxm", scan=True, layers=2,
                               seq_len=256)
    graph = compiled.workload()
    asyncs = [n for n in graph.collectives() if n.collective.is_async]
    assert asyncs, "GPU target emits async start/done collectives"
    windows = [n.collective.window for n in asyncs if n.collective.window]
    assert windows and all(n.id < w[0] <= w[1] for n, w in
                           ((n, n.collective.window) for n in asyncs if n.collective.window))
    names = {n.name for n in graph.nodes}
    assert not any(name.endswith("-done") for name in names)  # start/done fused into one node


def test_sequence_parallel_uses_reduce_scatter_and_all_gather():
    _, compiled = compiled_for("gpt2-small", (("fsdp", 2), ("model", 4)), "h100-sxm",
                               scan=False, layers=2, seq_len=256, sequence_parallel=True)
    graph = compiled.workload()
    types = {n.collective.type for n in graph.collectives()
             if graph.communicator(n).mesh_axes == ("model",)}
    assert {"reduce-scatter", "all-gather"} <= types


def test_context_parallel_gathers_keys_and_values():
    """Context parallelism with sequence parallelism: the sequence is sharded over
    `context` (and over `model` between the TP regions); each attention all-gathers K and
    V over `context`, their gradients are reduce-scattered back, and the weight gradients
    are reduced over the context axis as over a data axis."""
    w, compiled = compiled_for("tiny", (("context", 4), ("model", 2)), "h100-sxm",
                               scan=False, sequence_parallel=True)
    graph = compiled.workload()
    kinds = {(n.collective.type, graph.communicator(n).mesh_axes) for n in graph.collectives()}
    assert ("reduce-scatter", ("context",)) in kinds
    assert any(t == "all-gather" and "context" in axes for t, axes in kinds)
    assert any(t == "all-reduce" and "context" in axes for t, axes in kinds)
    assert {("all-gather", ("model",)), ("reduce-scatter", ("model",))} <= kinds
    tokens = w.args[2]["tokens"]
    assert w.in_specs[2]["tokens"] == jax.sharding.PartitionSpec(None, "context")
    assert tokens.shape[0] == 1        # context parallelism does not multiply the batch


def test_capture_decorator_on_jitted_function_with_rules():
    from jax.sharding import PartitionSpec as P

    @capture(devices=8, mesh="data=2,model=4", hardware="h100-sxm",
             rules=[(r"w1$", P(None, "model")), (r"w2$", P("model", None)), (r"x$", P("data"))])
    @jax.jit
    def step(params, batch):
        h = jax.nn.relu(batch["x"] @ params["w1"]) @ params["w2"]
        return (h * h).mean()

    f32 = jax.numpy.float32
    params = {"w1": jax.ShapeDtypeStruct((256, 1024), f32),
              "w2": jax.ShapeDtypeStruct((1024, 256), f32)}
    graph = step.workload(params, {"x": jax.ShapeDtypeStruct((64, 256), f32)})
    assert graph.cluster.devices == 8 and dict(graph.cluster.mesh) == {"data": 2, "model": 4}
    gemm = sum(n.flops for n in graph.nodes if n.op_class == "gemm")
    # two matmuls, sharded 2 x 4 (the fused ReLU adds 32 x 256 flops)
    assert gemm == pytest.approx(2 * 2 * 32 * 256 * 256, rel=0.01)
    assert any(graph.communicator(n).mesh_axes == ("model",) for n in graph.collectives())


def _attention_projection(q, v, w):
    out = jax.numpy.einsum("bhqk,bkhd->bqhd", q, v)
    return out.reshape(-1, out.shape[2] * out.shape[3]) @ w


@pytest.mark.parametrize("head_dim", [225, 224])
def test_dot_xla_triton_cannot_tile_compiles_as_library_gemm(head_dim):
    # XLA's Triton GEMM emitter, un-autotuned on compile-only devices, finds no tiling for
    # the output projection of 225-wide heads (BLOOM's h14400 with 64 heads) and fails the
    # whole compile; Flint compiles such a program with library GEMMs and says so
    S = jax.ShapeDtypeStruct
    bf16 = jax.numpy.bfloat16
    step = capture(_attention_projection, devices=1, hardware="a100-80gb-sxm")
    compiled = step.lower(S((2, 8, 256, 256), bf16), S((2, 256, 8, head_dim), bf16),
                          S((8 * head_dim, 64 * head_dim), bf16)).compile()
    graph = compiled.workload()
    notes = [n for n in graph.meta["compiler_notes"] if "xla_gpu_enable_triton_gemm" in n]
    assert len(notes) == (1 if head_dim == 225 else 0)
    assert graph.total_flops() >= 2 * 512 * 8 * head_dim * 64 * head_dim
