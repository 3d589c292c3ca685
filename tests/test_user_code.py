"""User code as users write it (issue 20), with JAX and PyTorch only: jit with its own
shardings, a forgotten batch spec, example_args(mesh), flint.virtual_mesh, model flops for
MFU, complex and FP8 tensors, torch.compile inside the step, model factories, and zoo
default meshes that divide the model."""
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import flint
from flint.frontends.sharding_report import ShardingWarning


def _loss_step(w, batch):
    def loss(w):
        return jnp.mean(jnp.tanh(batch @ w) ** 2)
    return w - 0.1 * jax.grad(loss)(w)


W = jax.ShapeDtypeStruct((256, 512), jnp.float32)
BATCH = jax.ShapeDtypeStruct((64, 256), jnp.float32)


def test_jit_with_its_own_shardings_is_rebound_to_the_virtual_mesh():
    mesh = jax.make_mesh((1, 1), ("data", "model"))        # the user's one-device mesh
    jitted = jax.jit(_loss_step, in_shardings=(NamedSharding(mesh, P(None, "model")),
                                               NamedSharding(mesh, P("data"))),
                     out_shardings=NamedSharding(mesh, P(None, "model")))
    step = flint.capture(jitted, devices=8, mesh={"data": 4, "model": 2}, hardware="cpu")
    graph = step.workload(W, BATCH)
    rows = {r[0]: r for r in graph.meta["arguments_sharding"]}
    assert rows["w"][2:4] == ["P(None, 'model')", "jit in_shardings"]
    assert rows["batch"][2] == "P('data',)" and not graph.meta["sharding_warnings"]
    gemm = sum(n.flops for n in graph.nodes if n.op_class == "gemm")
    assert gemm == pytest.approx(2 * 2 * 64 * 256 * 512 / 8)    # forward + dW, per device
    assert graph.meta["model_flops_per_device"] == pytest.approx(3 * 2 * 64 * 256 * 512 / 8)


def test_whole_trace_error_is_one_line():
    from flint.frontends.jax import _one_line

    e = ValueError("Sharding passed to jit does not match\n  arg 0: P('x')\n  got P()")
    assert _one_line(e) == "Sharding passed to jit does not match arg 0: P('x') got P()"


def test_replicated_batch_and_unmatched_rule_warn():
    step = flint.capture(_loss_step, devices=8, mesh={"data": 8}, hardware="cpu",
                         rules=[(r"^w$", P()), (r"^params/", P("data"))])
    with pytest.warns(ShardingWarning) as caught:
        lowered = step.lower(W, BATCH)
    text = " | ".join(str(w.message) for w in caught)
    assert "argument batch (f32[64,256]) is replicated" in text and "8 data-parallel" in text
    assert "rule '^params/' matches no argument" in text
    assert len(lowered.sharding["warnings"]) == 2


def test_virtual_mesh_is_the_abstract_mesh_of_the_cluster():
    with flint.virtual_mesh("data=-1,model=8", devices=4096) as mesh:
        assert jax.sharding.get_abstract_mesh().shape == {"data": 512, "model": 8}
        assert mesh.size == 4096
    assert jax.sharding.get_abstract_mesh().empty


SCRIPT = textwrap.dedent('''
    import jax, jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    def train_step(w, batch):
        def loss(w):
            return jnp.mean(jnp.tanh(batch @ w) ** 2)
        return w - 0.1 * jax.grad(loss)(w)

    rules = [(r"^w$", P(None, "model")), (r"^batch$", P("data"))] if BATCH_RULE else [
        (r"^w$", P(None, "model"))]
    model_flops = 123e9

    def example_args(mesh):
        return (jax.ShapeDtypeStruct((256, 512), jnp.bfloat16),
                jax.ShapeDtypeStruct((8 * mesh.shape["data"], 256), jnp.bfloat16))
''')


