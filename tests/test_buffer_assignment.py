"""Dynamic-update-slice fusions: in place or copied, as XLA's buffer assignment decides, and
the in-place emitter's one-element-per-thread kernels."""
import dataclasses
import statistics

import pytest

from flint.graph import Node, NodeKind
from flint.hardware_models.spec import load_spec
from flint.hlo.buffer_assignment import (_hlo_proto_class, copied_updates,
                                         update_element_bytes, updated_parameters)
from flint.hlo.module import parse_module
from flint.passes.hlo_cost import CostRules

HLO = """HloModule updates

%fused_update (p0: bf16[4,8,16], p1: bf16[8,16], p2: s32[]) -> bf16[4,8,16] {
  %p0 = bf16[4,8,16]{2,1,0} parameter(0)
  %p1 = bf16[8,16]{1,0} parameter(1)
  %b = bf16[1,8,16]{2,1,0} bitcast(%p1)
  %p2 = s32[] parameter(2)
  %z = s32[] constant(0)
  ROOT %dus = bf16[4,8,16]{2,1,0} dynamic-update-slice(%p0, %b, %p2, %z, %z)
}

%fused_transposed (q0: bf16[4,16,8], q1: bf16[8,16], q2: s32[]) -> bf16[4,8,16] {
  %q0 = bf16[4,16,8]{2,1,0} parameter(0)
  %t = bf16[4,8,16]{2,1,0} transpose(%q0), dimensions={0,2,1}
  %q1 = bf16[8,16]{1,0} parameter(1)
  %c = bf16[1,8,16]{2,1,0} bitcast(%q1)
  %q2 = s32[] parameter(2)
  %y = s32[] constant(0)
  ROOT %dus2 = bf16[4,8,16]{2,1,0} dynamic-update-slice(%t, %c, %q2, %y, %y)
}

%fused_pair (r0: f32[4,8,16], r1: bf16[8,16], r2: s32[], r3: f32[4,8,16]) -> (f32[4,8,16], f32[4,8,16]) {
  %r0 = f32[4,8,16]{2,1,0} parameter(0)
  %r1 = bf16[8,16]{1,0} parameter(1)
  %e = bf16[1,8,16]{2,1,0} bitcast(%r1)
  %v = f32[1,8,16]{2,1,0} convert(%e)
  %r2 = s32[] parameter(2)
  %x = s32[] constant(0)
  %d1 = f32[4,8,16]{2,1,0} dynamic-update-slice(%r0, %v, %r2, %x, %x)
  %r3 = f32[4,8,16]{2,1,0} parameter(3)
  %d2 = f32[4,8,16]{2,1,0} dynamic-update-slice(%r3, %v, %r2, %x, %x)
  ROOT %tup = (f32[4,8,16]{2,1,0}, f32[4,8,16]{2,1,0}) tuple(%d1, %d2)
}

ENTRY %main (a: bf16[4,8,16], u: bf16[8,16], i: s32[], s: bf16[4,16,8]) -> bf16[4,8,16] {
  %a = bf16[4,8,16]{2,1,0} parameter(0)
  %u = bf16[8,16]{1,0} parameter(1)
  %i = s32[] parameter(2)
  %s = bf16[4,16,8]{2,1,0} parameter(3)
  %one = bf16[4,8,16]{2,1,0} fusion(%a, %u, %i), kind=kLoop, calls=%fused_update
  %two = bf16[4,8,16]{2,1,0} fusion(%one, %u, %i), kind=kLoop, calls=%fused_update
  ROOT %three = bf16[4,8,16]{2,1,0} fusion(%s, %u, %i), kind=kLoop, calls=%fused_transposed
}
"""
FULL, UPDATE = 4 * 8 * 16 * 2, 8 * 16 * 2


def hlo_proto(slices: dict[str, tuple[int, int]]) -> bytes:
    """An HloProto naming the entry's instructions by id, with one logical buffer per
    instruction placed at `slices[name]` = (allocation, offset)."""
    proto = _hlo_proto_class()()
    comp = proto.hlo_module.computations.add()
    for k, name in enumerate(slices, start=1):
        comp.instructions.add(name=name, id=100 + k)
    allocations = {}
    for k, (name, (alloc, offset)) in enumerate(slices.items(), start=1):
        buf = proto.buffer_assignment.logical_buffers.add(id=k)
        buf.defined_at.instruction_id = 100 + k
        if alloc not in allocations:
            allocations[alloc] = proto.buffer_assignment.buffer_allocations.add(index=alloc)
        allocations[alloc].assigned.add(logical_buffer_id=k, offset=offset, size=FULL)
    return proto.SerializeToString()


