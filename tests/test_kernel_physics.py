"""Kernel physics of the compute model: GEMM tiles and waves, kernel populations (library,
XLA-generated, eager, inductor) and their launches, attention kernels by era."""
import dataclasses

import pytest

from flint.cluster import Cluster
from flint.graph import Node, NodeKind, WorkloadGraph
from flint.hardware_models.spec import load_spec


def test_gemm_tiles_and_waves():
    """Wave quantization: a GEMM whose tiles just overflow one wave takes two; large GEMMs
    approach the spec's achievable share of peak."""
    from flint.hardware_models import kernels
    from flint.hardware_models.compute import RooflineCompute

    h100 = load_spec("h100-sxm")
    roof = RooflineCompute(h100)

    def gemm(m, n, k):
        return Node(0, "g", NodeKind.COMPUTE, "dot", "gemm", flops=2.0 * m * n * k,
                    operands=[f"bf16[{m},{k}]", f"bf16[{k},{n}]"], outputs=[f"bf16[{m},{n}]"])

    rate = 989.4e12 * 0.75
    big = gemm(16384, 16384, 16384)
    assert roof.compute_time(big) == pytest.approx(big.flops / rate * (1 + 2 * 64 / 16384),
                                                   rel=0.02)
    # 132 tiles of 128x256 fill one wave exactly; 133 would need two waves of every shape
    one_wave = kernels.GemmShape(1, 128 * 12, 256 * 11, 4096)
    assert kernels.gemm_time(one_wave, rate, 132) == pytest.approx(
        2.0 * 128 * 12 * 256 * 11 * 4096 / rate * (4096 / 64 + 2) / (4096 / 64), rel=1e-6)
    # 4096 x 1024 x 2560 (MaxText's query projection): 128 tiles of 128x256 in one wave
    # and 256 of 128x128 in two run the same main loops; the larger tile is the one, so
    # beside a collective that holds 16 SMs the grid needs a second wave: twice as long
    # (the shared MaxText H100 trace: the GEMMs under 50 us ran 2.0x their time alone)
    tie = kernels.GemmShape(1, 4096, 1024, 2560)
    alone = kernels.gemm_time(tie, rate, 132, persistent=True)
    assert alone == pytest.approx(2.0 * 4096 * 1024 * 2560 / rate * (40 + 2) / 40 * 132 / 128)
    beside = kernels.gemm_time(tie, rate, 132, persistent=True, free=116)
    assert beside / alone == pytest.approx((2 * 40 + 2) / (40 + 2))
    # a small GEMM cannot fill the machine: far below the large-GEMM share
    small = gemm(256, 256, 256)
    assert small.flops / roof.compute_time(small) < 0.1 * rate
    assert roof.time(small) >= h100.kernel_floor


