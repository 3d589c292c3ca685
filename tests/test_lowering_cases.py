"""Lowering corner cases: convolutions, conditionals, unknown ops, loops, async pairs."""
import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

from flint.cluster import Cluster
from flint.frontends.jax import capture
from flint.graph import NodeKind
from flint.hlo.module import parse_module
from flint.passes.conv_flops import convolution_flops, parse_window, valid_positions
from flint.hlo.shapes import parse_shape
from flint.passes.lower_hlo import lower_hlo


def test_valid_window_positions():
    same = parse_window("{size=3 pad=1_1}")[0]
    assert valid_positions(8, 8, same) == 22       # SAME 3-tap on 8: 8*3 minus 2 edge taps
    assert valid_positions(8, 6, parse_window("{size=3}")[0]) == 18   # VALID
    strided = parse_window("{size=3 stride=2 pad=1_1}")[0]
    assert valid_positions(8, 4, strided) == 11
    flops = convolution_flops(parse_shape("f32[2,8,8,3]"), parse_shape("f32[2,8,8,16]"),
                              "{size=3x3 pad=1_1x1_1}", "b01f_01io->b01f")
    assert flops == 2 * 3 * 16 * 2 * 22 * 22


def test_convnet_step_flops_equal_xla():
    def step(w1, w2, x):
        def loss(w1, w2):
            h = jax.lax.conv_general_dilated(x, w1, (1, 1), "SAME",
                                             dimension_numbers=("NHWC", "HWIO", "NHWC"))
            h = jax.lax.conv_general_dilated(jax.nn.relu(h), w2, (2, 2), "VALID",
                                             dimension_numbers=("NHWC", "HWIO", "NHWC"))
            return (h ** 2).mean()
        g1, g2 = jax.grad(loss, argnums=(0, 1))(w1, w2)
        return w1 - 0.1 * g1, w2 - 0.1 * g2

    f = jnp.float32
    args = (jax.ShapeDtypeStruct((3, 3, 8, 16), f), jax.ShapeDtypeStruct((3, 3, 16, 32), f),
            jax.ShapeDtypeStruct((16, 32, 32, 8), f))
    compiled = capture(step, devices=8, mesh="data=8", hardware="cpu",
                       in_specs=(P(), P(), P("data"))).lower(*args).compile()
    graph = compiled.workload()
    assert any(n.op_class == "conv" for n in graph.nodes)
    assert graph.total_flops() == pytest.approx(compiled.cost_analysis()["flops"], rel=0.01)


def test_conditional_keeps_the_costlier_branch():
    def step(x, w):
        return jax.lax.cond(x.sum() > 0, lambda: (x @ w) @ w, lambda: x * 2.0)

    f = jnp.float32
    graph = capture(step, devices=1, mesh="data=1", hardware="cpu").workload(
        jax.ShapeDtypeStruct((64, 64), f), jax.ShapeDtypeStruct((64, 64), f))
    chosen = [n for n in graph.nodes if "conditional" in n.meta]
    assert chosen and sum(n.flops for n in chosen) >= 2 * 2 * 64 ** 3


def test_scan_loop_is_multiplied_and_records_carried_dependencies():
    def step(w, x):
        def body(h, wi):
            return jnp.tanh(h @ wi), None
        h, _ = jax.lax.scan(body, x, w)
        return h.sum()

    f = jnp.float32
    graph = capture(step, devices=1, mesh="data=1", hardware="cpu").workload(
        jax.ShapeDtypeStruct((6, 32, 32), f), jax.ShapeDtypeStruct((4, 32), f))
    (loop,) = [lp for lp in graph.loops if lp.trip_count == 6]
    body = graph.nodes[loop.first:loop.last + 1]
    assert all(n.repeat == 6 and n.meta["loop"] == loop.id for n in body)
    gemm = [n for n in body if n.op_class == "gemm"]
    assert sum(n.flops * n.repeat for n in gemm) == pytest.approx(6 * 2 * 4 * 32 * 32, rel=0.01)
    assert loop.carried  # h feeds the next iteration


UNKNOWN = """HloModule m, num_partitions=2

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

ENTRY %e (p: f32[128,128]) -> f32[128,128] {
  %p = f32[128,128]{1,0} parameter(0)
  %f = f32[128,128]{1,0} frobnicate(%p), metadata={op_name="jit(f)/layer_0/frob"}
  %ars = f32[128,128]{1,0} all-reduce-start(%f), channel_id=1, replica_groups=[1,2]<=[2], use_global_device_ids=true, to_apply=%add
  %x = f32[128,128]{1,0} exponential(%p)
  %ard = f32[128,128]{1,0} all-reduce-done(%ars)
  ROOT %out = f32[128,128]{1,0} add(%ard, %x)
}
"""


