"""PyTorch front end: torch twins traced at any world size under fake tensors and a fake
process group; flops against the JAX twin and the model-flops formula; DTensor TP and
FSDP2 collectives with their groups and bytes; pointwise fusion; bad input."""
import json
import math

import pytest
import torch

import flint.torch as ft
from conftest import run_flint
from flint.errors import FlintError
from flint.hardware_models.estimate import estimate
from flint.models.decoder import ZOO, model_flops


def _fsdp_numel(cfg, tp: int, fsdp: int) -> tuple[int, int]:
    """(per-layer, root) parameter elements one FSDP2 all-gather produces: TP-local shapes,
    dim 0 padded to a multiple of the FSDP degree (FSDP2 shards dim 0 evenly)."""
    def padded(rows, cols=1):
        return math.ceil(rows / fsdp) * fsdp * cols
    d, f, hd = cfg.d_model, cfg.d_ff, cfg.head_dim
    layer = (padded(cfg.n_heads * hd // tp, d) + 2 * padded(cfg.n_kv_heads * hd // tp, d)
             + padded(d, cfg.n_heads * hd // tp) + 2 * padded(f // tp, d) + padded(d, f // tp)
             + 2 * padded(d))
    root = 2 * padded(cfg.vocab // tp, d) + padded(d)
    return layer, root


@pytest.fixture(scope="module")
def llama_4096():
    return ft.zoo("llama3-8b", 4096, {"fsdp": 512, "model": 8}, layers=2)


def test_flops_match_the_jax_twin_and_the_formula(llama_4096):
    """Llama-3-8B shapes (2 layers), 4096 ranks: torch vs JAX vs 6*P*T + attention."""
    torch_flops = llama_4096.total_flops()
    r = run_flint("extract", "--model", "llama3-8b", "--layers", "2", "--devices", "4096",
                  "--mesh", "fsdp=512,model=8", "--json")    # the twin's mesh, not the recipe's
    assert r.returncode == 0, r.stderr
    jax_flops = json.loads(r.stdout)["summary"]["flops_per_device"]
    formula = llama_4096.meta["model_flops_per_device"]
    assert formula == model_flops(ZOO["llama3-8b"].with_(n_layers=2), 512 * 8192) / 4096
    assert abs(torch_flops / jax_flops - 1) < 0.02, (torch_flops, jax_flops)
    # the formula counts the attention core non-causal, 3 x 4*B*H*S^2*D; the fused kernels
    # execute the causal half forward and 2.5x that backward: 3.5 x 2*B*H*S^2*D
    cfg = ZOO["llama3-8b"].with_(n_layers=2)
    attention = 12 * cfg.n_layers * cfg.d_model * cfg.seq_len * 512 * 8192 / 4096
    executed = formula - attention + attention * 3.5 * 2 / 12
    assert abs(torch_flops / executed - 1) < 0.02, (torch_flops, executed)


def test_tensor_parallel_all_reduces(llama_4096):
    """Megatron TP=8 with DTensor: per layer 2 forward all-reduces (after wo, w_down) and 5
    backward (the input gradients of wq, wk, wv, w_up, w_gate), all in groups of 8 along
    the model axis, each one bf16 activation [tokens, d_model]."""
    g = llama_4096
    ar = [n for n in g.nodes if n.collective and n.collective.type == "all-reduce"]
    act = 8192 * 4096 * 2
    big = [n for n in ar if n.collective.bytes_in == act]
    assert all(g.communicator(n).size == 8 and g.communicator(n).mesh_axes == ("model",)
               for n in ar)
    fwd = [n for n in big if n.meta["phase"] == "forward"]
    bwd = [n for n in big if n.meta["phase"] == "backward"]
    # + the vocab-parallel embedding (forward) and LM head input gradient (backward)
    assert (len(fwd), len(bwd)) == (2 * 2 + 1, 5 * 2 + 1)
    per_layer = {}
    for n in big:
        per_layer.setdefault(n.meta["layer"], 0)
        per_layer[n.meta["layer"]] += 1
    assert per_layer.get("layers.0") == 7 and per_layer.get("layers.1") == 7


@pytest.mark.parametrize("world,fsdp", [(512, 64), (4096, 512)])
def test_fsdp2_gathers_and_reduce_scatters(world, fsdp, llama_4096):
    cfg = ZOO["llama3-8b"].with_(n_layers=2)
    g = llama_4096 if world == 4096 else ft.zoo("llama3-8b", world,
                                                 {"fsdp": fsdp, "model": 8}, layers=2)
    layer, root = _fsdp_numel(cfg, 8, fsdp)
    ag = [n for n in g.nodes if n.collective and n.collective.type == "all-gather"]
    rs = [n for n in g.nodes if n.collective and n.collective.type == "reduce-scatter"]
    assert all(g.communicator(n).size == fsdp and g.communicator(n).mesh_axes == ("fsdp",)
               for n in ag + rs)
    # bf16 gathers: every layer before its forward and again before its backward; the
    # root's parameters once
    assert sorted(n.collective.bytes_out for n in ag) == sorted([2 * layer] * 4 + [2 * root])
    assert all(n.collective.bytes_in * fsdp == n.collective.bytes_out for n in ag)
    # fp32 gradient reduce-scatters, one per FSDP unit
    assert sorted(n.collective.bytes_in for n in rs) == sorted([4 * layer] * 2 + [4 * root])


def test_fusion_keeps_flops_and_cuts_traffic():
    fused = ft.zoo("tiny", 4, {"fsdp": 2, "model": 2})
    eager = ft.zoo("tiny", 4, {"fsdp": 2, "model": 2}, fuse=False)
    assert fused.total_flops() == pytest.approx(eager.total_flops())
    traffic = [sum(n.bytes_read + n.bytes_written for n in g.nodes) for g in (fused, eager)]
    assert traffic[0] < 0.8 * traffic[1]
    assert len(fused.nodes) < len(eager.nodes)
    assert estimate(fused, "h100-sxm").step_time_s < estimate(eager, "h100-sxm").step_time_s
    assert not fused.meta["unknown_ops"]
    phases = {n.meta["phase"] for n in fused.nodes}
    assert phases == {"forward", "backward", "optimizer"}


def test_sequence_parallel_swaps_all_reduces_for_gather_scatter():
    """TP=2 with sequence parallelism: the activation all-reduces become an all-gather
    before and a reduce-scatter after each column/row-parallel pair (and the reverse in
    backward); only small weight-gradient / loss all-reduces remain."""
    g = ft.zoo("tiny", 4, {"data": 2, "model": 2}, sequence_parallel=True)
    dp = [n for n in g.nodes if n.collective and g.communicator(n).mesh_axes == ("data",)]
    assert dp and all(n.collective.type == "all-reduce" and n.meta["phase"] == "backward"
                      for n in dp)          # plain data parallelism: gradient all-reduces
    act = 64 * 128 * 2            # bf16 [seq, d_model] of one rank's sequence
    colls = [n for n in g.nodes if n.collective and n not in dp]
    kinds = {}
    for n in colls:
        kinds.setdefault(n.collective.type, []).append(n)
    assert all(g.communicator(n).mesh_axes == ("model",) for n in colls)
    assert all(n.collective.bytes_in < act for n in kinds["all-reduce"])
    per_layer = 2 * 2              # attention and MLP, forward and backward
    assert len(kinds["all-gather"]) >= 2 * per_layer
    assert len(kinds["reduce-scatter"]) >= 2 * per_layer


class _Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x):
        return self.lin(x)


class _DataDependent(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x):
        return self.lin(x)[torch.nonzero(x[:, 0] > 0).flatten()]


def test_user_model_and_decorator():
    x = torch.empty(4, 16, device="meta")
    g = ft.extract(_Tiny, (x,), world_size=8)
    mm = [n for n in g.nodes if n.op_class == "gemm"]
    # forward addmm (2MNK + bias) and the weight gradient; the input needs no gradient
    assert sum(n.flops for n in mm) == 2 * (2 * 4 * 16 * 16) + 4 * 16
    import flint

    @flint.capture(devices=8, mesh={"data": 8})
    def train_step(model, optimizer, batch):
        loss = model(batch).square().mean()
        loss.backward()
        optimizer.step()
        return loss

    g2 = train_step.workload(_Tiny, "sgd", x)
    assert {n.meta["phase"] for n in g2.nodes} >= {"forward", "backward", "optimizer"}
    assert g2.cluster.devices == 8


@pytest.mark.parametrize("kwargs,message", [
    ({"model": lambda: 1 / 0}, "building the model raised ZeroDivisionError"),
    ({"parallelize": lambda m, mesh: mesh["nope"]}, "the parallelize function raised"),
    ({"model": _DataDependent}, "failed to trace in module '_DataDependent'"),
])
def test_bad_models_are_one_line(kwargs, message):
    args = {"model": _Tiny, **kwargs}
    with pytest.raises(FlintError) as e:
        ft.extract(args.pop("model"), (torch.empty(4, 16, device="meta"),), world_size=8,
                   **args)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_cli_torch_zoo_and_bad_script(tmp_path):
    r = run_flint("extract", "--framework", "torch", "--model", "tiny", "--devices", "16",
                  "--mesh", "fsdp=8,model=2", "--json", "--out", str(tmp_path / "g.json"))
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)["summary"]
    assert summary["collectives_by_mesh_axis"]["fsdp"]["count"] > 0
    assert (tmp_path / "g.json").exists()
    script = tmp_path / "bad.py"
    script.write_text("def build():\n    return 42\n")
    r = run_flint("extract", f"{script}:build", "--framework", "torch", "--devices", "8",
                  "--out", str(tmp_path / "bad.json"))
    assert r.returncode == 2 and "must return a flint.torch.TorchStep" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "bad.json").exists()