def test_kernel_populations_bandwidth_and_grids():
    """XLA loop fusions (vectorized) and library/eager kernels stream at the stream share
    of HBM; the LLVM emitters' reductions are unvectorized: SMs x the per-SM in-flight
    rate on H100, and only the SMs their grid occupies (a column reduction keeping 768
    elements launches 24 blocks of 1024 threads); on A100 the stream share binds first for
    a full grid."""
    from flint.hardware_models import kernels, populations
    from flint.hardware_models.compute import RooflineCompute

    loop = Node(0, "loop_add_fusion", NodeKind.COMPUTE, "fusion", "elementwise",
                bytes_read=1e9, bytes_written=1e9, meta={"fusion_kind": "kLoop"})
    dus = dataclasses.replace(loop, name="transpose_fusion", meta={"fusion_kind": "kInput"})
    rows = Node(1, "input_reduce_fusion", NodeKind.COMPUTE, "fusion", "reduction",
                bytes_read=8192 * 768 * 2, operands=["bf16[8192,768]"], outputs=["f32[8192]"],
                meta={"fusion_kind": "kInput", "xla_emitters": "legacy"})
    cols = dataclasses.replace(rows, outputs=["f32[768]"])
    h100, a100 = RooflineCompute(load_spec("h100-sxm")), RooflineCompute(load_spec("a100-40gb-sxm"))
    stream = 3.35e12 * 0.9
    per_sm = kernels.GENERATED_BYTES_PER_SM_S
    for node in (loop, dataclasses.replace(loop, meta={"aten": "aten::add"}),
                 dataclasses.replace(loop, meta={"kernel_source": "library"})):
        assert h100.memory_bandwidth(node) == pytest.approx(stream)
    assert h100.memory_bandwidth(dus) == pytest.approx(132 * per_sm)
    assert populations.reduction_blocks(rows) == 8192
    assert h100.memory_bandwidth(rows) == pytest.approx(132 * per_sm)
    assert populations.reduction_blocks(cols) == 24 * 2       # 768/32 columns, 8192/4096 rows
    assert h100.memory_bandwidth(cols) == pytest.approx(48 * 1024 / 2048 * per_sm)
    assert a100.memory_bandwidth(rows) == pytest.approx(1.555e12 * 0.88)
    assert a100.memory_bandwidth(cols) == pytest.approx(24 * per_sm)
    # eager kernels are launched by the host, XLA's from command buffers; views launch none
    eager = dataclasses.replace(loop, meta={"aten": "aten::add"})
    assert populations.host_launches(eager) == 1 and populations.host_launches(loop) == 0
    assert populations.host_launches(dataclasses.replace(eager, bytes_read=0,
                                                         bytes_written=0)) == 0


def test_eager_kernels_wait_for_their_launches():
    """A run of short eager kernels is launch-bound: each starts once the host has issued
    it (LAUNCH_S apart); the same kernels from XLA's command buffers run back to back."""
    from flint.hardware_models.populations import LAUNCH_S
    from flint.hardware_models.schedule import simulate

    tiny = dict(kind=NodeKind.COMPUTE, op="add", op_class="elementwise", bytes_read=8.0)
    nodes = [Node(i, f"k{i}", inputs=[i - 1] if i else [], **tiny) for i in range(10)]
    xla = WorkloadGraph(Cluster(1, (("data", 1),)), nodes, [])
    eager = WorkloadGraph(Cluster(1, (("data", 1),)),
                          [dataclasses.replace(n, meta={"aten": "aten::add"}) for n in nodes], [])
    durations = [1e-6] * 10
    assert simulate(xla, durations).step_time == pytest.approx(10e-6)
    tl = simulate(eager, durations)
    assert tl.step_time == pytest.approx(10 * LAUNCH_S + 1e-6)
    assert sum(tl.launch_wait) == pytest.approx(tl.step_time - 10e-6)