def test_buffer_assignment_says_which_updates_are_copied():
    module = parse_module(HLO)
    # `one` updates the argument's buffer (same slice); `two` got a slice of its own
    shared = hlo_proto({"a": (0, 0), "u": (1, 0), "i": (2, 0), "s": (3, 0),
                        "one": (0, 0), "two": (4, 0), "three": (5, 0)})
    assert copied_updates(shared, module) == {"two"}
    assert copied_updates(hlo_proto({"a": (0, 0), "one": (0, 0), "two": (0, 0)}),
                          module) == set()
    # no buffer assignment (an HloModuleProto, HLO text): nothing is known to be copied
    assert copied_updates(b"", module) == set()


def test_in_place_update_moves_the_update_and_a_copied_one_the_buffer():
    module = parse_module(HLO)
    module.copied_updates = frozenset({"two"})
    rules, entry = CostRules(module), module.entry_computation
    one, two, three = (entry.by_name[n] for n in ("one", "two", "three"))
    assert rules.in_place(one) and not rules.in_place(two)
    assert rules.bytes(one, entry) == (UPDATE + 4, UPDATE)
    assert rules.bytes(two, entry) == (FULL + UPDATE + 4, FULL)
    # the updated buffer is computed inside the fusion (a transpose): never in place
    assert updated_parameters(module.computations["fused_transposed"]) is None
    assert not rules.in_place(three)
    assert rules.bytes(three, entry)[1] == FULL


def test_in_place_kernels_keep_one_element_of_each_update_in_flight():
    """XLA's LLVM in-place emitter ran one unrolled-once thread per update element: a bf16
    update streams at half the per-SM rate of 4-byte loads; two bf16 updates fused
    horizontally (read before their converts) at the full rate."""
    from flint.hardware_models import kernels
    from flint.hardware_models.compute import RooflineCompute

    module = parse_module(HLO)
    assert update_element_bytes(module.computations["fused_update"]) == 2
    assert update_element_bytes(module.computations["fused_pair"]) == 4
    assert updated_parameters(module.computations["fused_pair"]) == [((0,), 0), ((1,), 3)]
    h100 = RooflineCompute(load_spec("h100-sxm"))
    update = Node(0, "loop_dynamic_update_slice_fusion", NodeKind.COMPUTE, "fusion",
                  "elementwise", bytes_read=1e8, bytes_written=1e8,
                  meta={"fusion_kind": "kLoop", "update_element_bytes": 2,
                        "xla_emitters": "legacy"})
    per_sm = kernels.GENERATED_BYTES_PER_SM_S
    assert h100.memory_bandwidth(update) == pytest.approx(132 * per_sm / 2)
    pair = dataclasses.replace(update, meta={**update.meta, "update_element_bytes": 4})
    assert h100.memory_bandwidth(pair) == pytest.approx(132 * per_sm)
    loop = dataclasses.replace(update, meta={"fusion_kind": "kLoop"})
    assert h100.memory_bandwidth(loop) == pytest.approx(3.35e12 * 0.9)


def test_maxtext_updates_as_its_buffer_assignment_ran_them(maxtext_archive):
    """The shared MaxText archive's HloProto: the stacked-activation updates of the scanned
    layers run in place; the f32 gradient stacks whose update came through a transposed
    operand got buffers of their own and are written whole, as their kernel times show
    (a whole-buffer write at 2.4 TB/s; in place it would be 300 GB/s)."""
    from flint.validate.workflow import open_input, run_validate

    inp = open_input(str(maxtext_archive), hardware="h100-sxm", xla_emitters="legacy")
    nodes = {n.name: n for n in inp.graph.nodes}
    for name in ("loop_dynamic_update_slice_fusion.7",
                 "loop_dynamic_update_slice_fusion.7.double_buffer_clone",
                 "loop_dynamic_update_slice_fusion.6"):
        node = nodes[name]
        assert node.bytes_written == 8 * 640 * (8192 if ".7" in name else 1024) * 4
        assert "update_element_bytes" not in node.meta
    stacked = nodes["loop_dynamic_update_slice_fusion.2"]
    assert stacked.bytes_written == 4096 * 8192 * 2
    assert stacked.meta["update_element_bytes"] == 2
    v = run_validate(inp, load_spec("h100-sxm"), None, ["input_scatter_fusion"])
    ratios = [o.predicted_s / o.measured_s for o in v.ops
              if "dynamic_update_slice" in o.name and o.measured_s > 20e-6]
    # before the in-place emitter and buffer assignment were modelled: 0.09-0.36
    assert 0.6 <= statistics.median(ratios) <= 1.1
