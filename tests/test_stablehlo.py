"""StableHLO file input: sharded and per-device programs, serialized forms, bad input.

The programs are written by JAX itself (`jax.jit(f).lower(...).as_text()`) on the 8 host
CPU devices conftest.py provides, then compiled by Flint for compile-only H100s.
"""
import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from flint.errors import FlintError
from flint.frontends.jax import extract
from flint.frontends.stablehlo import load_stablehlo
from flint.graph import collective_size_bytes

BATCH, D, H = 512, 512, 1024           # global shapes of the MLP
MESH = (("data", 2), ("model", 4))
PARAM_SPECS = {"w1": P(None, "model"), "w2": P("model", None)}
# forward x@w1, h@w2; backward dW2, dh, dW1 (the batch needs no gradient): 5 GEMMs
HAND_FLOPS = 5 * 2 * BATCH * D * H


def loss(params, x, y):
    h = jnp.tanh(x @ params["w1"])
    return jnp.mean((h @ params["w2"] - y) ** 2)


def train_step(params, x, y):
    value, grads = jax.value_and_grad(loss)(params, x, y)
    return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads), value


def abstract_args():
    f32 = jnp.float32
    params = {"w1": jax.ShapeDtypeStruct((D, H), f32), "w2": jax.ShapeDtypeStruct((H, D), f32)}
    batch = jax.ShapeDtypeStruct((BATCH, D), f32)
    return params, batch, batch


def sharded_jit():
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model"))
    named = lambda spec: NamedSharding(mesh, spec)  # noqa: E731
    params = {k: named(s) for k, s in PARAM_SPECS.items()}
    return jax.jit(train_step, in_shardings=(params, named(P("data")), named(P("data"))),
                   out_shardings=(params, named(P())))


@pytest.fixture(scope="module")
def sharded_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("shlo") / "sharded.mlir"
    path.write_text(sharded_jit().lower(*abstract_args()).as_text())
    return path


@pytest.fixture(scope="module")
def single_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("shlo") / "single.mlir"
    path.write_text(jax.jit(train_step).lower(*abstract_args()).as_text())
    return path


def gemms(graph):
    return [n for n in graph.nodes if n.op_class == "gemm"]


def gemm_flops(graph):
    """GEMM fusions' flops. Not total_flops: XLA's GPU compiler splits some of these
    GEMMs along K, and the split's reduction fusions (~1% here) are not GEMM work."""
    return sum(n.flops * n.repeat for n in gemms(graph))


def test_sharded_program_is_partitioned_over_its_mesh(sharded_file):
    graph = load_stablehlo(sharded_file, devices=8, hardware="h100-sxm")
    assert graph.meta["source"] == "stablehlo" and graph.meta["sharded"] is True
    assert graph.meta["file"] == str(sharded_file) and graph.meta["module"] == "jit_train_step"
    assert graph.cluster.mesh == MESH and graph.cluster.hardware == "h100-sxm"
    assert len(gemms(graph)) == 5
    assert gemm_flops(graph) == pytest.approx(HAND_FLOPS / 8, rel=0.01)
    sizes = {graph.communicator(n).mesh_axes: graph.communicator(n).size
             for n in graph.collectives()}
    # Megatron-style TP all-reduces the activations on `model`; gradients reduce on `data`
    assert sizes == {("model",): 4, ("data",): 2}
    on_data = [n for n in graph.collectives() if graph.communicator(n).mesh_axes == ("data",)]
    assert sum(collective_size_bytes(n) for n in on_data) == 2 * D * H * 4 // 4 + 4


def test_sharded_program_matches_flint_jax_extraction(sharded_file):
    from_file = load_stablehlo(sharded_file, devices=8, hardware="h100-sxm")
    from_jax = extract(train_step, *abstract_args(), devices=8, mesh=dict(MESH),
                       hardware="h100-sxm", in_specs=(PARAM_SPECS, P("data"), P("data")),
                       out_specs=(PARAM_SPECS, P()))
    assert from_file.total_flops() == pytest.approx(from_jax.total_flops(), rel=0.01)
    kinds = lambda g: sorted((n.collective.type, g.communicator(n).size)  # noqa: E731
                             for n in g.collectives())
    assert kinds(from_file) == kinds(from_jax)


def test_per_device_program_runs_on_every_rank(single_file):
    graph = load_stablehlo(single_file, devices=16, hardware="h100-sxm")
    assert graph.meta["sharded"] is False and graph.cluster.devices == 16
    assert graph.cluster.mesh == (("data", 16),)
    assert len(gemms(graph)) == 5 and graph.collectives() == []
    assert gemm_flops(graph) == pytest.approx(HAND_FLOPS, rel=0.01)


