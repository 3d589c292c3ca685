"""GPUs without a compile target of their own (V100, AMD Instinct MI300X / MI325X): their
programs compile for a stated target, they are priced on their own figures, and the
prediction says both."""
import pytest

from conftest import run_cli
from flint.errors import FlintError
from flint.graph import Node, NodeKind
from flint.hardware_models import attention_kernels
from flint.hardware_models.compute import RooflineCompute, attention_family
from flint.hardware_models.network import DEFAULT_BUS_EFFICIENCY, NetworkModel
from flint.cluster import Cluster
from flint.hardware_models.spec import SPECS_DIR, load_spec
from flint.run import TrainingRun

# a graph's cuDNN fused-attention node, as passes.hlo_cost reads it off a GPU program
CUDNN_ATTENTION = {"batch": 1, "heads": 16, "kv_heads": 16, "seq_q": 2048, "seq_kv": 2048,
                   "head_dim": 128, "causal": True, "backward": False, "dtype": "bf16",
                   "impl": "cudnn"}


def attention_node() -> Node:
    flops = 4.0 * 16 * 2048 * 2048 * 128 / 2
    return Node(0, "fmha", NodeKind.COMPUTE, "custom-call", "attention", flops=flops,
                operands=["bf16[1,2048,16,128]"], outputs=["bf16[1,2048,16,128]"],
                meta={"attention": dict(CUDNN_ATTENTION)})


def test_volta_runs_16_bit_gemms_as_fp16_and_f32_gemms_on_its_fp32_units():
    spec = load_spec("v100-sxm2")
    assert "bf16" not in spec.peak_flops and "tf32" not in spec.peak_flops
    assert spec.peak("bf16") == spec.peak_flops["fp16"] == 125e12
    assert spec.peak("tf32") == spec.peak_flops["fp32"] == 15.7e12
    # an A100 keeps its TF32 rate for XLA's f32 GEMMs
    assert load_spec("a100-80gb-sxm").peak("tf32") == 156e12


def test_a_compiled_cudnn_attention_node_runs_as_each_generation_runs_attention():
    """Volta has no fused attention: the node is priced as unfused attention (its score
    GEMMs and softmax passes through HBM); AMD Instinct runs its own fused kernels at its
    spec's figure; NVIDIA Hopper keeps cuDNN's."""
    node = attention_node()
    assert attention_family(node, "volta") == "unfused"
    assert attention_family(node, "cdna3") == "native"
    assert attention_family(node, "hopper") == "cudnn"
    v100 = RooflineCompute(load_spec("v100-sxm2"))
    unfused = attention_kernels.unfused_time(
        CUDNN_ATTENTION, 125e12 * 0.67, 80, 900e9 * 0.88, v100.launch_overhead())
    assert v100.compute_time(node) == pytest.approx(unfused)
    mi300x = RooflineCompute(load_spec("mi300x"))
    fused = attention_kernels.fused_time(node.flops, CUDNN_ATTENTION, 1307.4e12 * 0.44, 304,
                                         304 * 2.1e9 * 16)
    assert mi300x.compute_time(node) == pytest.approx(fused)
    # on H100 the same node is cuDNN's, priced at H100's native figure
    h100 = RooflineCompute(load_spec("h100-sxm"))
    assert h100.compute_time(node) < mi300x.compute_time(node)


def test_a_stated_bus_efficiency_replaces_the_default():
    """MI300X's rccl-tests plateau (315 of 448 GB/s) is its spec's figure; a spec stating
    none keeps the default share."""
    cluster = Cluster(8, (("data", 8),))
    mi300x = NetworkModel(load_spec("mi300x"), cluster)
    assert mi300x.up.bandwidth == pytest.approx(448e9 * 0.70)
    h100 = NetworkModel(load_spec("h100-sxm"), cluster)
    assert h100.up.bandwidth == pytest.approx(450e9 * DEFAULT_BUS_EFFICIENCY["scale_up"])


