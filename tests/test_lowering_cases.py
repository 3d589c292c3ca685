"""Lowering corner cases: convolutions, conditionals, unknown ops, loops, async pairs."""
import re

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


# libtpu's async collective fusions (MaxText's --xla_tpu_enable_async_collective_fusion
# flags): a start fusion issues an FSDP all-gather, a continuation fusion computes while it
# is in flight (carrying its state through an aliased tuple; here in another computation,
# as a windowed-einsum loop body carries it), a done fusion waits for it
TPU_ASYNC_FUSIONS = """HloModule tpu_async, num_partitions=4

%start_body (s0: bf16[64,32]) -> (bf16[64,32], bf16[64,128], u32[]) {
  %s0 = bf16[64,32]{1,0} parameter(0)
  %all-gather.1 = bf16[64,128]{1,0} all-gather(%s0), channel_id=7, replica_groups={{0,1,2,3}}, dimensions={1}, use_global_device_ids=true
  ROOT %start.cc = (bf16[64,32]{1,0}, bf16[64,128]{1,0}, u32[]) custom-call(%all-gather.1), custom_call_target="AsyncCollectiveStart"
}

%continuation_body (c0: bf16[64,32], c1: bf16[64,128], c2: u32[], c3: bf16[256,64], c4: bf16[64,512]) -> (bf16[256,512], bf16[64,32], bf16[64,128], u32[]) {
@PARAMS(c)
  %dot.conv = bf16[256,512]{1,0} convolution(%c3, %c4), dim_labels=bf_io->bf
  %all-gather.2 = bf16[64,128]{1,0} all-gather(%c0), channel_id=7, replica_groups={{0,1,2,3}}, dimensions={1}, use_global_device_ids=true
  ROOT %carry = (bf16[256,512]{1,0}, bf16[64,32]{1,0}, bf16[64,128]{1,0}, u32[]) tuple(%dot.conv, %c0, %all-gather.2, %c2)
}

%done_body (d0: bf16[64,32], d1: bf16[64,128], d2: u32[]) -> bf16[64,128] {
  %d0 = bf16[64,32]{1,0} parameter(0)
  %d1 = bf16[64,128]{1,0} parameter(1)
  %d2 = u32[] parameter(2)
  %all-gather.3 = bf16[64,128]{1,0} all-gather(%d0), channel_id=7, replica_groups={{0,1,2,3}}, dimensions={1}, use_global_device_ids=true
  ROOT %done.cc = bf16[64,128]{1,0} custom-call(%d0, %d1, %all-gather.3, %d2), custom_call_target="AsyncCollectiveDone"
}

%carrier (q0: bf16[64,32], q1: bf16[64,128], q2: u32[], q3: bf16[256,64], q4: bf16[64,512]) -> (bf16[256,512], bf16[64,32], bf16[64,128], u32[]) {
@PARAMS(q)
  ROOT %fusion.cont = (bf16[256,512]{1,0}, bf16[64,32]{1,0}, bf16[64,128]{1,0}, u32[]) fusion(%q0, %q1, %q2, %q3, %q4), kind=kOutput, calls=%continuation_body, backend_config={"continuation_config":{"output_tuple_original_start":"0","output_tuple_original_end":"0"}}
}

ENTRY %main (shard: bf16[64,32], x: bf16[256,64], w: bf16[64,512], a: bf16[256,512]) -> (bf16[256,512], bf16[64,128], bf16[256,512]) {
  %shard = bf16[64,32]{1,0} parameter(0)
  %x = bf16[256,64]{1,0} parameter(1)
  %w = bf16[64,512]{1,0} parameter(2)
  %a = bf16[256,512]{1,0} parameter(3)
  %async-collective-start = (bf16[64,32]{1,0}, bf16[64,128]{1,0}, u32[]) fusion(%shard), kind=kCustom, calls=%start_body
  %g0 = bf16[64,32]{1,0} get-tuple-element(%async-collective-start), index=0
  %g1 = bf16[64,128]{1,0} get-tuple-element(%async-collective-start), index=1
  %g2 = u32[] get-tuple-element(%async-collective-start), index=2
  %carried = (bf16[256,512]{1,0}, bf16[64,32]{1,0}, bf16[64,128]{1,0}, u32[]) call(%g0, %g1, %g2, %x, %w), to_apply=%carrier
  %k0 = bf16[256,512]{1,0} get-tuple-element(%carried), index=0
  %k1 = bf16[64,32]{1,0} get-tuple-element(%carried), index=1
  %k2 = bf16[64,128]{1,0} get-tuple-element(%carried), index=2
  %k3 = u32[] get-tuple-element(%carried), index=3
  %async-collective-done = bf16[64,128]{1,0} fusion(%k1, %k2, %k3), kind=kCustom, calls=%done_body
  %collective-permute.1 = bf16[256,512]{1,0} collective-permute(%a), channel_id=9, source_target_pairs={{0,1},{1,2},{2,3},{3,0}}
  ROOT %out = (bf16[256,512]{1,0}, bf16[64,128]{1,0}, bf16[256,512]{1,0}) tuple(%k0, %async-collective-done, %collective-permute.1)
}
"""