def test_fsdp2_prefetches_all_gathers_on_their_own_stream(llama_4096):
    """FSDP2 issues layer i+1's all-gather (and its copy-in) on its all-gather stream while
    layer i computes, one all-gather ahead (each copy-in waits for the previous copy-out)."""
    from flint.hardware_models.estimate import estimate

    g = llama_4096
    gathers = [n for n in g.nodes if n.collective is not None
               and n.collective.type == "all-gather" and n.meta.get("stream")]
    assert len(gathers) >= 4
    tl = estimate(g, "h100-sxm").timeline
    compute_during = 0
    for k, n in enumerate(gathers):
        copy_ins = [i for i in n.inputs if g.nodes[i].meta.get("stream")]
        assert copy_ins
        if k:   # rate limit: waits for the previous all-gather's copy-out
            assert any(g.nodes[i].control for i in copy_ins)
        s, f = tl.start[n.id], tl.finish[n.id]
        compute_during += any(st == "compute" and a < f and b > s
                              for st, a, b in zip(tl.stream, tl.start, tl.finish))
    assert compute_during >= len(gathers) - 2   # all but the first ones overlap compute


def test_fsdp2_forward_parameter_copy_out_dies_in_the_forward():
    """FSDP2 frees a block's gathered parameters after its forward and gathers them again
    for the backward (its copy-out writes them with out=): the forward copy-out is not
    kept alive by the backward's overwrite, also when selective checkpointing recomputes
    matmuls in the backward."""
    g = ft.zoo("tiny", 4, {"fsdp": 4}, remat="selective", fuse=False)
    users = g.users
    copies = [n for n in g.nodes if n.op == "split_with_sizes_copy"
              and n.meta.get("phase") == "forward" and n.meta.get("scope")]
    layer_copies = [n for n in copies if "Decoder" in n.meta["scope"]]
    assert layer_copies
    for n in layer_copies:
        assert all(g.nodes[u].meta.get("phase") == "forward" for u in users[n.id])