def test_prediction_states_the_target_it_compiled_for(tmp_path):
    """A V100 / MI300X run compiles for its spec's stated target, shares that target's
    stage program, and says so; an H100 run says nothing of it."""
    from flint.engine import predict

    base = dict(model="tiny", seq_len=64, devices=8)
    p = predict(TrainingRun(**base, hardware="mi300x"), cache=tmp_path)
    h = predict(TrainingRun(**base, hardware="h100-sxm"), cache=tmp_path)
    assert p.program_key == h.program_key and not h.extracted
    assert p.facts["compiled_for"].startswith("compiled for h100-sxm")
    assert "ROCm" in p.facts["compiled_for_why"]
    assert "compiled_for" not in h.facts and "sixteen_bit" not in h.facts
    assert p.facts["attention_kernels"] == [attention_kernels.NATIVE_NAMES["cdna3"]]
    assert p.step_time_s != h.step_time_s
    # V100 has no fused attention: its `flash` compiles the unfused program, as
    # `attention: unfused` on an A100 does (the same stage program)
    v = predict(TrainingRun(**base, hardware="v100-dgx2", devices_per_host=8), cache=tmp_path)
    a = predict(TrainingRun(**base, hardware="a100-80gb-sxm", attention="unfused"),
                cache=tmp_path)
    assert v.program_key == a.program_key != h.program_key
    assert v.facts["compiled_for"].startswith("compiled for a100-80gb-sxm")
    assert "FP16 tensor rate" in v.facts["sixteen_bit"]
    assert v.facts["attention_core"].startswith("unfused: v100-dgx2 has no fused attention")
    assert v.step_time_s > a.step_time_s            # 125 against 312 TFLOP/s


def test_cli_report_has_the_graph_line(tmp_path, monkeypatch):
    monkeypatch.setenv("FLINT_CACHE", str(tmp_path))
    code, stdout, _ = run_cli(["predict", "--model", "tiny", "--seq-len", "64", "--devices",
                               "8", "--hardware", "mi325x"])
    assert code == 0 and "compiled for h100-sxm" in stdout and "mi325x" in stdout


def test_a_spec_without_a_compile_target_is_refused(tmp_path):
    text = (SPECS_DIR / "mi300x.yaml").read_text()
    lines = [line for line in text.splitlines() if not line.startswith("compile_target")]
    path = tmp_path / "mi300x-untargeted.yaml"
    path.write_text("\n".join(lines))
    with pytest.raises(FlintError, match="names no compile target"):
        TrainingRun(model="tiny", seq_len=64, devices=8, hardware=str(path))


def test_volta_has_no_cudnn_attention_to_name():
    with pytest.raises(FlintError, match="attention: cudnn has no kernels for v100-sxm2"):
        TrainingRun(model="tiny", seq_len=64, devices=8, hardware="v100-sxm2",
                    attention="cudnn")


def test_h800_and_a800_are_their_twins_with_fewer_nvlinks():
    """The export parts: the H100 / A100 die (same target, same rates) with 8 NVLinks, so
    a tensor-parallel all-reduce inside the node takes longer and nothing else changes."""
    from flint.graph import Collective, Communicator

    comm = Communicator(0, "groups", "{{0,1,2,3,4,5,6,7}}", 8, 8, 1, ("model",))
    node = Node(0, "ar", NodeKind.COLLECTIVE, "all-reduce", "collective",
                collective=Collective("all-reduce", 0, 256 << 20, 256 << 20, "bf16"))
    cluster = Cluster(8, (("model", 8),))
    for part, twin in (("h800-sxm", "h100-sxm"), ("a800-80gb-sxm", "a100-80gb-sxm")):
        spec, base = load_spec(part), load_spec(twin)
        assert spec.compile_target == twin and spec.peak("bf16") == base.peak("bf16")
        assert spec.scale_up_bandwidth == 200e9 and spec.scale_up_links == 8
        slow = NetworkModel(spec, cluster).time(node, comm)
        fast = NetworkModel(base, cluster).time(node, comm)
        assert slow > 1.3 * fast, part


def test_the_dgx2h_is_the_dgx2_at_its_raised_clocks():
    """DGX-2H: the same V100s and fabric as the DGX-2 at 2.1 instead of 2 PFLOPS per 16
    GPUs (its 450 W power limit), so its tensor rate is 2.1/2.0 of the DGX-2's and its
    memory and links are the DGX-2's."""
    h, base = load_spec("v100-dgx2h"), load_spec("v100-dgx2")
    assert h.peak("fp16") == pytest.approx(2.1e15 / 16) == pytest.approx(base.peak("fp16") * 1.05)
    assert h.peak("bf16") == h.peak("fp16")          # no BF16 on Volta: 16-bit runs as FP16
    assert (h.compile_target, h.hbm_bandwidth, h.scale_up_bandwidth, h.devices_per_node) == (
        base.compile_target, base.hbm_bandwidth, base.scale_up_bandwidth, base.devices_per_node)