_CARRIED = ("bf16[64,32]{1,0}", "bf16[64,128]{1,0}", "u32[]", "bf16[256,64]{1,0}",
            "bf16[64,512]{1,0}")
TPU_ASYNC_FUSIONS = re.sub(r"@PARAMS\((\w)\)", lambda m: "\n".join(
    f"  %{m.group(1)}{i} = {t} parameter({i})" for i, t in enumerate(_CARRIED)),
    TPU_ASYNC_FUSIONS)


def test_tpu_async_collective_fusions_are_one_async_gather_beside_compute():
    graph = lower_hlo(parse_module(TPU_ASYNC_FUSIONS), Cluster(4, (("fsdp", 4),), "tpu-v5p", "tpu"))
    by_name = {n.name: n for n in graph.nodes}
    assert set(by_name) == {"async-collective-start", "fusion.cont", "collective-permute.1"}
    gather = by_name["async-collective-start"]
    assert gather.collective.type == "all-gather" and gather.collective.is_async
    assert gather.collective.bytes_out == 64 * 128 * 2          # the done's result
    cont = by_name["fusion.cont"]
    assert cont.collective is None and cont.kind == NodeKind.COMPUTE
    assert cont.flops == 2 * 256 * 64 * 512
    # its own output and what its dot reads: not the carried gather state passing through
    assert cont.outputs == ["bf16[256,512]"] and cont.bytes_written == 256 * 512 * 2
    assert cont.bytes_read == (256 * 64 + 64 * 512) * 2
    assert gather.collective.window == (cont.id, cont.id)
    assert gather.id not in cont.inputs          # it carries the gather, it does not wait
    # a TPU collective-permute is a DMA waited for at its first use
    assert by_name["collective-permute.1"].collective.is_async
    gpu = lower_hlo(parse_module(TPU_ASYNC_FUSIONS.replace(
        ', backend_config={"continuation_config":{"output_tuple_original_start":"0",'
        '"output_tuple_original_end":"0"}}', "")), Cluster(4, (("fsdp", 4),), "h100-sxm"))
    assert not {n.name: n for n in gpu.nodes}["collective-permute.1"].collective.is_async