def test_attention_kernels_by_era():
    """FlashAttention-3 at head dim 128 on long sequences runs at the spec's native anchor;
    its head-dim scaling (GEMMs grow with D, the block's exponentials do not) reproduces the
    FlashAttention-3 paper's 497 / 756 TFLOP/s at D = 64 / 256 within 10%; FlashAttention-2
    is slower, and unfused attention (scores through HBM) slower still. Backward kernels
    run at the FA3 paper's Fig. 7 rates (about 0.87 of their forward at head dim 128)."""
    from flint.hardware_models.compute import RooflineCompute
    from flint.passes.attention import attention_cost

    h100 = RooflineCompute(load_spec("h100-sxm"))

    def tflops(impl, d, s=16384, causal=False, meta=None, backward=False):
        b, h = 16384 // s, 2048 // d
        flops, rd, wr = attention_cost(b, h, h, s, s, d, causal, backward)
        attn = {"batch": b, "heads": h, "kv_heads": h, "seq_q": s, "seq_kv": s, "head_dim": d,
                "causal": causal, "backward": backward, "impl": impl}
        node = Node(0, "a", NodeKind.COMPUTE, "fused-attention", "attention", flops=flops,
                    bytes_read=rd, bytes_written=wr, operands=["bf16[1]"],
                    meta={"attention": attn, **(meta or {})})
        return flops / h100.time(node) / 1e12

    assert tflops("flash3", 128) == pytest.approx(989.4 * 0.655, rel=0.06)
    assert tflops("flash3", 64) == pytest.approx(497, rel=0.1)
    assert tflops("flash3", 256) == pytest.approx(756, rel=0.1)
    assert tflops("flash3", 128, 512) < 0.75 * tflops("flash3", 128)     # few KV blocks
    assert tflops("flash2", 128) < 0.65 * tflops("flash3", 128)
    unfused = tflops("unfused", 128, 8192, meta={"kernel_source": "eager"})
    assert 0.1 * tflops("flash2", 128) < unfused < 0.5 * tflops("flash2", 128)
    # the backward (FA3 paper Fig. 7): five GEMMs per block at the rate that leaves the
    # anchor at BACKWARD_SHARE of the forward's; head dim 64 follows from the model
    for impl, fig7_128, fig7_64 in (("flash3", 561, 474), ("flash2", 322, 291)):
        assert tflops(impl, 128, backward=True) == pytest.approx(fig7_128, rel=0.06)
        assert tflops(impl, 64, backward=True) == pytest.approx(fig7_64, rel=0.06)
        assert tflops(impl, 128, backward=True) < 0.9 * tflops(impl, 128)


def test_flash_attention_v1_runs_at_the_fa2_papers_range_for_it():
    """FlashAttention (v1) on A100 at "25-40% of the theoretical maximum" and about half of
    FlashAttention-2 (FA2 paper abstract); a run with attention flash1 compiles the same
    program as flash (the kernel is stamped by the kernel-population pass) and its
    attention nodes take about twice as long."""
    from flint.engine import _cache, layered_graph, stage_program
    from flint.errors import FlintError
    from flint.hardware_models.attention_kernels import FA1_A100_RANGE
    from flint.hardware_models.compute import RooflineCompute
    from flint.passes.attention import attention_cost
    from flint.passes.kernel_population import KernelPopulation
    from flint.run import TrainingRun

    a100 = RooflineCompute(load_spec("a100-80gb-sxm"))
    b, h, s, d = 1, 16, 16384, 128
    flops, rd, wr = attention_cost(b, h, h, s, s, d, False, False)
    attn = {"batch": b, "heads": h, "kv_heads": h, "seq_q": s, "seq_kv": s, "head_dim": d,
            "causal": False, "backward": False}
    rate = {}
    for impl in ("flash1", "flash2"):
        node = Node(0, "a", NodeKind.COMPUTE, "fused-attention", "attention", flops=flops,
                    bytes_read=rd, bytes_written=wr, operands=["bf16[1]"],
                    meta={"attention": dict(attn, impl=impl)})
        rate[impl] = flops / a100.time(node) / a100.spec.peak("bf16")
    lo, hi = FA1_A100_RANGE
    assert lo <= rate["flash1"] <= hi
    assert rate["flash1"] == pytest.approx(0.53 * rate["flash2"], rel=0.03)

    model = {"base": "llama3-8b", "layers": 4, "seq": 2048, "vocab": 32000}
    runs = {a: TrainingRun(model=model, devices=8, hardware="a100-80gb-sxm", attention=a)
            for a in ("flash", "flash1")}
    assert stage_program(runs["flash"]) == stage_program(runs["flash1"])
    from flint.engine import predict
    from flint.hardware_models.composite import template_of

    for a, run in runs.items():
        g, _ = layered_graph(run, _cache(None))
        attention = [n for n in template_of(g).nodes
                     if isinstance(n.meta.get("attention"), dict)]
        assert attention and all(n.meta["attention"].get("impl") == (
            "flash1" if a == "flash1" else None) for n in attention)
    seconds = {a: predict(run).by_class_s["attention"] for a, run in runs.items()}
    assert seconds["flash1"] == pytest.approx(seconds["flash"] / 0.53, rel=0.1)
    with pytest.raises(FlintError, match="unknown attention kernel"):
        KernelPopulation("megatron", "flash4")
    with pytest.raises(FlintError, match="attention"):
        TrainingRun(model=model, devices=8, attention="flash4")