@pytest.mark.parametrize("batch_rule", [True, False])
def test_script_example_args_follow_the_mesh(tmp_path, batch_rule):
    from test_hlo_dump import run_cli

    path = tmp_path / "step.py"
    path.write_text(f"BATCH_RULE = {batch_rule}\n" + SCRIPT)
    for devices in (16, 32):
        out = tmp_path / f"g{devices}.json"
        code, _, err = run_cli(["extract", f"{path}:train_step", "--devices", devices,
                                "--mesh", "data=-1,model=2", "--out", out])
        assert code == 0, err
        graph = flint.WorkloadGraph.load(out)
        rows = {r[0]: r for r in graph.meta["arguments_sharding"]}
        assert rows["batch"][1] == f"bf16[{8 * devices // 2},256]"
        assert graph.meta["model_flops_per_device"] == pytest.approx(123e9 / devices)
        warned = [line for line in err.splitlines() if line.startswith("flint: warning:")]
        assert bool(warned) != batch_rule
        if warned:
            assert "argument batch" in warned[0] and "replicated" in warned[0]


def test_zoo_default_mesh_divides_the_model():
    from flint.frontends.steps import default_zoo_mesh

    assert default_zoo_mesh(8, "gpt2-small") == "fsdp=2,model=4"      # 12 heads
    assert default_zoo_mesh(4096, "llama3-8b") == "fsdp=512,model=8"
    from test_hlo_dump import run_cli

    code, _, err = run_cli(["extract", "--framework", "torch", "--model", "gpt2-small",
                            "--devices", "8", "--layers", "1", "--seq-len", "128", "--json"])
    assert code == 0, err


torch = pytest.importorskip("torch")


