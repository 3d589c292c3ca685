"""NVFP4 training as Transformer Engine's NVFP4BlockScaling runs it (flint.models.nvfp4,
passes.nvfp4_storage): E2M1 tensors at half a byte, their GEMMs at the FP4 tensor rate,
block scales written by the cast that reads the tensor; refused where the GPU has no FP4
tensor cores."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import cli_json_per, run_cli
from flint.errors import FlintError
from flint.graph import Node, NodeKind, WorkloadGraph
from flint.hardware_models.spec import load_spec


def _node(i, name, op_class, inputs, outputs, operands, read, written):
    return Node(i, name, NodeKind.COMPUTE, "fusion", op_class, list(inputs),
                bytes_read=read, bytes_written=written, outputs=list(outputs),
                operands=list(operands))


def test_containers_become_e2m1_and_block_scales_ride_on_the_cast():
    """Every f8e4m3fn value is an E2M1 tensor: half a byte per element, read so by the
    GEMM (whose dtype is then FP4); the block-scale kernel reads nothing its cast reads
    again and writes one byte per block; other nodes are untouched."""
    from flint.passes.nvfp4_storage import Nvfp4Storage

    x, scales, q = "bf16[256,64]", "f32[256,4]", "f8e4m3fn[256,64]"
    nodes = [
        _node(0, "x", "elementwise", [], [x], [], 0, 256 * 64 * 2),
        _node(1, "block_amax", "elementwise", [0], [scales], [x, "f32[]"],
              256 * 64 * 2 + 4, 256 * 4 * 4),
        _node(2, "cast", "elementwise", [0, 1], [q], [x, scales],
              256 * 64 * 2 + 256 * 4 * 4, 256 * 64),
        _node(3, "gemm", "gemm", [2], ["bf16[256,128]"], [q, "f8e4m3fn[64,128]"],
              256 * 64 + 64 * 128, 256 * 128 * 2),
    ]
    out = Nvfp4Storage().run(WorkloadGraph(None, nodes, [], [], {}))
    blocks, cast, gemm = out.nodes[1], out.nodes[2], out.nodes[3]
    assert cast.outputs == ["f4e2m1fn[256,64]"] and cast.bytes_written == 256 * 64 / 2
    assert cast.bytes_read == 256 * 64 * 2 + 256 * 4          # one byte per block scale
    assert blocks.bytes_read == 4 and blocks.bytes_written == 256 * 4
    assert gemm.operands == ["f4e2m1fn[256,64]", "f4e2m1fn[64,128]"]
    assert gemm.bytes_read == (256 * 64 + 64 * 128) / 2
    assert out.nodes[0] == nodes[0]
    spec = load_spec("gb300-nvl72")
    assert spec.peak("f4e2m1fn") == spec.peak_flops["fp4"] == 3 * spec.peak("f8e4m3fn")


def test_the_twin_multiplies_with_every_gemm_quantized():
    """The twin's NVFP4 linear is a real product: forward and both gradients close to the
    bf16 ones (the container's rounding, not E2M1's, at this size), with three FP8-container
    GEMMs in the compiled step."""
    from flint.models.nvfp4 import nvfp4_matmul

    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((2, 32, 64)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((64, 48)) / 8, jnp.bfloat16)

    def loss(f):
        return lambda a, b: jnp.sum(jnp.square(f(a, b).astype(jnp.float32)))

    got = jax.grad(loss(nvfp4_matmul), argnums=(0, 1))(x, w)
    want = jax.grad(loss(jnp.matmul), argnums=(0, 1))(x, w)
    for g, r in zip(got, want):
        g, r = np.asarray(g, np.float32), np.asarray(r, np.float32)
        assert np.linalg.norm(g - r) / np.linalg.norm(r) < 0.15
    jaxpr = str(jax.make_jaxpr(jax.grad(loss(nvfp4_matmul), argnums=(0, 1)))(x, w))
    assert jaxpr.count("dot_general") == 3


def test_an_nvfp4_run_prices_fp4_gemms_and_says_how_it_scales(tmp_path):
    """An NVFP4 Megatron run on Blackwell: its linears' GEMMs read E2M1 operands (none is
    left in an FP8 container), their time falls well below MXFP8's (not to half: the LM
    head stays bf16, small GEMMs are bound by their bytes), and the report names the
    recipe and the MFU basis."""
    model = tmp_path / "llama2l.yaml"       # Llama 3 8B's GEMM shapes, two layers
    model.write_text("base: llama3-8b\nlayers: 2\nseq: 1024\nvocab: 32000\n")
    argv = ["predict", "--model", str(model), "--seq-len", "1024", "--devices", "4",
            "--global-batch", "8", "--hardware", "b200", "--json"]
    out = cli_json_per(argv, "--precision", ("mxfp8", "nvfp4"))
    fp4, fp8 = out["nvfp4"], out["mxfp8"]
    dtypes = fp4["facts"]["gemm_dtypes"]
    assert "f4e2m1fn" in dtypes and "f8e4m3fn" not in dtypes
    assert fp4["by_class_s"]["gemm"] < 0.8 * fp8["by_class_s"]["gemm"]
    assert "NVFP4BlockScaling" in fp4["facts"]["fp4_scaling"]
    code, stdout, stderr = run_cli(argv[:-1] + ["--precision", "nvfp4"])
    assert code == 0 and "FP4 GEMMs at up to four" in stdout


def test_nvfp4_needs_fp4_tensor_cores():
    """Hopper has no FP4 tensor cores: one line naming the problem, exit 2; the torch twin
    has no NVFP4 linears (torchao's are a different recipe) and says so."""
    from flint.run import TrainingRun
    from flint.run_checks import check_run

    code, stdout, stderr = run_cli(["predict", "--model", "tiny", "--seq-len", "256",
                                    "--devices", "4", "--global-batch", "8",
                                    "--precision", "nvfp4"])
    assert code == 2 and "FP4 tensor cores" in stderr and "Traceback" not in stderr
    assert len(stderr.strip().splitlines()) == 1
    with pytest.raises(FlintError, match="nvfp4"):
        check_run(TrainingRun(model="tiny", seq_len=256, devices=4, global_batch=8,
                              hardware="b200", precision="nvfp4", framework="torch-eager"))


def test_extract_writes_the_zoo_twin_with_e2m1_tensors(tmp_path):
    """`flint extract --model tiny --gemm-precision nvfp4`: the written graph holds E2M1
    tensors where the twin's program held FP8 containers, and its GEMMs read them."""
    from flint.graph import WorkloadGraph

    out = tmp_path / "nvfp4.json"
    code, stdout, stderr = run_cli(["extract", "--model", "tiny", "--devices", "2",
                                    "--hardware", "b200", "--gemm-precision", "nvfp4",
                                    "--out", str(out)])
    assert code == 0, stderr
    graph = WorkloadGraph.load(out)
    shapes = [s for n in graph.nodes for s in n.outputs + n.operands]
    assert not any("f8e4m3fn[" in s for s in shapes)
    assert any(n.op_class == "gemm" and n.operands[0].startswith("f4e2m1fn[")
               for n in graph.nodes)


def test_plan_refuses_nvfp4_without_fp4_tensor_cores_and_prices_it_on_blackwell():
    """`flint plan --precision nvfp4` on Hopper: one line, exit 2, before any search; the
    planner's quick model rates NVFP4 GEMMs at the FP4 peak (above FP8's) on Blackwell."""
    from flint.hardware_models.spec import load_spec
    from flint.plan_model import Machine

    code, stdout, stderr = run_cli(["plan", "--model", "tiny", "--devices", "8",
                                    "--seq-len", "256", "--global-batch", "16",
                                    "--precision", "nvfp4"])
    assert code == 2 and "FP4 tensor cores" in stderr and "Traceback" not in stderr
    model = Machine(load_spec("gb300-nvl72"))
    assert model.gemm_rate("nvfp4") == 3 * model.gemm_rate("fp8")


def test_megatron_nvfp4_runs_tp_communication_whole_unless_told():
    """Megatron-Bridge's performance recipes turn TP communication overlap off for NVFP4
    (`tp_comm_overlap = False if precision == "nvfp4"`): the run's default follows; an
    explicit setting stays; other precisions keep it on."""
    from flint.run import TrainingRun

    base = dict(model="llama3-70b", seq_len=8192, devices=64, tp=4, pp=2, global_batch=64,
                hardware="gb200-nvl72")
    assert TrainingRun(**base, precision="mxfp8").tp_comm_overlap
    assert not TrainingRun(**base, precision="nvfp4").tp_comm_overlap
    assert TrainingRun(**base, precision="nvfp4", tp_comm_overlap=True).tp_comm_overlap
    assert TrainingRun(**base, precision="nvfp4").replace(precision="fp8").tp_comm_overlap


def test_fidelity_nvfp4_pairs_each_nvfp4_row_with_its_mxfp8_sibling():
    """scripts/fidelity_nvfp4.py (README) sets an NVFP4 row beside the MXFP8 row of the
    same release, model, system and GPU count, and says where their layouts differ."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    from fidelity import load_cases
    from fidelity_nvfp4 import layout, nvfp4_pairs

    pairs = {fp4.label.split()[0]: (fp4, mx) for fp4, mx in nvfp4_pairs(load_cases("published"))}
    fp4, mx = pairs["1a#79"]
    assert mx.label.startswith("1a#78 ") and "MXFP8" in mx.label
    assert layout(fp4) == layout(mx) == "2/4/5/1"
    fp4, mx = pairs["1a#35"]                  # 405B on GB300: NVFP4 at TP4, MXFP8 at TP2
    assert layout(fp4) != layout(mx)
    assert all("NVFP4" in a.label and "MXFP8" in b.label for a, b in pairs.values())