def test_unknown_op_is_costed_conservatively_and_counted():
    graph = lower_hlo(parse_module(UNKNOWN), Cluster(2, (("data", 2),), "h100-sxm"))
    frob = next(n for n in graph.nodes if n.op == "frobnicate")
    assert frob.meta["unknown"] and frob.flops == 128 * 128
    assert frob.bytes_read == frob.bytes_written == 128 * 128 * 4
    assert graph.meta["unknown_ops"] == {"frobnicate": 1}
    assert graph.summary()["unknown_ops"] == {"frobnicate": 1}
    ar = next(n for n in graph.nodes if n.kind == NodeKind.COLLECTIVE)
    exp = next(n for n in graph.nodes if n.op == "exponential")
    assert ar.collective.is_async and ar.collective.window == (exp.id, exp.id)
    assert ar.inputs == [frob.id]
    assert graph.communicator(ar).mesh_axes == ("data",)
    out = graph.nodes[-1]
    assert sorted(out.inputs) == sorted([ar.id, exp.id])


def test_module_partition_count_must_match_cluster():
    from flint.errors import FlintError

    with pytest.raises(FlintError, match="partitioned for 2 devices"):
        lower_hlo(parse_module(UNKNOWN), Cluster(8, (("data", 8),), "h100-sxm"))


def test_unannotated_loops_get_inferred_trip_counts():
    """TPU's compiler writes no known_trip_count: the count is read from the loop itself."""
    import re

    from flint.models.train import build

    w = build("tiny", (("data", 8),), scan=True, layers=3)
    compiled = capture(w.step, devices=8, mesh="data=8", hardware="cpu", in_specs=w.in_specs,
                       out_specs=w.out_specs).lower(*w.args).compile()
    text = compiled.as_text()
    stripped = re.sub(r', backend_config=\{[^\n]*?"known_trip_count":\{"n":"\d+"\}\}', "", text)
    assert "known_trip_count" in text and "known_trip_count" not in stripped
    cluster = Cluster(8, (("data", 8),), "cpu", "cpu")
    annotated = lower_hlo(parse_module(text), cluster)
    inferred = lower_hlo(parse_module(stripped), cluster)
    assert [lp.trip_count for lp in inferred.loops] == [lp.trip_count for lp in annotated.loops]
    assert all(lp.trip_count == 3 for lp in inferred.loops)
    assert inferred.total_flops() == pytest.approx(annotated.total_flops())


TPU_FUSED_REDUCE_SCATTER = """HloModule fused_rs, num_partitions=4

%add (a: bf16[], b: bf16[]) -> bf16[] {
  %a = bf16[] parameter(0)
  %b = bf16[] parameter(1)
  ROOT %s = bf16[] add(%a, %b)
}

%all-reduce-scatter.1 (input_0: bf16[64,512]) -> bf16[16,512] {
  %input_0 = bf16[64,512]{1,0} parameter(0)
  %all-reduce.1 = bf16[64,512]{1,0} all-reduce(%input_0), channel_id=1, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=%add
  %pid = u32[] partition-id()
  %c16 = u32[] constant(16)
  %off = u32[] multiply(%pid, %c16)
  %zero = u32[] constant(0)
  ROOT %ds = bf16[16,512]{1,0} dynamic-slice(%all-reduce.1, %off, %zero), dynamic_slice_sizes={16,512}
}

ENTRY %main (p: bf16[64,512]) -> bf16[16,512] {
  %p = bf16[64,512]{1,0} parameter(0)
  ROOT %fusion.7 = bf16[16,512]{1,0} fusion(%p), kind=kCustom, calls=%all-reduce-scatter.1
}
"""


def test_tpu_fusion_wrapping_an_all_reduce_is_a_reduce_scatter():
    graph = lower_hlo(parse_module(TPU_FUSED_REDUCE_SCATTER), Cluster(4, (("fsdp", 4),), "tpu-v5p", "tpu"))
    (node,) = graph.nodes
    assert node.kind == NodeKind.COLLECTIVE and node.collective.type == "reduce-scatter"
    assert (node.collective.bytes_in, node.collective.bytes_out) == (64 * 512 * 2, 16 * 512 * 2)
    assert graph.communicator(node).size == 4
