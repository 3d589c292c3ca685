"""LoRA fine-tuning (flint.models.lora): the frozen base's weight gradients, gradient
reductions and optimizer state are absent from the compiled step; the adapters add skinny
GEMMs, a small reduction and their own optimizer state."""
import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import LLAMA6, run_cli

from flint.engine import predict
from flint.errors import FlintError
from flint.run import TrainingRun
from flint.stage import stage_program
from flint.template_cache import TemplateCache

FULL = dict(model=LLAMA6, devices=8, tp=2, global_batch=8, hardware="h100-sxm")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return TemplateCache(tmp_path_factory.mktemp("lora-cache"))


def _template(store, run):
    return store.get(stage_program(run))[0]


def test_the_step_drops_the_frozen_weights_gradients(store):
    from flint.passes.pipeline_stages import task_of

    full = TrainingRun(**FULL)
    lora = replace(full, lora_rank=16)
    gemm, reduced = {}, {}
    for run in (full, lora):
        g = _template(store, run)
        tasks = task_of(g)
        gemm[run] = sum(n.flops * n.repeat for n in g.nodes if str(n.op_class) == "gemm")
        reduced[run] = sum(n.collective.bytes_in for n in g.nodes
                           if n.collective is not None and tasks[n.id] == "R")
    # forward + input gradients of the frozen weights: 2/3 of the full step's GEMM work,
    # plus the adapters' rank-16 GEMMs (about 1 % here)
    assert 0.6 < gemm[lora] / gemm[full] < 0.7
    # only the adapters' gradients are reduced over the data-parallel ranks
    assert 0 < reduced[lora] < 0.01 * reduced[full]


def test_combined_adapter_reduction_is_the_backward_s(store):
    """XLA concatenates the adapters' small gradients into one all-reduce after the last
    backward node, with no op metadata: it is still the step's gradient reduction (R),
    overlapped with the backward, not optimizer work after it."""
    from flint.passes.pipeline_stages import task_of

    g = _template(store, TrainingRun(**{**FULL, "tp": 1, "lora_rank": 16}))
    tasks = task_of(g)
    reductions = [n for n in g.nodes if n.collective is not None
                  and n.collective.type == "all-reduce" and n.collective.bytes_in > 1024]
    assert reductions and all(n.meta.get("phase") is None for n in reductions)
    assert all(tasks[n.id] == "R" for n in reductions)


def test_lora_prices_faster_and_holds_a_frozen_base(store):
    full = TrainingRun(**FULL)
    lora = replace(full, lora_rank=16)
    p_full, p_lora = predict(full, cache=store), predict(lora, cache=store)
    assert 0.6 * p_full.step_time_s < p_lora.step_time_s < 0.9 * p_full.step_time_s
    args = p_lora.memory["arguments_bytes"]
    base = TrainingRun(**FULL).model_config()
    from flint.models.decoder import param_count

    # the frozen base in bf16, split over the two tensor-parallel ranks (norms replicated)
    assert args["frozen_parameters"] == pytest.approx(2 * param_count(base) / 2, rel=0.02)
    assert args["optimizer_state"] < 0.02 * p_full.memory["arguments_bytes"]["optimizer_state"]
    assert p_lora.memory_bytes < p_full.memory_bytes
    # MFU counts the LoRA step's own model flops (4 per frozen weight and token, not 6):
    # the same tokens in less time at a lower flop count
    ratio = p_lora.mfu / p_full.mfu
    assert ratio < p_full.step_time_s / p_lora.step_time_s * 0.75
    assert "lora16:qkv,proj,fc1,fc2" in lora.label()


