"""The eight training steps of issue 28, as their users write them (examples/), each
extracted at a small size: flops against a hand count, the collectives the parallelism
implies, and the GEMM precision the user asked for.

Flax Linen with logical axis rules, equinox, plain JAX (scan + checkpoint policy +
shard_map), gradient accumulation with fori_loop, Hugging Face Qwen2 with FSDP2 and a
MixedPrecisionPolicy, nanoGPT with DDP and torch.autocast("cuda"), torch TP + SP + FSDP2
on a 2-D mesh, and a Hugging Face Llama config.json on the command line. The examples'
constants are shrunk (layers, widths, sequence) so each test takes seconds; tests skip
where their optional library (flax, optax, equinox, transformers) is missing.
"""
import importlib.util
import json
from pathlib import Path

import pytest

from conftest import run_cli

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _example(name: str, **constants):
    spec = importlib.util.spec_from_file_location(f"flint_pattern_{name}",
                                                  EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for key, value in constants.items():
        assert hasattr(module, key), key
        setattr(module, key, value)
    return module


def _gemm_flops(graph) -> float:
    return sum(n.flops * n.repeat for n in graph.nodes if n.op_class == "gemm")


def _gemm_dtypes(graph, phase=None) -> set:
    return {n.operands[0].split("[")[0] for n in graph.nodes if n.op_class == "gemm"
            and (phase is None or n.meta.get("phase") == phase)}


def _collectives(graph, kind=None, axes=None) -> list:
    out = []
    for n in graph.nodes:
        if n.collective is None or (kind and n.collective.type != kind):
            continue
        if axes is not None and graph.communicators[n.collective.communicator].mesh_axes \
                != tuple(axes):
            continue
        out.append(n)
    return out


def _jax_graph(module, mesh: dict, hardware="cpu", **capture):
    import flint
    from flint.frontends.virtual_mesh import virtual_mesh

    devices = 1
    for size in mesh.values():
        devices *= size
    with virtual_mesh(mesh) as abstract:
        args = module.example_args(abstract)
    step = flint.capture(module.train_step, devices=devices, mesh=mesh, hardware=hardware,
                         rules=getattr(module, "rules", None), **capture)
    return step.workload(*args)


# --- JAX ------------------------------------------------------------------------------

def test_flax_linen_logical_rules_inside_and_outside_the_virtual_mesh():
    pytest.importorskip("flax.linen")
    pytest.importorskip("optax")
    import flax.linen as nn
    import jax

    import flint

    dims = dict(VOCAB=1024, D_MODEL=128, HEADS=4, LAYERS=2, FFN=512, SEQ=128,
                SEQS_PER_REPLICA=1)
    m = _example("flax_linen_logical", **dims)
    mesh = {"data": 4, "model": 2}
    graph = _jax_graph(m, mesh)                  # example_args inside flint.virtual_mesh
    d, f, v, s, layers = 128, 512, 1024, 128, 2
    tokens = 4 * s // 4                          # one sequence per data replica, per device
    forward = 2 * tokens * (layers * (4 * d * d + 2 * d * f) + d * v) / 2   # TP halves
    forward += 2 * tokens * layers * 2 * s * d / 2          # scores and values, heads / TP
    assert _gemm_flops(graph) == pytest.approx(3 * forward, rel=0.03)
    # parameters carry the logical rules' specs; the batch its own
    rows = {r[0]: r for r in graph.meta["arguments_sharding"]}
    assert rows["params/layers_0/up/kernel"][2] == "P(None, 'model')"
    assert rows["params/layers_0/query/kernel"][2] == "P(None, 'model', None)"
    assert rows["batch/tokens"][2] == "P('data',)"
    # Megatron TP all-reduces over `model`, the gradient all-reduce over `data`
    assert _collectives(graph, "all-reduce", ["model"])
    assert _collectives(graph, "all-reduce", ["data"])
    assert not graph.meta["program_warnings"]

    # outside any mesh: logical specs -> PartitionSpecs by the rules, given as in_specs
    tokens_sds = jax.ShapeDtypeStruct((4, s), "int32")

    def init():
        params = m.model.init(jax.random.key(0), jax.numpy.zeros((4, s), "int32"))["params"]
        return params, m.optimizer.init(params)

    with nn.logical_axis_rules(m.LOGICAL_RULES):
        abstract = jax.eval_shape(init)
        specs = nn.logical_to_mesh(nn.get_partition_spec(abstract))
    params, opt_state = nn.meta.unbox(abstract)
    batch = {"tokens": tokens_sds, "targets": tokens_sds}
    batch_specs = {"tokens": jax.sharding.PartitionSpec("data"),
                   "targets": jax.sharding.PartitionSpec("data")}
    outside = flint.capture(m.train_step, devices=8, mesh=mesh, hardware="cpu",
                            in_specs=(specs[0], specs[1], batch_specs)).workload(
        params, opt_state, batch)
    assert _gemm_flops(outside) == pytest.approx(_gemm_flops(graph), rel=1e-6)


def test_equinox_modules_with_functions_are_partitioned_automatically():
    pytest.importorskip("equinox")
    pytest.importorskip("optax")
    dims = dict(VOCAB=512, D_MODEL=64, HEADS=4, LAYERS=2, SEQ=64, SEQS_PER_REPLICA=2)
    m = _example("equinox_gpt", **dims)
    graph = _jax_graph(m, {"data": 8})
    d, v, s, layers = 64, 512, 64, 2
    tokens = 2 * s                                   # per device
    # q, k, v, o (with biases: eqx's MultiheadAttention), MLP d -> 4d -> d, head; the
    # attention core over the whole (masked) sequence
    forward = 2 * tokens * (layers * (4 * d * d + 8 * d * d) + d * v)
    forward += 2 * tokens * layers * 2 * s * d
    assert _gemm_flops(graph) == pytest.approx(3 * forward, rel=0.03)
    # replicated parameters: one gradient all-reduce over `data` (XLA combines them)
    reduces = _collectives(graph, "all-reduce", ["data"])
    params = layers * (4 * (d * d + d) + 2 * d + (d * 4 * d + 4 * d) + (4 * d * d + d) + 2 * d) \
        + v * d + s * d + 2 * d + d * v
    assert sum(n.collective.bytes_in for n in reduces) == pytest.approx(4 * params, rel=0.01)
    # the activation functions were closed over: no argument row for them
    assert not any("activation" in r[0] for r in graph.meta["arguments_sharding"])
    training = graph.meta["training"]
    assert (training["seq_len"], training["global_batch"]) == (64, 16)
    assert training["source"].startswith("argument batch/")


def test_plain_jax_scan_checkpoint_policy_and_shard_map():
    dims = dict(VOCAB=1024, D=128, HEADS=4, FFN=512, LAYERS=3, SEQ=128, SEQS_PER_REPLICA=1)
    m = _example("jax_scan_remat", **dims)
    graph = _jax_graph(m, {"data": 4, "model": 2})
    d, f, v, s, layers = 128, 512, 1024, 128, 3
    t = s                                            # tokens per device (1 sequence)
    qkv, wo, up, down = 2 * t * 3 * d * d / 2, 2 * t * d * d / 2, 2 * t * d * f / 2, \
        2 * t * f * d / 2
    core = 2 * t * 2 * s * d / 2                     # scores + values, heads split by XLA
    head = 2 * t * d * v / 2
    per_layer = qkv + wo + up + down + core
    # backward: two GEMMs per forward GEMM; the policy saves the attention output and the
    # MLP input, so q/k/v, the attention core and the up projection run again
    recompute = qkv + core + up
    hand = 3 * (layers * per_layer + head) + layers * recompute
    assert _gemm_flops(graph) == pytest.approx(hand, rel=0.03)
    assert {lp.trip_count for lp in graph.loops} == {layers}
    # shard_map's psum over `model` is an all-reduce in each layer's forward and backward
    tp = _collectives(graph, "all-reduce", ["model"])
    assert sum(n.repeat for n in tp) >= 2 * layers


def test_gradient_accumulation_with_fori_loop_fsdp():
    pytest.importorskip("optax")
    dims = dict(VOCAB=1024, D=128, FFN=512, LAYERS=2, SEQ=64, MICRO_BATCHES=3,
                SEQS_PER_MICRO_BATCH=1)
    m = _example("jax_grad_accum", **dims)
    graph = _jax_graph(m, {"fsdp": 8}, hardware="h100-sxm")
    d, f, v, s, layers, micro = 128, 512, 1024, 64, 2, 3
    forward = 2 * s * (layers * 2 * d * f + d * v)   # one sequence per device and micro-batch
    assert _gemm_flops(graph) == pytest.approx(micro * 3 * forward, rel=0.03)
    assert micro in {lp.trip_count for lp in graph.loops}
    assert _gemm_dtypes(graph) == {"bf16"}
    # FSDP: parameters gathered, gradients reduce-scattered, over `fsdp`
    assert _collectives(graph, "all-gather", ["fsdp"])
    assert _collectives(graph, "reduce-scatter", ["fsdp"])
    assert graph.meta["training"]["global_batch"] == micro * 8


# --- PyTorch --------------------------------------------------------------------------

def _torch_graph(step, mesh: dict):
    from flint.frontends.torch_capture import capture

    devices = 1
    for size in mesh.values():
        devices *= size
    return capture(step, devices, tuple(mesh.items()), "h100-sxm").workload()


def test_hf_qwen2_fsdp2_mixed_precision():
    pytest.importorskip("transformers")
    m = _example("hf_qwen2_fsdp2", SEQ=128)
    d, heads, kv, f, v, layers = 128, 4, 2, 384, 1024, 2
    graph = _torch_graph(m.qwen2(hidden_size=d, num_attention_heads=heads,
                                 num_key_value_heads=kv, intermediate_size=f, vocab_size=v,
                                 num_hidden_layers=layers), {"fsdp": 8})
    t, kv_dim = 128, d // heads * kv
    matmul = 2 * t * (layers * (2 * d * d + 2 * d * kv_dim + 3 * d * f) + d * v)
    assert _gemm_flops(graph) == pytest.approx(3 * matmul, rel=0.02)
    # bf16 compute from FSDP2's param_dtype; fp32 gradient reduce-scatters (reduce_dtype)
    assert _gemm_dtypes(graph, "forward") == {"bf16"}
    rs = _collectives(graph, "reduce-scatter", ["fsdp"])
    ag = _collectives(graph, "all-gather", ["fsdp"])
    assert len(rs) == layers + 1 and {n.collective.dtype for n in rs} == {"f32"}
    assert len(ag) >= layers + 1 and {n.collective.dtype for n in ag} == {"bf16"}
    assert not graph.meta["program_warnings"]


NANO = dict(VOCAB=512, N_EMBD=64, N_HEAD=4, N_LAYER=2, BLOCK=64, MICRO_BATCH=2, GRAD_ACCUM=2)


def _nanogpt(autocast_device="cuda", **constants):
    import torch

    from flint.frontends.torch_capture import TorchStep

    m = _example("nanogpt_ddp", **{**NANO, **constants})
    m.ctx = torch.autocast(device_type=autocast_device, dtype=torch.bfloat16)
    model, optimizer, x, y = m.example_args()
    step = TorchStep(model, (x, y), optimizer=optimizer, parallelize=m.train_step.cfg.parallelize,
                     step_fn=m.train_step.fn)
    return m, step


@pytest.fixture(scope="module")
def nanogpt_cuda():
    m, step = _nanogpt("cuda", BUCKET_CAP_MB=0.05)
    return m, _torch_graph(step, {"dp": 8})


def test_nanogpt_ddp_buckets_autocast_and_tied_weights(nanogpt_cuda):
    m, graph = nanogpt_cuda
    d, v, s, layers, b, accum = 64, 512, 64, 2, 2, 2
    # tied embedding and LM head: counted once
    params = v * d + s * d + layers * (12 * d * d + 13 * d) + 2 * d
    assert graph.meta["memory_split"]["parameters_bytes"] == 4 * params
    # GEMMs: every micro-step's forward and backward, all bf16 under autocast("cuda")
    tokens = accum * b * s
    matmul = 2 * tokens * (layers * 12 * d * d + d * v)
    assert _gemm_flops(graph) == pytest.approx(3 * matmul, rel=0.02)
    assert _gemm_dtypes(graph) == {"bf16"}
    # the batch the step trains on: every micro-step's sequences, on every rank
    training = graph.meta["training"]
    assert (training["seq_len"], training["micro_batches"]) == (s, accum)
    assert training["global_batch"] == 8 * accum * b
    # DDP: one all-reduce per bucket, only on the last micro-step, over all ranks
    report = graph.meta["capture"]["ddp"][0]
    reduces = _collectives(graph, "all-reduce", ["dp"])
    assert [n.collective.bytes_in for n in reduces] == report["buckets_bytes"]
    assert sum(report["buckets_bytes"]) == 4 * params
    cap = report["bucket_cap_bytes"]
    assert cap == int(0.05 * 2**20) == report["first_bucket_cap_bytes"]   # no default: cap
    for size in report["buckets_bytes"][:-1]:                  # DDP closes a bucket at cap
        assert size >= cap
    # each bucket goes out during the backward and overlaps what follows
    assert all(n.meta["phase"] == "backward" and n.collective.window for n in reduces)
    assert len(reduces) == len(report["buckets_bytes"]) > 2
    assert not graph.meta["program_warnings"]


def test_ddp_default_buckets_are_1_mib_then_25_mib():
    from flint.frontends.torch_ddp import _Reduction  # noqa: F401  (the rules under test)

    m, step = _nanogpt("cuda", VOCAB=8192, N_EMBD=512, N_LAYER=2, GRAD_ACCUM=1)
    graph = _torch_graph(step, {"dp": 8})
    report = graph.meta["capture"]["ddp"][0]
    assert (report["first_bucket_cap_bytes"], report["bucket_cap_bytes"]) == (2**20, 25 * 2**20)
    sizes = report["buckets_bytes"]
    reduces = _collectives(graph, "all-reduce", ["dp"])
    assert [n.collective.bytes_in for n in reduces] == sizes
    assert sum(sizes) == graph.meta["memory_split"]["parameters_bytes"]
    # the first bucket closes at 1 MiB (its last gradient may take it past), the others
    # at 25 MiB; the last holds what is left (the tied 16 MiB embedding, ready last)
    assert sizes[0] >= 2**20 and all(b >= 25 * 2**20 for b in sizes[1:-1])
    assert sizes[-1] >= 8192 * 512 * 4


def test_autocast_cuda_traces_what_autocast_cpu_does(nanogpt_cuda):
    from flint.hardware_models.estimate import estimate

    _, cuda = nanogpt_cuda
    m, step = _nanogpt("cpu", BUCKET_CAP_MB=0.05)
    cpu = _torch_graph(step, {"dp": 8})
    assert [(n.op, n.outputs) for n in cuda.nodes] == [(n.op, n.outputs) for n in cpu.nodes]
    assert estimate(cuda, "h100-sxm").step_time_s == estimate(cpu, "h100-sxm").step_time_s


def test_torch_tp_sequence_parallel_and_fsdp2_on_a_2d_mesh():
    dims = dict(VOCAB=1024, DIM=128, HEADS=8, KV_HEADS=4, FFN=384, LAYERS=2, SEQ=128)
    m = _example("torch_tp_sp_fsdp2", **dims)
    graph = _torch_graph(m.llama(), {"dp": 2, "tp": 4})
    d, hd, kv, f, v, layers, s, tp = 128, 16, 4, 384, 1024, 2, 128, 4
    matmul = 2 * s * (layers * (2 * d * d + 2 * d * kv * hd + 3 * d * f) + d * v) / tp
    assert _gemm_flops(graph) == pytest.approx(3 * matmul, rel=0.02)
    assert _gemm_dtypes(graph, "forward") == {"bf16"}
    # sequence parallelism: per layer, an all-gather of the sequence shards before the
    # attention and the MLP (the norms' fp32 output under autocast) and a reduce-scatter
    # after them (the bf16 row-parallel output); the backward mirrors both
    act = {s * d * 2, s * d * 4}                     # one whole activation, bf16 or fp32
    gathers = [n for n in _collectives(graph, "all-gather", ["tp"])
               if n.collective.bytes_out in act]
    scatters = [n for n in _collectives(graph, "reduce-scatter", ["tp"])
                if n.collective.bytes_in in act]
    for found in (gathers, scatters):
        for phase in ("forward", "backward"):
            assert len([n for n in found if n.meta["phase"] == phase]) >= 2 * layers
    # no activation all-reduce over tp (only the norms' small weight gradients)
    assert all(n.collective.bytes_in <= 4 * d for n in _collectives(graph, "all-reduce", ["tp"]))
    # FSDP2 over dp
    assert _collectives(graph, "all-gather", ["dp"]) and _collectives(graph, "reduce-scatter",
                                                                       ["dp"])


# --- Hugging Face config.json on the command line ---------------------------------------

LLAMA_CONFIG = EXAMPLES / "llama_3_2_1b_config.json"


def test_hf_config_without_a_sequence_length_stops_with_the_flag():
    code, out, err = run_cli(["extract", "--model", LLAMA_CONFIG, "--devices", "8"])
    assert code == 2 and not out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "--seq-len" in lines[0] and "131072" in lines[0]


def test_hf_config_with_a_sequence_length_states_it(tmp_path):
    out = tmp_path / "g.json"
    code, _, err = run_cli(["extract", "--model", LLAMA_CONFIG, "--devices", "8",
                            "--mesh", "fsdp=8", "--seq-len", "256", "--n-layers", "1",
                            "--hardware", "cpu", "--out", out])
    assert code == 0, err
    import flint

    graph = flint.WorkloadGraph.load(out)
    assert graph.meta["training"]["seq_len"] == 256
    assert graph.meta["training"]["global_batch"] == 8
    cfg = json.loads(LLAMA_CONFIG.read_text())
    d, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    kv = cfg["num_key_value_heads"] * cfg["head_dim"]
    matmul = 2 * 256 * (2 * d * d + 2 * d * kv + 3 * d * f + d * v)   # one layer + head
    assert _gemm_flops(graph) == pytest.approx(3 * matmul, rel=0.03)


def test_readme_framework_table_commands_name_real_steps():
    """Every one-line command of the README's "Your framework" table names an example
    that exists and defines the function it names (the tests above extract each)."""
    import re

    readme = (EXAMPLES.parent / "README.md").read_text()
    section = readme.split("## Your framework", 1)[1].split("\n## ", 1)[0]
    table = "\n".join(line for line in section.splitlines() if line.startswith("|"))
    commands = re.findall(r"`(flint extract [^`]+)`", table)
    assert len(commands) >= 9
    for command in commands:
        target = command.split()[2]
        if ".py:" not in target:
            continue
        path, fn = target.split(":")
        source = (EXAMPLES.parent / path).read_text()
        assert re.search(rf"^def {fn}\(", source, re.M), command
    assert "examples/llama_3_2_1b_config.json --seq-len" in table
    # every example the table names has a command of its own (flags differ per example:
    # jax_grad_accum reads an `fsdp` axis, jax_scan_remat `data` and `model`)
    named = set(re.findall(r"examples/\w+\.py", table))
    assert named == {c.split()[2].split(":")[0] for c in commands if ".py:" in c}, named


def test_an_example_reading_a_mesh_axis_the_mesh_lacks_names_it():
    from conftest import run_cli

    pytest.importorskip("optax")
    code, _, err = run_cli(["extract", f"{EXAMPLES / 'jax_grad_accum.py'}:train_step",
                            "--devices", "8", "--mesh", "data=8"])
    assert code == 2 and err.count("\n") == 1, err
    assert "mesh axis 'fsdp'" in err and "(axes: data)" in err and "--mesh" in err