def test_native_attention_on_blackwell_is_bound_by_its_exponentials():
    """With no fused-attention figure of its own, a GPU's native kernels run their GEMMs at
    Hopper's share of the dense peak (recovered from FA3's H100 anchor) and their
    exponentials at the GPU's own SFU rate: on Blackwell (16 per clock per SM against twice
    Hopper's tensor rate per SM) a block spends about half its time in exponentials;
    Blackwell Ultra doubles the SFU rate and gets Hopper's 0.655 back. A spec that states
    its own figure keeps it."""
    from flint.hardware_models import attention_kernels
    from flint.hardware_models.compute import attention_rate

    assert attention_kernels.NATIVE_MMA_SHARE == pytest.approx(0.974, abs=0.002)
    share = {}
    for name in ("h100-sxm", "b200", "gb200-nvl72", "gb300-nvl72"):
        spec = load_spec(name)
        share[name] = attention_rate(spec, spec.peak("bf16"), native=True)[0] / spec.peak("bf16")
    assert share["h100-sxm"] == pytest.approx(0.655)                     # stated
    assert share["b200"] == pytest.approx(0.49, abs=0.01)
    assert share["gb200-nvl72"] == pytest.approx(share["b200"], abs=0.01)
    assert share["gb300-nvl72"] == pytest.approx(0.655, abs=0.005)
    # a what-if on the SFU rate moves Blackwell's native attention, not its GEMMs
    faster = load_spec("gb200-nvl72", ["exponentials_per_clock=32"])
    assert attention_rate(faster, faster.peak("bf16"), True)[0] == pytest.approx(
        0.655 * faster.peak("bf16"), rel=0.01)


def test_pytorch_runs_sdpa_flash_attention_2_on_every_gpu():
    """PyTorch's SDPA puts its vendored FlashAttention-2 first (a PyTorch H100 profile runs
    pytorch_flash::flash_fwd_kernel), so the torch frameworks' fused attention is priced as
    FlashAttention-2, slower on Hopper than the FlashAttention-3 / cuDNN kernels that
    Megatron-Core runs; a pinned kernel (flash1) still wins."""
    from flint.cluster import Cluster
    from flint.graph import WorkloadGraph
    from flint.hardware_models.compute import RooflineCompute
    from flint.passes.attention import attention_cost
    from flint.passes.kernel_population import KernelPopulation

    b, h, s, d = 2, 32, 8192, 128
    flops, rd, wr = attention_cost(b, h, h, s, s, d, True, False)
    attn = {"batch": b, "heads": h, "kv_heads": h, "seq_q": s, "seq_kv": s, "head_dim": d,
            "causal": True, "backward": False, "dtype": "bf16"}
    node = Node(0, "a", NodeKind.COMPUTE, "fused-attention", "attention", flops=flops,
                bytes_read=rd, bytes_written=wr, operands=["bf16[1]"],
                meta={"attention": attn})
    graph = WorkloadGraph(Cluster(1, (("data", 1),)), [node], [], [], {})
    stamped = {f: KernelPopulation(f).run(graph).nodes[0] for f in
               ("megatron", "xla", "torch-eager", "torch-compile")}
    impls = {f: n.meta["attention"].get("impl") for f, n in stamped.items()}
    assert impls == {"megatron": None, "xla": None, "torch-eager": "flash2",
                     "torch-compile": "flash2"}
    pinned = KernelPopulation("torch-eager", "flash1").run(graph).nodes[0]
    assert pinned.meta["attention"]["impl"] == "flash1"
    h100 = RooflineCompute(load_spec("h100-sxm"))
    t = {f: h100.time(n) for f, n in stamped.items()}
    assert t["torch-eager"] > 1.5 * t["megatron"]