def test_an_fp8_base_is_read_without_a_cast(store):
    """NeMo's fp8_params (Transformer Engine's fp8_model_init): the frozen linears are held
    in FP8, so the step neither casts them nor holds their bf16 copies."""
    run = TrainingRun(**{**FULL, "tp": 1}, precision="fp8", lora_rank=16)
    fp8 = replace(run, lora_base="fp8")
    g_bf16, g_fp8 = _template(store, run), _template(store, fp8)

    def cast_bytes(g):     # kernels writing a weight ([d_in, d_out], not [b, s, d]) in E4M3
        return sum(n.bytes_read for n in g.nodes if str(n.op_class) != "gemm" and any(
            o.startswith("f8e4m3fn[") and o.count(",") == 1 for o in n.outputs))
    assert cast_bytes(g_fp8) < 0.1 * cast_bytes(g_bf16)
    p_bf16, p_fp8 = predict(run, cache=store), predict(fp8, cache=store)
    frozen = (p_bf16.memory["arguments_bytes"]["frozen_parameters"],
              p_fp8.memory["arguments_bytes"]["frozen_parameters"])
    assert 0.5 < frozen[1] / frozen[0] < 0.75      # linears at 1 byte, embedding/head at 2
    assert p_fp8.step_time_s < p_bf16.step_time_s


def test_model_flops_count_forward_and_input_gradients():
    from flint.models.train import build

    mesh = (("data", 2),)
    full = build("tiny", mesh, 1, 64, False, "selective", False, 2)
    lora = build("tiny", mesh, 1, 64, False, "selective", False, 2, lora=(4, "attention"))
    cfg = lora.info
    attention = cfg["tokens"] * 12 * 2 * 4 * 32 * 64        # layers, heads, head dim, seq
    weights = full.info["model_flops"] - attention
    assert cfg["model_flops"] == pytest.approx(weights * 4 / 6 + attention
                                               + cfg["tokens"] * 6 * cfg["trained_params"])
    assert cfg["lora_weights"] == ["wq", "wk", "wv", "wo"] and cfg["lora_rank"] == 4
    assert cfg["params"] == full.info["params"]      # the base model's count


@pytest.mark.parametrize("fields, message", [
    ({"lora_rank": 16, "framework": "torch-eager", "zero": 0}, "modelled in the JAX twin"),
    ({"lora_rank": 15, "tp": 2}, "lora_rank: 15 does not split over tp 2"),
    ({"lora_rank": 16, "lora_targets": "qkv,router"}, "unknown linear 'router'"),
    ({"lora_targets": "attention"}, "lora_targets: a LoRA option needs a lora_rank"),
    ({"lora_rank": 8, "model": "mixtral-8x7b", "seq_len": 4096}, "MoE/MLA model"),
    ({"lora_rank": -1}, "lora_rank"),
    ({"lora_base": "fp8", "precision": "fp8"}, "lora_base: a LoRA option needs a lora_rank"),
    ({"lora_rank": 8, "lora_base": "fp8"}, "lora_base: an FP8 base .* not bf16's"),
    ({"lora_rank": 8, "lora_base": "int4"}, "lora_base"),
])
def test_impossible_lora_runs_name_the_field(fields, message):
    doc = {**FULL, "tp": 1, **fields}
    with pytest.raises(FlintError, match=message):
        TrainingRun.from_json(doc)


def test_targets_read_megatron_and_nemo_names():
    run = TrainingRun(**FULL, lora_rank=8, lora_targets="mlp, qkv")
    assert run.lora_targets == "qkv,fc1,fc2"
    assert TrainingRun.from_json(run.to_json()) == run
    assert replace(run, lora_targets="attention").lora_targets == "qkv,proj"


def test_cli_form_matches_the_library(store):
    """README: `flint predict --lora-rank 16 --lora-targets attention` (here on the tiny
    model); a torch framework refuses it in one line."""
    argv = ["predict", "--model", "tiny", "--seq-len", "64", "--devices", "8", "--tp", "2",
            "--global-batch", "16", "--lora-rank", "8", "--lora-targets", "attention",
            "--cache", str(store.directory), "--json"]
    code, stdout, stderr = run_cli(argv)
    assert code == 0, stderr
    doc = json.loads(stdout)
    assert doc["run"]["lora_rank"] == 8 and doc["run"]["lora_targets"] == "qkv,proj"
    lib = predict(TrainingRun(model="tiny", seq_len=64, devices=8, tp=2, global_batch=16,
                              lora_rank=8, lora_targets="attention"), cache=store)
    assert doc["step_time_s"] == lib.step_time_s > 0
    code, stdout, stderr = run_cli(argv[:-1])           # the report says what it priced
    assert code == 0 and "LoRA rank 8 on qkv,proj over a frozen bf16 base" in " ".join(
        stdout.split()) and "LoRA model flops" in stdout
    code, stdout, stderr = run_cli(argv[:-1] + ["--framework", "torch-eager", "--zero", "0"])
    assert code == 2 and "lora_rank: LoRA adapters are modelled in the JAX twin" in stderr
    assert len(stderr.strip().splitlines()) == 1 and not stdout