def test_complex_rotary_and_fp8_gemm_end_to_end():
    import torch.nn as nn

    import flint.torch as ft

    class Fp8Linear(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            ctx.save_for_backward(x, w)
            one = torch.ones((), dtype=torch.float32)
            return torch._scaled_mm(x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn).t(),
                                    scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

        @staticmethod
        def backward(ctx, g):
            x, w = ctx.saved_tensors
            return (g @ w.to(g.dtype)).to(x.dtype), (g.t() @ x.to(g.dtype)).to(w.dtype)

    class Rotary(nn.Module):
        def __init__(self):
            super().__init__()
            self.wq = nn.Linear(256, 256, bias=False)
            angles = torch.outer(torch.arange(64.0), torch.ones(32))
            self.register_buffer("freqs", torch.polar(torch.ones(64, 32), angles))

        def forward(self, x):
            q = self.wq(x).view(2, 64, 4, 32, 2)
            q = torch.view_as_real(torch.view_as_complex(q) * self.freqs.view(1, 64, 1, 32))
            return Fp8Linear.apply(q.reshape(128, 256), self.wq.weight)

    graph = ft.extract(Rotary, (torch.empty(2, 64, 256, device="meta"),), world_size=8)
    outputs = {o.split("[")[0] for n in graph.nodes for o in n.outputs}
    assert {"c64", "f8e4m3fn"} <= outputs and not graph.meta["unknown_ops"]
    scaled = [n for n in graph.nodes if n.op == "_scaled_mm"]
    assert scaled and scaled[0].op_class == "gemm" and scaled[0].flops == 2 * 128 * 256 * 256
    from flint.hardware_models.estimate import estimate

    assert estimate(graph, "h100-sxm").step_time_s > 0


def test_torch_compile_inside_the_step_does_not_crash(tmp_path):
    """Dynamo compiling under make_fx segfaulted the process; the region now traces as
    its eager ops. In a child process, so a crash cannot take the test session down."""
    script = tmp_path / "compiled.py"
    script.write_text(textwrap.dedent('''
        import torch, torch.nn as nn, torch.nn.functional as F
        import flint.torch as ft

        @torch.compile
        def gelu_mul(a, b):
            return F.gelu(a) * b

        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.up, self.gate = nn.Linear(64, 128), nn.Linear(64, 128)
                self.down = nn.Linear(128, 64)

            def forward(self, x):
                return self.down(gelu_mul(self.up(x), self.gate(x)))

        def build():
            return ft.TorchStep(model=M, example_inputs=(torch.empty(8, 64, device="meta"),))
    '''))
    out = tmp_path / "g.json"
    done = subprocess.run([sys.executable, "-m", "flint.cli", "extract", f"{script}:build",
                           "--framework", "torch", "--devices", "8", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-1500:]
    graph = flint.WorkloadGraph.load(out)
    assert any(n.op == "gelu" or "gelu" in n.name for n in graph.nodes)


def test_decorator_takes_a_zero_argument_model_factory():
    import torch.nn as nn

    @flint.capture(devices=8, mesh={"dp": 8})
    def train_step(model, optimizer, x):
        model(x).float().pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()

    graph = train_step.workload(lambda: nn.Linear(64, 32), "adamw",
                                torch.empty(16, 64, device="meta"))
    split = graph.meta["memory_split"]
    assert split["parameters_bytes"] == (64 * 32 + 32) * 4
    assert ["params/weight", 64 * 32 * 4] in graph.meta["arguments"]
    assert split["optimizer_state_bytes"] == 2 * split["parameters_bytes"]
    assert split["gradients_bytes"] == split["parameters_bytes"]


# --- user code as written (issue 28) and the CLI's own state (issue 26) -------------------

DECORATED = textwrap.dedent('''
    import torch, torch.nn as nn
    import flint

    def fsdp(model, mesh):
        from torch.distributed.fsdp import fully_shard
        return fully_shard(model, mesh=mesh["fsdp"])

    @flint.capture(devices=16, mesh={"fsdp": 16}, parallelize=fsdp)
    def train_step(model, optimizer, x):
        model(x).float().pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()

    def example_args():
        return (lambda: nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64)),
                "adamw", torch.empty(4, 64, device="meta"))
''')


def test_decorated_torch_step_is_a_cli_target(tmp_path):
    from conftest import run_cli

    script = tmp_path / "step.py"
    script.write_text(DECORATED)
    for extra, devices in (([], 16), (["--devices", "8"], 8)):
        out = tmp_path / f"g{devices}.json"
        code, _, err = run_cli(["extract", f"{script}:train_step", "--framework", "torch",
                                "--out", out, *extra])
        assert code == 0, err
        graph = flint.WorkloadGraph.load(out)
        assert graph.cluster.devices == devices and dict(graph.cluster.mesh) == {"fsdp": devices}
        gemm = sum(n.flops for n in graph.nodes if n.op_class == "gemm")
        # per rank: two GEMMs forward, their weight gradients and the second one's input
        # gradient (the batch needs none)
        assert gemm == pytest.approx(5 * 2 * 4 * 64 * 256, rel=0.01)
        assert {n.op for n in graph.nodes if n.collective} == {"all-gather", "reduce-scatter"}


def test_torch_twin_honours_remat_and_model_dims():
    import flint.torch as ft
    from flint.hardware_models.memory import estimate_memory

    graphs = {r: ft.zoo("tiny", 8, {"fsdp": 8}, seq_len=64, layers=1, remat=r)
              for r in ("none", "selective", "full")}
    flops = {r: sum(n.flops * n.repeat for n in g.nodes if n.op_class in ("gemm", "attention"))
             for r, g in graphs.items()}
    attention = {r: sum(n.flops * n.repeat for n in g.nodes if n.op_class == "attention")
                 for r, g in graphs.items()}
    gemm = {r: flops[r] - attention[r] for r in flops}
    # selective is torchtitan's op policy: every second matmul re-runs, the attention
    # core keeps its output; full re-runs every GEMM and the core
    assert gemm["none"] < gemm["selective"] < gemm["full"]
    assert attention["none"] == attention["selective"] < attention["full"]
    peak = {r: estimate_memory(g).peak_bytes for r, g in graphs.items()}
    assert peak["full"] < peak["selective"] < peak["none"]
    assert {g.meta["training"]["remat"] for g in graphs.values()} == {"none", "selective",
                                                                      "full"}
    wide = ft.zoo("tiny", 8, {"fsdp": 8}, seq_len=64, layers=1, dims={"hidden": 512,
                                                                      "heads": 8})
    assert wide.total_flops() > 2 * graphs["none"].total_flops()


def test_import_jax_first_then_flint(tmp_path):
    """A script that uses JAX before importing Flint (the CUDA plugin then failed to
    register) still gets compile-only GPU devices."""
    script = tmp_path / "s.py"
    script.write_text(textwrap.dedent('''
        import jax, jax.numpy as jnp
        key = jax.random.key(0)                  # starts JAX's backends before Flint
        import flint
        def step(w, x):
            return jax.grad(lambda w: jnp.mean(jnp.tanh(x @ w)))(w)
        g = flint.capture(step, devices=16, mesh={"data": 16}, hardware="h100-sxm",
                          rules=[("^x", jax.sharding.PartitionSpec("data"))]).workload(
            jax.ShapeDtypeStruct((64, 64), jnp.float32),
            jax.ShapeDtypeStruct((256, 64), jnp.float32))
        print(g.cluster.hardware, g.cluster.devices)
    '''))
    env = {k: v for k, v in __import__("os").environ.items()
           if k not in ("JAX_PLATFORMS", "JAX_SKIP_CUDA_CONSTRAINTS_CHECK")}
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                       timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["h100-sxm", "16"]


def test_library_code_reads_no_cli_state():
    """Nothing below the CLI asks typer/click what was typed: an ExtractRequest says it
    (devices/hardware None: what a dump says)."""
    from pathlib import Path

    root = Path(flint.__file__).parent
    for path in root.rglob("*.py"):
        if "cli" in path.relative_to(root).parts:
            continue
        text = path.read_text()
        assert "typer" not in text and "get_current_context" not in text, path
    from flint.frontends.request import ExtractRequest

    request = ExtractRequest(target="dump_dir")
    assert request.devices is None and request.hardware is None
    assert (request.device_count, request.target_hardware) == (4096, "h100-sxm")


def test_summary_prints_a_report_and_tables_fold_off_a_terminal():
    import io

    from rich.console import Console

    from flint.render import Table, _time_table, render_summary

    step = flint.capture(_loss_step, devices=8, mesh={"data": 8}, hardware="cpu",
                         rules=[(r"^batch$", P("data"))])
    graph = step.workload(W, BATCH)
    summary = graph.summary()
    assert summary == dict(summary) and "Workload graph" in str(summary)
    # a long argument path is folded, never cut with an ellipsis, at 80 columns
    long_name = "state/opt_state/0/mu/params/decoder/layers_0/attention/query/kernel"
    rows = [[f"{long_name}_{i}", "f32[4096,4096]", "P('data',)", "rule x", 2**20 * (i + 1)]
            for i in range(12)]
    text = io.StringIO()
    render_summary({**summary, "arguments_sharding": rows}, Console(file=text, width=80))
    out = text.getvalue()
    assert "…" not in out and "12 arguments" in out
    assert "5 of 12 by bytes per device" in out                     # summarized
    text = io.StringIO()
    render_summary({**summary, "arguments_sharding": rows}, Console(file=text, width=80),
                   verbose=True)
    assert "12 of 12" in text.getvalue()
    assert isinstance(Table(), object)
    # busy time: each collective once (by type), the rows sum to the total
    table = _time_table({"by_class_s": {"gemm": 2.0, "collective": 1.5},
                         "collectives_s": {"all-reduce": 1.0, "all-gather": 0.5}})
    cells = table.columns[0]._cells
    assert "collective" not in cells and cells.count("collective: all-reduce") == 1
    assert table.columns[1]._cells[-1] == "3.50 s"


def test_composable_replicate_reduces_its_buckets_as_ddp():
    import torch.nn as nn

    import flint.torch as ft
    from torch.distributed._composable.replicate import replicate

    def parallelize(model, mesh):
        replicate(model, process_group=mesh.get_group(), bucket_cap_mb=0.01)
        return model

    graph = ft.extract(lambda: nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64)),
                       (torch.empty(16, 64, device="meta"),), world_size=8, mesh={"dp": 8},
                       parallelize=parallelize)
    reduces = [n for n in graph.nodes if n.collective]
    # gradients become ready last layer first: one bucket per layer at a 10 KiB cap
    assert [n.collective.bytes_in for n in reduces] == [(256 * 64 + 64) * 4,
                                                         (64 * 256 + 256) * 4]
    assert all(n.op == "all-reduce" and n.collective.window for n in reduces)
    assert not graph.meta["program_warnings"]