def test_per_device_program_takes_the_requested_mesh(single_file):
    graph = load_stablehlo(str(single_file), devices=8, mesh=(("data", 2), ("model", 4)))
    assert graph.cluster.mesh == MESH and graph.collectives() == []


def test_module_text_and_portable_artifact(sharded_file, tmp_path):
    text = sharded_file.read_text()
    assert gemm_flops(load_stablehlo(text, devices=8)) == pytest.approx(HAND_FLOPS / 8,
                                                                        rel=0.01)
    # jax.export serializes a versioned (VHLO) artifact that keeps the sdy mesh as text
    exported = jax.export.export(sharded_jit())(*abstract_args())
    path = tmp_path / "step.mlirbc"
    path.write_bytes(exported.mlir_module_serialized)
    graph = load_stablehlo(path, devices=8)
    assert graph.cluster.mesh == MESH
    assert gemm_flops(graph) == pytest.approx(HAND_FLOPS / 8, rel=0.01)


def test_program_lowered_for_a_large_abstract_mesh():
    # JAX lowers for 1024 devices it does not have through an AbstractMesh
    from jax.sharding import AbstractMesh

    mesh = AbstractMesh((128, 8), ("data", "model"))
    named = lambda spec: NamedSharding(mesh, spec)  # noqa: E731
    params = {k: named(s) for k, s in PARAM_SPECS.items()}
    step = jax.jit(train_step, in_shardings=(params, named(P("data")), named(P("data"))),
                   out_shardings=(params, named(P())))
    f32 = jnp.float32
    batch = jax.ShapeDtypeStruct((16 * BATCH, D), f32)
    args = ({"w1": jax.ShapeDtypeStruct((D, 8 * H), f32),
             "w2": jax.ShapeDtypeStruct((8 * H, D), f32)}, batch, batch)
    text = step.trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    graph = load_stablehlo(text, devices=1024)
    assert graph.cluster.mesh == (("data", 128), ("model", 8))
    assert gemm_flops(graph) == pytest.approx(HAND_FLOPS * 16 * 8 / 1024, rel=0.01)
    assert {(graph.communicator(n).mesh_axes, graph.communicator(n).size)
            for n in graph.collectives()} == {(("data",), 128), (("model",), 8)}


# torch-xla style: GSPMD shardings (mhlo.sharding, a Sharding custom call), no num_partitions
GSPMD = """module @gspmd {
  func.func @main(
      %w: tensor<512x1024xf32> {mhlo.sharding =
          "{devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}"},
      %x: tensor<256x512xf32> {mhlo.sharding = "{devices=[2,1,4]<=[8] last_tile_dim_replicate}"}
  ) -> tensor<256x1024xf32> {
    %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0]
        : (tensor<256x512xf32>, tensor<512x1024xf32>) -> tensor<256x1024xf32>
    %1 = stablehlo.custom_call @Sharding(%0) {mhlo.sharding = "{devices=[2,4]<=[8]}"}
        : (tensor<256x1024xf32>) -> tensor<256x1024xf32>
    return %1 : tensor<256x1024xf32>
  }
}
"""


def test_gspmd_program_without_num_partitions(tmp_path):
    path = tmp_path / "gspmd.mlir"
    path.write_text(GSPMD)
    graph = load_stablehlo(path, devices=8, mesh=MESH)
    assert graph.meta["sharded"] is True and graph.collectives() == []
    assert gemm_flops(graph) == pytest.approx(2 * 256 * 512 * 1024 / 8, rel=0.01)
    with pytest.raises(FlintError, match="shardings over 8 devices but --devices is 16"):
        load_stablehlo(path, devices=16)


# a per-device program whose collective names its peers (explicit replica groups)
ALL_REDUCE = """module @ar {
  func.func @main(%a: tensor<1024xf32>) -> tensor<1024xf32> {
    %0 = "stablehlo.all_reduce"(%a) ({
    ^bb0(%x: tensor<f32>, %y: tensor<f32>):
      %s = stablehlo.add %x, %y : tensor<f32>
      stablehlo.return %s : tensor<f32>
    }) {replica_groups = dense<[[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>}
        : (tensor<1024xf32>) -> tensor<1024xf32>
    return %0 : tensor<1024xf32>
  }
}
"""


def test_per_device_program_with_explicit_replica_groups():
    graph = load_stablehlo(ALL_REDUCE, devices=8, mesh=(("data", 2), ("model", 4)))
    [reduce] = graph.collectives()
    assert reduce.collective.type == "all-reduce"
    assert graph.communicator(reduce).size == 4
    assert graph.communicator(reduce).mesh_axes == ("model",)