def test_published_lora_rows_state_their_adapters():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    from fidelity_published import published_cases

    cases = {c.label.split(" ")[0]: c for c in published_cases()
             if "LoRA" in c.label or c.label.startswith("6b#")}
    nemo = [c for k, c in cases.items() if k.startswith("1b#")]
    assert nemo and all((c.fields["lora_rank"], c.fields["lora_targets"]) == (32, "qkv")
                        for c in nemo)
    bridge = [c for k, c in cases.items() if k.startswith("1a#")]
    assert bridge and all(c.fields["lora_targets"] == "qkv,proj,fc1,fc2" for c in bridge)
    mlperf = cases["6b#1"].fields
    assert (mlperf["lora_rank"], mlperf["lora_targets"], mlperf["model"], mlperf["seq_len"],
            mlperf["remat"]) == (16, "qkv,proj", "llama2-70b", 8192, "none")
    nvfp4 = cases["6b#5"]       # NVFP4 GEMMs under the adapters (flint.models.nvfp4)
    assert not nvfp4.reason and nvfp4.fields["precision"] == "nvfp4"


def test_extract_cli_builds_the_lora_step(tmp_path):
    """`flint extract --model tiny --lora-rank 4 --lora-targets attention`: the frozen base
    and the adapters are the step's arguments; a bad rank is one line, exit 2."""
    out = tmp_path / "g.json"
    code, stdout, stderr = run_cli(["extract", "--model", "tiny", "--devices", "2",
                                    "--lora-rank", "4", "--lora-targets", "attention",
                                    "--out", str(out), "--json"])
    assert code == 0, stderr
    meta = json.loads(out.read_text())["meta"]
    assert meta["lora"]["lora_rank"] == 4 and meta["lora"]["lora_weights"] == [
        "wq", "wk", "wv", "wo"]
    names = [name for name, _ in meta["arguments"]]
    assert any("frozen" in n for n in names) and any("wq_lora_a" in n for n in names)
    assert not any("lora" in n and "w_up" in n for n in names)
    code, stdout, stderr = run_cli(["extract", "--model", "tiny", "--devices", "2",
                                    "--lora-rank", "-1"])
    assert code == 2 and "a LoRA rank is at least 1" in stderr and not stdout


def test_a_held_out_lora_table_states_its_adapters(tmp_path):
    """A LoRA table beyond the shared ones is priced from the adapters its rows state
    (rank and target modules under a fine-tuning config's names); a row that states none
    is refused, not given some framework's default."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    from fidelity_published import published_cases

    path = tmp_path / "held.md"
    path.write_text(
        "## 9. NVIDIA NeMo LoRA benchmark\n\n```csv\nmodel,task,system,gpus,precision,gbs,mbs,"
        "seq,tp,pp,adapter_dim,target_modules,step_time_s\n"
        "LLAMA2-7B,LoRA,DGX-H100,8,BF16,32,1,4096,1,1,16,\"['linear_qkv', 'linear_proj']\","
        "0.7\nLLAMA2-7B,LoRA,DGX-H100,8,BF16,32,1,4096,1,1,,,0.7\n```\n")
    stated, silent = published_cases(path)
    assert not stated.reason
    assert (stated.fields["lora_rank"], stated.fields["lora_targets"]) == (16, "qkv,proj")
    assert "adapters the table does not state" in silent.reason