def test_a_tpu_continuation_does_not_wait_for_the_last_one_carrying_its_gather():
    """Two compute kernels carry one gather's state, the second from the first: the state
    passing through is no data edge, so the second (reading only x and w) does not wait
    for the first; a chain through every kernel carrying a gather would put a weight-
    gradient GEMM between an attention call's tiles (passes/attention.py keeps no GEMM
    inside a call)."""
    second = TPU_ASYNC_FUSIONS.replace("%carrier (", "%carrier2 (").replace(
        "%fusion.cont = ", "%fusion.cont2 = ")
    carrier = second[second.index("%carrier2 ("):second.index("ENTRY")]
    text = TPU_ASYNC_FUSIONS.replace("ENTRY", carrier + "ENTRY").replace(
        "  %async-collective-done = bf16[64,128]{1,0} fusion(%k1, %k2, %k3)",
        "  %again = (bf16[256,512]{1,0}, bf16[64,32]{1,0}, bf16[64,128]{1,0}, u32[]) "
        "call(%k1, %k2, %k3, %x, %w), to_apply=%carrier2\n"
        "  %m1 = bf16[64,32]{1,0} get-tuple-element(%again), index=1\n"
        "  %m2 = bf16[64,128]{1,0} get-tuple-element(%again), index=2\n"
        "  %m3 = u32[] get-tuple-element(%again), index=3\n"
        "  %async-collective-done = bf16[64,128]{1,0} fusion(%m1, %m2, %m3)")
    graph = lower_hlo(parse_module(text), Cluster(4, (("fsdp", 4),), "tpu-v5p", "tpu"))
    by_name = {n.name: n for n in graph.nodes}
    first, then = by_name["fusion.cont"], by_name["fusion.cont2"]
    assert then.collective is None and then.flops == first.flops
    assert first.id not in then.inputs and then.inputs == first.inputs
    gather = by_name["async-collective-start"]
    assert gather.collective.window == (first.id, then.id)


PADDED_WINDOW = """HloModule padded_window, num_partitions=1

%window (p: bf16[8,1,1024], i: s32[]) -> bf16[8,2,128] {
  %p = bf16[8,1,1024]{2,1,0} parameter(0)
  %i = s32[] parameter(1)
  %ninf = bf16[] constant(-inf)
  %padded = bf16[8,2,1024]{2,1,0} pad(%p, %ninf), padding=0_0x0_1x0_0
  %zero = s32[] constant(0)
  ROOT %w = bf16[8,2,128]{2,1,0} dynamic-slice(%padded, %zero, %zero, %i), dynamic_slice_sizes={8,2,128}
}

ENTRY %main (a: bf16[8,1,1024], i: s32[]) -> bf16[8,2,128] {
  %a = bf16[8,1,1024]{2,1,0} parameter(0)
  %i = s32[] parameter(1)
  ROOT %f = bf16[8,2,128]{2,1,0} fusion(%a, %i), kind=kLoop, calls=%window
}
"""


def test_a_fusion_reads_the_window_it_slices_out_of_a_padded_parameter():
    graph = lower_hlo(parse_module(PADDED_WINDOW), Cluster(1, (("data", 1),), "tpu-v5p", "tpu"))
    (node,) = [n for n in graph.nodes if n.name == "f"]
    assert node.bytes_read == 8 * 2 * 128 * 2 + 4    # the window (and the offset), not 16 KB


# A Multislice program (libtpu's MegaScale runtime): one slice's SPMD program, partitioned
# for its 4 chips; the gradient's all-reduce across slices is a host-transfer recv posted
# early, a send of the chip's shard, then send-done and recv-done, all naming the runtime
TPU_MULTISLICE = """HloModule multislice, num_partitions=4

ENTRY %main (g: f32[512,128], x: bf16[256,64], w: bf16[64,512]) -> (f32[512,128], bf16[256,512]) {
  %g = f32[512,128]{1,0} parameter(0)
  %x = bf16[256,64]{1,0} parameter(1)
  %w = bf16[64,512]{1,0} parameter(2)
  %after-all = token[] after-all(), frontend_attributes={MegascaleRendezvousKeyName="all-reduce.1_0"}
  %recv = (f32[512,128]{1,0}, u32[], token[]) recv(%after-all), channel_id=2, is_host_transfer=true, frontend_attributes={_xla_host_transfer_handler_name="xla_megascale_runtime",_xla_host_transfer_rendezvous="all-reduce.1_0",_xla_megascale_reduce_operation="SUM",_xla_megascale_target="{1,2}x{0:3}",_xla_megascale_transfer_type="@TYPE"}
  %send = (f32[512,128]{1,0}, u32[], token[]) send(%g, %after-all), channel_id=3, is_host_transfer=true, frontend_attributes={_xla_host_transfer_handler_name="xla_megascale_runtime",_xla_host_transfer_rendezvous="all-reduce.1_0",_xla_megascale_reduce_operation="SUM",_xla_megascale_target="{1,2}x{0:3}",_xla_megascale_transfer_type="@TYPE"}
  %dot = bf16[256,512]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %shift = bf16[256,512]{1,0} collective-permute(%dot), channel_id=5, source_target_pairs={{0,1},{1,2},{2,3},{3,0}}
  %send-done = token[] send-done(%send), channel_id=3, is_host_transfer=true, frontend_attributes={_xla_host_transfer_handler_name="xla_megascale_runtime"}
  %recv-done = (f32[512,128]{1,0}, token[]) recv-done(%recv), channel_id=2, is_host_transfer=true, frontend_attributes={_xla_host_transfer_handler_name="xla_megascale_runtime"}
  %reduced = f32[512,128]{1,0} get-tuple-element(%recv-done), index=0
  %scaled = f32[512,128]{1,0} multiply(%reduced, %reduced)
  ROOT %out = (f32[512,128]{1,0}, bf16[256,512]{1,0}) tuple(%scaled, %shift)
}
"""