def test_a_run_names_its_fused_attention_kernel():
    """attention flash2 | flash3 | cudnn pins the fused kernel a run's library runs (a
    PyTorch build whose SDPA selects cuDNN says cudnn): the compiled program is flash's,
    the kernel is priced as named; a kernel the framework or GPU has not is refused in one
    line; a traced SDPA op that names its back end keeps it unless the run names one."""
    from flint.engine import _cache, layered_graph, predict, stage_program
    from flint.errors import FlintError
    from flint.hardware_models.composite import template_of
    from flint.passes.aten_cost import attention_meta
    from flint.passes.kernel_population import KernelPopulation
    from flint.run import TrainingRun

    model = {"base": "llama3-8b", "layers": 2, "seq": 2048, "vocab": 32000}
    runs = {a: TrainingRun(model=model, devices=8, hardware="h100-sxm", attention=a,
                           framework="torch-eager", zero=3) for a in ("flash", "cudnn")}
    assert stage_program(runs["flash"]) == stage_program(runs["cudnn"])
    impls = {}
    for a, run in runs.items():
        g, _ = layered_graph(run, _cache(None))
        impls[a] = {n.meta["attention"]["impl"] for n in template_of(g).nodes
                    if isinstance(n.meta.get("attention"), dict)}
    assert impls == {"flash": {"flash2"}, "cudnn": {"cudnn"}}
    predicted = {a: predict(run) for a, run in runs.items()}
    seconds = {a: p.by_class_s["attention"] for a, p in predicted.items()}
    assert seconds["cudnn"] < 0.75 * seconds["flash"]       # cuDNN/FA3 class on Hopper
    # the prediction states the kernel it priced
    assert {a: p.facts["attention_kernels"] for a, p in predicted.items()} == {
        "flash": ["FlashAttention-2"], "cudnn": ["cuDNN fused attention"]}
    for fields, message in (
            (dict(framework="torch-eager", attention="flash3"), "SDPA's fused attention"),
            (dict(hardware="a100-80gb-sxm", attention="flash3"), "runs on hopper"),
            (dict(hardware="tpu-v5p", framework="xla", attention="cudnn"),
             "is a GPU kernel")):
        with pytest.raises(FlintError, match=message):
            TrainingRun(model=model, devices=8, **fields)

    class Tensor:                         # what attention_meta reads of a fake tensor
        def __init__(self, *shape):
            self.shape, self.dtype = shape, None
    q = Tensor(1, 8, 1024, 128)
    traced = attention_meta("_scaled_dot_product_cudnn_attention", (q, q, q),
                            {"is_causal": True})
    assert traced["impl"] == "cudnn"
    assert "impl" not in attention_meta("_scaled_dot_product_flash_attention_for_cpu",
                                        (q, q, q), {})
    node = Node(0, "a", NodeKind.COMPUTE, "sdpa", "attention", flops=1e9,
                meta={"attention": traced})
    graph = WorkloadGraph(Cluster(1, (("data", 1),)), [node], [], [], {})
    kept = KernelPopulation("torch-eager").run(graph).nodes[0]
    pinned = KernelPopulation("torch-eager", "flash2").run(graph).nodes[0]
    assert (kept.meta["attention"]["impl"], pinned.meta["attention"]["impl"]) == (
        "cudnn", "flash2")