BAD = """module {
  func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.add %a, %b : tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}
"""
NO_MAIN = """module {
  func.func @step(%a: tensor<4xf32>) -> tensor<4xf32> {
    return %a : tensor<4xf32>
  }
}
"""


@pytest.mark.parametrize("content, devices, expected", [
    (BAD, 8, r"^program\.mlir:3:\d+: error: use of undeclared SSA value"),
    ("", 8, r"program\.mlir is empty"),
    ("module {\n}\n", 8, r"program\.mlir holds an empty module"),
    (NO_MAIN, 8, r"program\.mlir has no `main` function"),
    ("\x00\xff\xfe", 8, r"neither MLIR text nor MLIR bytecode"),
])
def test_bad_files_raise_one_line(tmp_path, monkeypatch, content, devices, expected):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "program.mlir").write_bytes(content.encode("latin-1"))
    with pytest.raises(FlintError, match=expected) as info:
        load_stablehlo("program.mlir", devices=devices)
    assert "\n" not in str(info.value)


def test_missing_file(tmp_path):
    with pytest.raises(FlintError, match="file not found") as info:
        load_stablehlo(tmp_path / "nope.mlir", devices=8)
    assert "\n" not in str(info.value)


def test_partition_count_must_match_devices(sharded_file, tmp_path):
    with pytest.raises(FlintError, match=r"partitioned for 8 devices .* --devices is 16") as e:
        load_stablehlo(sharded_file, devices=16)
    assert "\n" not in str(e.value)
    # without num_partitions the sdy mesh still pins the device count
    text = sharded_file.read_text().replace("mhlo.num_partitions = 8 : i32, ", "")
    assert "num_partitions" not in text
    with pytest.raises(FlintError, match=r"mesh @mesh \(data=2,model=4\) has 8 devices but "
                                         r"--devices is 16") as e:
        load_stablehlo(text, devices=16)
    assert "\n" not in str(e.value)
    assert load_stablehlo(text, devices=8).meta["sharded"] is True


def test_mesh_must_multiply_to_devices(single_file):
    with pytest.raises(FlintError, match="has 6 devices but --devices is 8"):
        load_stablehlo(single_file, devices=8, mesh=(("data", 2), ("model", 3)))


def test_compile_failure_is_one_line():
    with pytest.raises(FlintError, match="XLA could not compile") as info:
        load_stablehlo(ALL_REDUCE, devices=4)      # its replica groups name 8 devices
    assert "\n" not in str(info.value)


def torchax_exporter():
    """torchax's StableHLO exporter, or a skip saying why it cannot be used here."""
    if importlib.util.find_spec("torchax") is None:
        pytest.skip("torchax is not installed (and torch-xla needs an older torch than this "
                    "environment's), so no PyTorch exporter is available")
    try:
        from torchax.export import exported_program_to_stablehlo
    except Exception as e:  # noqa: BLE001 - e.g. a torchax built against another torch
        pytest.skip(f"torchax does not import with this torch: {type(e).__name__}: "
                    f"{str(e).splitlines()[0] if str(e) else ''}")
    return exported_program_to_stablehlo


def test_torchax_exported_model(tmp_path):
    exported_program_to_stablehlo = torchax_exporter()
    import torch
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 256))
    program = torch.export.export(model, (torch.randn(128, 256),))
    _, exported = exported_program_to_stablehlo(program)
    path = tmp_path / "torchax.mlir"
    path.write_text(exported.mlir_module())
    graph = load_stablehlo(path, devices=8)
    assert graph.meta["sharded"] is False and graph.collectives() == []
    assert len(gemms(graph)) == 2
    assert gemm_flops(graph) == pytest.approx(2 * 2 * 128 * 256 * 1024, rel=0.01)


def test_file_whose_dot_xla_triton_cannot_tile_compiles_as_library_gemm():
    # the output projection of 225-wide heads: XLA's un-autotuned Triton GEMM emitter finds
    # no tiling for it (tests/test_extract_jax.py has the JAX path's twin of this test)
    def project(q, v, w):
        out = jnp.einsum("bhqk,bkhd->bqhd", q, v)
        return out.reshape(-1, out.shape[2] * out.shape[3]) @ w

    S = jax.ShapeDtypeStruct
    text = jax.jit(project).lower(S((2, 8, 256, 256), jnp.bfloat16),
                                  S((2, 256, 8, 225), jnp.bfloat16),
                                  S((8 * 225, 64 * 225), jnp.bfloat16)).as_text()
    graph = load_stablehlo(text, devices=1, hardware="a100-80gb-sxm")
    assert any("xla_gpu_enable_triton_gemm=false" in n for n in graph.meta["compiler_notes"])
    assert gemm_flops(graph) >= 2 * 512 * 1800 * 14400
