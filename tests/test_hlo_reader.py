"""HLO text reader: shapes, instructions, the three replica-group syntaxes, bad input."""
import numpy as np
import pytest

from flint.errors import FlintError
from flint.hlo.module import parse_instruction, parse_module
from flint.hlo.replica_groups import (mesh_axes_spanned, parse_replica_groups,
                                      parse_source_target_pairs)
from flint.hlo.shapes import parse_shape


def test_shapes():
    s = parse_shape("bf16[8,128]{1,0:T(8,128)}")
    assert (s.dtype, s.dims, s.nbytes) == ("bf16", (8, 128), 2048)
    t = parse_shape("(f32[4]{0}, (s8[16]{0}, pred[]), token[])")
    assert t.is_tuple and [str(x) for x in t.leaves()] == ["f32[4]", "s8[16]", "pred[]", "token[]"]
    assert t.nbytes == 16 + 16 + 1
    assert parse_shape("s4[3]").nbytes == 2
    with pytest.raises(FlintError, match="malformed HLO shape"):
        parse_shape("q7[3]")


def test_instruction_with_tuple_shape_comments_and_attributes():
    ins = parse_instruction(
        '  ROOT %w = (s32[], /*index=1*/bf16[2,8]{1,0}) while(%t), condition=%c, body=%b, '
        'metadata={op_name="jit(f)/while" source_file="a \\"q\\".py" source_line=3}, '
        'backend_config={"known_trip_count":{"n":"32"}}')
    assert ins.is_root and ins.opcode == "while" and ins.operands == ["t"]
    assert ins.shape.elements[1].dims == (2, 8)
    assert ins.called("body") == ["b"] and ins.called("condition") == ["c"]
    assert ins.backend_config["known_trip_count"]["n"] == "32"
    assert ins.metadata["source_file"] == 'a "q".py'


def test_operands_with_inline_shapes_and_constants():
    ins = parse_instruction("%d = f32[4]{0} add(f32[4]{0} %a, f32[4]{0} %b)")
    assert ins.operands == ["a", "b"]
    c = parse_instruction("%c = f32[2]{0} constant({1, 2})")
    assert c.operands == [] and c.opcode == "constant"
    done = parse_instruction("%x = c64[8]{0} all-to-all-done(((c64[8]{0}), c64[8]{0}) %s)")
    assert done.operands == ["s"]


IOTA_CASES = {
    "[4,2]<=[8]": [[0, 1], [2, 3], [4, 5], [6, 7]],
    "[4,2]<=[2,4]T(1,0)": [[0, 4], [1, 5], [2, 6], [3, 7]],
    "[2,10]<=[4,5]T(1,0)": [[0, 5, 10, 15, 1, 6, 11, 16, 2, 7], [12, 17, 3, 8, 13, 18, 4, 9, 14, 19]],
}
# Expected groups for the mesh-axes form were measured by running all-gathers on 16 CPU
# devices with jaxlib 0.10.2 (group membership and order within groups).
MESH_CASES = {
    "mesh['a'=4,'b'=4] {'b'}": [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]],
    "mesh['a'=4,'b'=4] {'a'}": [[0, 4, 8, 12], [1, 5, 9, 13], [2, 6, 10, 14], [3, 7, 11, 15]],
    "mesh['a'=4,'b'=4] {'b','a'}": [[0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15]],
    "mesh['a'=16] {'a':(2)4}": [[0, 2, 4, 6], [1, 3, 5, 7], [8, 10, 12, 14], [9, 11, 13, 15]],
    "mesh['a'=16] {'a':(8)2,'a':(1)2}": [[0, 8, 1, 9], [2, 10, 3, 11], [4, 12, 5, 13],
                                         [6, 14, 7, 15]],
    "mesh['a'=2,'b'=4,'c'=2] {'c','a'}": [[0, 8, 1, 9], [2, 10, 3, 11], [4, 12, 5, 13],
                                          [6, 14, 7, 15]],
    "mesh['a'=4,'b'=4], device_ids=([4,4]T(1,0)) {'a'}": [[0, 1, 2, 3], [4, 5, 6, 7],
                                                          [8, 9, 10, 11], [12, 13, 14, 15]],
}


@pytest.mark.parametrize("text,groups", {**IOTA_CASES, **MESH_CASES}.items())
def test_replica_group_syntaxes(text, groups):
    assert parse_replica_groups(text, 16).tolist() == groups


def test_explicit_and_empty_groups_and_pairs():
    assert parse_replica_groups("{{0,2},{1,3}}", 4).tolist() == [[0, 2], [1, 3]]
    assert parse_replica_groups("{}", 4).tolist() == [[0, 1, 2, 3]]
    assert parse_source_target_pairs("{{0,1},{1,0}}").tolist() == [[0, 1], [1, 0]]
    with pytest.raises(FlintError):
        parse_replica_groups("<<bad>>", 4)


def test_mesh_axes_spanned():
    mesh = [("data", 2), ("model", 4)]
    assert mesh_axes_spanned(np.array([[0, 1, 2, 3], [4, 5, 6, 7]]), mesh) == ("model",)
    assert mesh_axes_spanned(parse_replica_groups("[4,2]<=[2,4]T(1,0)", 8), mesh) == ("data",)
    assert mesh_axes_spanned(np.arange(8).reshape(1, 8), mesh) == ("data", "model")


def test_malformed_modules():
    with pytest.raises(FlintError, match="not an HLO module"):
        parse_module("garbage")
    with pytest.raises(FlintError, match="not closed"):
        parse_module("HloModule m\n\nENTRY %e () -> f32[] {\n  %c = f32[] constant(1)\n")
    with pytest.raises(FlintError, match="line 4"):
        parse_module("HloModule m\n\nENTRY %e () -> f32[] {\n  this is not hlo\n}\n")
    with pytest.raises(FlintError, match="no ENTRY"):
        parse_module("HloModule m\n\n%e () -> f32[] {\n  ROOT %c = f32[] constant(1)\n}\n")