def test_tma_generations_pay_for_misaligned_gemm_widths():
    """Hopper's cuBLAS kernels need 16-byte aligned N and K (TMA strides): off that they
    keep 0.38 (4-byte aligned) or 0.15 (odd bf16 widths) of their rate, as an H200
    measured (scripts/tables/h200_capture/physics.json); M is free; Ampere pays nothing."""
    from flint.hardware_models.compute import RooflineCompute
    from flint.hardware_models.kernels import GemmShape, alignment_share

    assert alignment_share(GemmShape(1, 8192, 4100, 4096), 2) == 0.38
    assert alignment_share(GemmShape(1, 8192, 4096, 4097), 2) == 0.15
    assert alignment_share(GemmShape(1, 8197, 4096, 4096), 2) == 1.0
    assert alignment_share(GemmShape(1, 8192, 4097, 4096), 4) == 0.38     # tf32: 4 bytes
    # an FP8 GEMM's FLOPs carry its scaling, so K from them can be off by one: K must be
    # an operand's dim, else no check (a fidelity row's 70B FP8 GEMMs read K 8193)
    fp8 = GemmShape(1, 4096, 7168, 8193)
    assert alignment_share(fp8, 1, ["f8e4m3fn[4096,8192]", "f8e4m3fn[8192,7168]"]) == 1.0
    assert alignment_share(GemmShape(1, 4096, 7168, 8191), 1,
                           ["f8e4m3fn[4096,8191]", "f8e4m3fn[8191,7168]"]) == 0.15

    def gemm(m, n, k):
        return Node(0, "mm", NodeKind.COMPUTE, "dot", "gemm", flops=2.0 * m * n * k,
                    operands=[f"bf16[{m},{k}]", f"bf16[{k},{n}]"], outputs=[f"bf16[{m},{n}]"],
                    bytes_read=2.0 * (m * k + k * n), bytes_written=2.0 * m * n)

    h200, a100 = RooflineCompute(load_spec("h200")), RooflineCompute(load_spec("a100-80gb-sxm"))
    assert h200.compute_time(gemm(8192, 4097, 4096)) > 5 * h200.compute_time(
        gemm(8192, 4096, 4096))
    assert a100.compute_time(gemm(8192, 4097, 4096)) < 1.1 * a100.compute_time(
        gemm(8192, 4096, 4096))


def test_tpu_matmuls_priced_from_libtpu_convolution_outputs():
    """libtpu writes dots as convolutions in tiled layouts: a trailing unit dim, a feature
    dim split in two, a fused reduction's output first. None of them is a small GEMM dim
    the MXU would pad (the bug: 128x the time of the product bf16[8,2048,8192,1])."""
    from flint.hardware_models import kernels
    from flint.hardware_models.compute import RooflineCompute

    big = 2.0 * 16384 * 8192 * 10240
    want = kernels.GemmShape(1, 16384, 8192, 10240)
    assert kernels.tpu_gemm_shape(big, ["bf16[8,2048,8192,1]"]) == want
    assert kernels.tpu_gemm_shape(big, ["f32[8,2048]", "f32[8,2048,8192]"]) == want
    assert kernels.tpu_gemm_shape(2.0 * 8192 * 1280 * 16384, ["bf16[8192,2,640]"]) == \
        kernels.GemmShape(1, 16384, 640, 16384)
    spec = load_spec("tpu-v5p")
    roof = RooflineCompute(spec)
    node = Node(0, "fusion.1", NodeKind.COMPUTE, "fusion", "conv", flops=big,
                outputs=["bf16[8,2048,8192,1]"], operands=["bf16[8,2048,1,10240]"])
    ideal = big / (spec.peak("bf16") * spec.gemm_fraction)
    assert roof.compute_time(node) == pytest.approx(ideal, rel=1e-6)
    # a real small dim is still padded to the MXU's 128: head dim 64 as K costs 2x
    small = Node(1, "fusion.2", NodeKind.COMPUTE, "fusion", "conv", flops=2.0 * 4096 * 4096 * 64,
                 outputs=["bf16[4096,4096]"])
    assert roof.compute_time(small) == pytest.approx(
        2 * small.flops / (spec.peak("bf16") * spec.gemm_fraction), rel=1e-6)
    # the TPU specs' GEMM share: XLA's 8192^3 bf16 matmul on v5e (JAX's Pallas TPU guide)
    assert all(load_spec(s).gemm_fraction == 0.92 for s in ("tpu-v4", "tpu-v5e", "tpu-v5p"))