def test_multislice_transfers_are_one_async_all_reduce_across_slices():
    from flint.errors import FlintError

    two_slices = Cluster(8, (("data", 2), ("fsdp", 4)), "tpu-v5e", "tpu")
    graph = lower_hlo(parse_module(TPU_MULTISLICE.replace("@TYPE", "ALL_REDUCE")), two_slices)
    by_name = {n.name: n for n in graph.nodes}
    assert set(by_name) == {"send", "dot", "shift", "scaled"}
    sent = by_name["send"]
    assert sent.kind == NodeKind.COLLECTIVE and sent.collective.type == "all-reduce"
    assert sent.collective.is_async and sent.collective.reduction == "add"
    assert sent.collective.bytes_in == sent.collective.bytes_out == 512 * 128 * 4
    assert sent.collective.window == (by_name["dot"].id, by_name["shift"].id)  # in flight
    assert by_name["scaled"].inputs == [sent.id]          # the recv-done's result
    comm = graph.communicator(sent)     # chip i of every slice: {i, i + 4}
    assert (comm.size, comm.groups().tolist()) == (2, [[0, 4], [1, 5], [2, 6], [3, 7]])
    # the slice's own collectives run in every slice alike: slice 1's chips shift too
    shift = graph.communicator(by_name["shift"]).groups().tolist()
    assert shift == [[0, 1], [1, 2], [2, 3], [3, 0], [4, 5], [5, 6], [6, 7], [7, 4]]
    # one slice's program on a cluster it does not divide, or with no MegaScale transfer,
    # is the partition-count mismatch it always was; an unknown transfer type is refused
    with pytest.raises(FlintError, match="partitioned for 4 devices"):
        lower_hlo(parse_module(TPU_MULTISLICE.replace("@TYPE", "ALL_REDUCE")),
                  Cluster(6, (("data", 6),), "tpu-v5e", "tpu"))
    with pytest.raises(FlintError, match="partitioned for 4 devices"):
        lower_hlo(parse_module(TPU_ASYNC_FUSIONS), two_slices)
    with pytest.raises(FlintError, match="transfer type 'BROADCAST'"):
        lower_hlo(parse_module(TPU_MULTISLICE.replace("@TYPE", "BROADCAST")), two_slices)


def test_a_multislice_dump_reads_for_the_job_it_is_given(tmp_path):
    """An XLA dump of one slice's program says nothing of how many slices ran it: the job's
    device count is asked for, and whole slices of it are accepted."""
    from flint.errors import FlintError
    from flint.frontends.hlo_dump import load_dump

    path = tmp_path / "module_0001.jit_train_step.after_optimizations.txt"
    path.write_text(TPU_MULTISLICE.replace("@TYPE", "ALL_REDUCE"))
    graph = load_dump(str(path), devices=12, hardware="tpu-v5e")
    (sent,) = [n for n in graph.nodes if n.meta.get("megascale")]
    assert graph.cluster.devices == 12 and graph.communicator(sent).size == 3
    with pytest.raises(FlintError, match="one slice's program of a Multislice job"):
        load_dump(str(path), hardware="tpu-v5e")
    with pytest.raises(FlintError, match="partitioned for 4 devices"):
        load_dump(str(path), devices=6, hardware="tpu-v5e")
