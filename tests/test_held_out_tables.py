"""Held-out tables beyond the shared ones, as scripts/fidelity.py --file reads them: the
framework a section's heading names, model shapes, sizes and names, sharding and recompute
in words, systems, step figures and columns named each table's own way, and the repo's
scripts/tables/beyond-shared.md."""
from __future__ import annotations

import sys

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))


def test_a_section_beyond_the_shared_ones_takes_the_framework_its_heading_names(tmp_path):
    """A table file with sections published.md does not list (the held-out families): a
    PyTorch FSDP heading prices with PyTorch's kernels (DDP rows as zero 0), a Megatron-LM
    2021 heading with that era's semantics, a Megatron-DeepSpeed one with DeepSpeed's
    pipeline engine's, an NVIDIA heading stays Megatron-Core."""
    from fidelity_families import applicable, variant_fields
    from fidelity_sections import section_of
    from fidelity_published import published_cases

    from flint.run import TrainingRun

    row = "Llama2-7B,a100,64,1,1,{fsdp},128,2,4096,BF16,2.0,{remat}"
    head = "model,system,gpus,tp,pp,fsdp,gbs,mbs,seq,precision,step_time_s,recompute"
    text = "".join(f"### {h}\n\n```csv\n{head}\n{row.format(fsdp=f, remat=r)}\n```\n\n"
                   for h, f, r in (
        ("7a. PyTorch FSDP2 on A100 (a blog)", 64, ""),
        ("7b. PyTorch DDP with torch.compile", 0, "no"),
        ("8. Narayanan et al. 2021, Megatron-LM (arXiv 2104.04473)", 0, "full"),
        ("9. Megatron-Core 2024 scaling", 0, ""),
        ("10. GPT-NeoX 2022 (Megatron-DeepSpeed)", 0, "full")))
    path = tmp_path / "held.md"
    path.write_text(text)
    cases = {c.section: c for c in published_cases(path)}
    assert cases["7a"].family == "published 7a PyTorch FSDP2 on A100 x PyTorch FSDP/DDP x A100"
    runs = {s: TrainingRun(**variant_fields(c, applicable(c))) for s, c in cases.items()}
    assert (runs["7a"].framework, runs["7a"].zero) == ("torch-eager", 3)
    assert (runs["7b"].framework, runs["7b"].zero) == ("torch-compile", 0)
    old = runs["8"]
    assert (old.framework, old.attention, old.overlap_grad_reduce, old.remat) == (
        "megatron", "unfused", False, "full")
    assert (runs["7a"].remat, runs["7b"].remat) == ("selective", "none")
    assert runs["9"].framework == "megatron" and runs["9"].attention == "flash"
    assert runs["9"].pipeline_p2p == "blocking" and not runs["9"].pipeline_scatter_gather
    neox = runs["10"]       # DeepSpeed's PipelineEngine around Megatron's layers, 2022
    assert (neox.attention, neox.sp, neox.overlap_grad_reduce, neox.pipeline_p2p,
            neox.pipeline_scatter_gather) == ("unfused", False, False, "blocking-serial", True)
    assert section_of("1a", "anything") == ("Megatron-Bridge", "bridge-perf-recipes")
    # Megatron inside DeepSpeed's pipeline engine: its era by the year the heading states
    assert section_of("9", "9. GPT-NeoX-20B (DeepSpeed pipeline, 2022)")[1] == \
        "megatron-deepspeed-2022"
    assert section_of("9", "9. Megatron-DeepSpeed 2021 runs")[1] == "megatron-deepspeed-2021"
    assert section_of("9", "9. Megatron-DeepSpeed sweep")[1] == "megatron-deepspeed-2022"
    assert section_of("12", "12. NeMo AutoModel with FSDP2")[1] == "megatron-core"


def test_a_table_beyond_the_shared_ones_states_shapes_sizes_and_fp16(tmp_path, capsys):
    """A held-out table names GPTs by size (Narayanan's presets) or states their dims in
    its own columns, and says FP16; each row is rebuilt as stated, and fidelity.py prices
    such a file with --file (here bounded by --cached-only: nothing compiles)."""
    import fidelity
    from fidelity_published import published_cases

    from flint.models.describe import resolve_model

    path = tmp_path / "held.md"
    path.write_text(
        "## 8. Narayanan et al. 2021, Megatron-LM (arXiv 2104.04473)\n\n```csv\n"
        "model,system,gpus,tp,pp,gbs,seq,precision,recompute,step_time_s,layers,hidden,"
        "heads\nGPT 39.1B,A100,512,8,2,1536,2048,FP16,full,14.45,,,\n"
        "GPT-X,A100,64,2,1,512,2048,fp16,full,3.7,30,3072,32\n"
        "GPT-Y,A100,64,2,1,512,2048,BF16,full,3.7,,,\n```\n")
    sized, shaped, nameless = published_cases(path)
    assert sized.fields["model"] == "gpt-39.1b" and sized.fields["precision"] == "bf16"
    cfg = resolve_model(shaped.fields["model"])
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.vocab, cfg.mlp) == (
        30, 3072, 32, 4 * 3072, 51200, "gelu")
    assert cfg == resolve_model("gpt-3.6b").with_(name=cfg.name)
    assert "no public dense shape for 'GPT-Y'" in nameless.reason
    assert sized.era == shaped.era == "megatron-lm-2021"
    out = tmp_path / "held.json"
    assert fidelity.main(["--file", str(path), "--cached-only", "--no-lofo", "--quiet",
                          "--cache", str(tmp_path / "cache"), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "== held.md: step time" in text and "Megatron-LM 2021 x A100" in text
    assert fidelity.main(["--file", str(tmp_path / "nope.md"), "--quiet"]) == 2
    assert "not published, more, both or a table file" in capsys.readouterr().err


def test_the_repo_table_beyond_the_shared_ones_is_rebuildable():
    """scripts/tables/beyond-shared.md: Narayanan 2021 Table 1 (steps from the paper's own
    FLOP count, eq. 3, configurations from its launch scripts), torchtitan's and llm-foundry's PyTorch FSDP tables; every row is
    priced as its heading's era, with the recompute and shapes it states."""
    from fidelity_families import applicable, before_fields, variant_fields
    from fidelity_published import published_cases

    from flint.run import TrainingRun

    cases = published_cases(REPO / "scripts" / "tables" / "beyond-shared.md")
    assert len(cases) == 57 and not [c.reason for c in cases if c.reason]
    assert {c.section: c.era for c in cases} == {
        "8": "megatron-lm-2021", "7a": "pytorch", "7b": "pytorch", "9": "megatron-lm-2019",
        "7c": "pytorch", "7d": "pytorch-compile", "10a": "megatron-core", "10b": "maxtext"}
    # GCP's A3 Mega recipes: its own spec; NeMo's configs turn userbuffers off, MaxText's
    # shards within a VM and replicates across VMs, its minimal_flash keeping the dots
    a3 = [c for c in cases if c.section.startswith("10")]
    assert {c.fields["hardware"] for c in a3} == {"a3-mega"}
    assert [c.fields.get("tp_comm_overlap") for c in a3] == [False, False, None]
    assert (a3[2].fields["zero"], a3[2].fields["hsdp"], a3[2].fields["remat"],
            a3[2].fields["micro_batch"]) == (3, 8, "dots", 4)
    # torchtitan on Grand Teton H100s: the part's memory as the page states it (spec
    # overrides), torchao's Float8 linears under torch.compile
    titan_h100 = [c for c in cases if c.section in ("7c", "7d")]
    assert {c.what_if for c in titan_h100} == {("hbm_bandwidth=2.4TB/s", "hbm_capacity=96GB")}
    fp8 = [TrainingRun(**variant_fields(c, applicable(c))) for c in titan_h100
           if c.fields["precision"] == "fp8"]
    assert len(fp8) == 3 and {(r.framework, r.fp8_recipe) for r in fp8} == {
        ("torch-compile", "current")}
    # Table 4's 2D row: 512 sequences of 8192 tokens over 256 GPUs at 829 tokens/s each
    assert titan_h100[-1].published_step_s == pytest.approx(512 * 8192 / (829 * 256),
                                                            rel=1e-6)
    titan = [c for c in cases if c.section == "7a"]
    assert (titan[0].fields["remat"], titan[0].fields["recompute_layers"]) == ("full", 16)
    mpt = next(c for c in cases if c.section == "7b")
    assert dict(mpt.fields["model"])["vocab"] == 50368 and mpt.fields["zero"] == 3
    old = [c for c in cases if c.section == "8"]
    assert [c.fields["model"] for c in old][-2:] == ["gpt-530b", "gpt-1t"]
    # the paper's own launch scripts (Megatron-LM examples/sc21/run_table_1.sh):
    # micro-batches, interleaved chunks, and PyTorch DDP without pipelining, local after
    assert [(c.fields["micro_batch"], c.fields["vp"], c.fields["overlap_grad_reduce"])
            for c in old] == [(16, 1, True)] * 3 + [(8, 1, True), (4, 1, False),
                                                    (2, 3, False), (2, 2, False),
                                                    (1, 2, False), (1, 3, False),
                                                    (1, 1, False)]
    h, s, layers, batch, gpus, tflops = 25600, 2048, 128, 3072, 3072, 163
    flops = 96 * batch * s * layers * h * h * (1 + s / (6 * h) + 51200 / (16 * layers * h))
    assert old[-1].published_step_s == pytest.approx(flops / (gpus * tflops * 1e12),
                                                     rel=1e-3)
    # Shoeybi et al. 2019 Table 2 on DGX-2H: an epoch of 68,507 iterations in days, the
    # 2019 code's vocabulary padding (128 x model-parallel size), local DDP, fp16
    gpt2 = [c for c in cases if c.section == "9"]
    assert [(c.fields["hardware"], c.fields["tp"], dict(c.fields["model"])["vocab"],
             c.fields["overlap_grad_reduce"], c.fields["remat"]) for c in gpt2] == [
        ("v100-dgx2h", 1, 50304, False, "full"), ("v100-dgx2h", 2, 50432, False, "full"),
        ("v100-dgx2h", 8, 51200, False, "full")]
    assert gpt2[-1].published_step_s == pytest.approx(2.10 * 86400 / 68507, rel=1e-3)
    # neither Megatron-LM 2019 nor 2021 shards its optimizer: a row silent on ZeRO takes
    # its era's mechanism (zero 0), not Megatron-Core's distributed optimizer
    for case in (old[0], gpt2[0]):
        assert "zero" not in case.fields
        assert variant_fields(case, applicable(case))["zero"] == 0
        assert before_fields(case).get("zero", 1) == 1
    # Megatron's unfused core drops out its probabilities (--attention-dropout 0.1 by
    # default); the 2019 code runs its scale, mask and softmax as PyTorch kernels
    after = [variant_fields(c, applicable(c)) for c in (old[0], gpt2[0])]
    assert [(f["attention"], f["attention_dropout"], f.get("score_path", "fused"))
            for f in after] == [("unfused", 0.1, "fused"), ("unfused", 0.1, "eager")]


def test_a_row_states_its_data_parallel_wrapper(tmp_path):
    """A `ddp` column is Megatron-LM's --DDP-impl: torch (PyTorch DDP, its bucket
    all-reduces beside the backward) overlaps, local (after the backward) does not, and
    what the row states wins over its era's rule (Megatron-LM 2021: after the backward);
    a wrapper Flint does not know is one reason, not a guess; a row without the column
    keeps its era's rule."""
    from fidelity_families import applicable, variant_fields
    from fidelity_published import published_cases

    from flint.run import TrainingRun

    path = tmp_path / "held.md"
    path.write_text("## 8. Narayanan et al. 2021, Megatron-LM (arXiv 2104.04473)\n\n```csv\n"
                    "model,system,gpus,tp,pp,mbs,ddp,gbs,seq,precision,recompute,"
                    "step_time_s\n"
                    "GPT-1.7B,A100,32,1,1,16,torch,512,2048,FP16,full,3.53\n"
                    "GPT-1.7B,A100,32,1,1,16,local,512,2048,FP16,full,3.53\n"
                    "GPT-1.7B,A100,32,1,1,16,apex,512,2048,FP16,full,3.53\n"
                    "GPT-1.7B,A100,32,1,1,16,,512,2048,FP16,full,3.53\n```\n")
    torch_ddp, local, apex, silent = published_cases(path)
    assert "data-parallel wrapper 'apex' not modelled" in apex.reason
    runs = [TrainingRun(**variant_fields(c, applicable(c))) for c in (torch_ddp, local, silent)]
    assert [(r.overlap_grad_reduce, r.micro_batch) for r in runs] == [
        (True, 16), (False, 16), (False, 16)]
    assert "overlap_grad_reduce" not in silent.fields


def test_a_row_states_its_sharding_in_words(tmp_path):
    """FSDP's sharding strategies, DDP and ZeRO stages as a held-out table writes them
    become the run's zero / reshard_after_forward / hsdp (HYBRID_SHARD: a host's GPUs)."""
    from fidelity_families import applicable, variant_fields
    from fidelity_published import published_cases
    from published_rows import stated_sharding

    from flint.run import TrainingRun

    assert stated_sharding({"sharding_strategy": "SHARD_GRAD_OP"}) == {
        "zero": 3, "reshard_after_forward": False}
    assert stated_sharding({"sharding": "_HYBRID_SHARD_ZERO2"}) == {
        "zero": 3, "hybrid": True, "reshard_after_forward": False}
    assert stated_sharding({"zero_stage": "2"}) == {"zero": 2}
    assert stated_sharding({"dp_type": "DDP"}) == {"zero": 0}
    assert stated_sharding({"fsdp": "64"}) == {} and stated_sharding({}) == {}
    rows = "".join(f"GPT-7.5B,H100,128,1,1,{s},512,2048,BF16,3.7\n" for s in (
        "FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "NO_SHARD"))
    path = tmp_path / "held.md"
    path.write_text("## 7. PyTorch FSDP on H100 (a blog)\n\n```csv\n"
                    "model,system,gpus,tp,pp,sharding_strategy,gbs,seq,precision,"
                    f"step_time_s\n{rows}```\n")
    runs = [TrainingRun(**variant_fields(c, applicable(c))) for c in published_cases(path)]
    assert [(r.framework, r.zero, r.reshard_after_forward, r.hsdp) for r in runs] == [
        ("torch-eager", 3, True, 0), ("torch-eager", 3, False, 0),
        ("torch-eager", 3, True, 8), ("torch-eager", 0, True, 0)]


def test_a_row_states_its_tp_comm_overlap(tmp_path):
    """A `tp_comm_overlap` column (NeMo's ub_tp_comm_overlap) wins over the era's rule
    (Megatron-Core recipes: the framework's default, on under TP); a word that is not
    yes or no is one reason, not a guess."""
    from fidelity_families import applicable, variant_fields
    from fidelity_published import published_cases

    from flint.run import TrainingRun

    rows = "".join(f"GPT3-175B,DGX-H100,256,4,8,2,1,2048,2048,FP8,{o},25.1\n"
                   for o in ("false", "true", "", "maybe"))
    path = tmp_path / "held.md"
    path.write_text("## 11. NeMo on H100 (a recipe)\n\n```csv\nmodel,system,gpus,tp,pp,vp,"
                    f"mbs,gbs,seq,precision,tp_comm_overlap,step_time_s\n{rows}```\n")
    off, on, silent, bad = published_cases(path)
    assert "tp_comm_overlap 'maybe' is not true or false" in bad.reason
    runs = [TrainingRun(**variant_fields(c, applicable(c))) for c in (off, on, silent)]
    assert [r.tp_comm_overlap for r in runs] == [False, True, True]
    assert "tp_comm_overlap" not in silent.fields


def test_a_row_states_its_recompute_in_words(tmp_path):
    """torchtitan's 'selective layer' checkpoints every second block; a yes/no column's yes
    checkpoints whole blocks; a stated recompute is never refitted to memory (M8)."""
    from fidelity_families import applicable
    from fidelity_published import published_cases

    rows = "".join(f"Llama2-13B,H100,64,1,1,64,128,4096,BF16,2.0,{ac}\n" for ac in (
        "selective layer", "true", "no", "", "minimal_flash"))
    path = tmp_path / "held.md"
    path.write_text("## 9. NVIDIA Megatron-Core scaling\n\n```csv\nmodel,system,gpus,tp,pp,"
                    f"fsdp,gbs,seq,precision,step_time_s,activation_checkpointing\n{rows}```\n")
    cases = published_cases(path)
    # MaxText's minimal / minimal_flash: the dots (and the fused attention's output) kept
    assert [(c.fields.get("remat"), c.fields.get("recompute_layers")) for c in cases] == [
        ("full", 20), ("full", 0), ("none", 0), (None, None), ("dots", 0)]
    # an unstated recompute is the framework's (its era's), selective unless one says so
    from fidelity_families import variant_fields
    assert variant_fields(cases[3], []).get("remat", "selective") == "selective"
    fitted = [any(m.fit_memory for m in applicable(c)) for c in cases]
    assert fitted == [False, False, False, True, False]


def test_a_held_out_system_named_its_own_way_finds_its_spec():
    """'DGX A100 80GB', '8x H200 SXM', 'MI300X', 'TPU v5p', an H800, a V100 (a DGX-1's
    unless the system is a DGX-2, or the 450 W DGX-2H), GCP's A3 Mega name specs Flint has; a PCIe card, an H100 NVL or an
    H20 name parts it has none for (not rebuildable)."""
    from published_rows import system_spec

    named = {"DGX A100 80GB": "a100-80gb-sxm", "A100-SXM4-40GB": "a100-40gb-sxm",
             "8x H200 SXM": "h200", "GB200 NVL72": "gb200-nvl72", "MI300X": "mi300x",
             "TPU v5p": "tpu-v5p", "ND A100 v4": "a100-80gb-sxm", "dgx-h100": "h100-sxm",
             "V100": "v100-sxm2", "DGX-2": "v100-dgx2", "DGX-2H V100": "v100-dgx2h",
             "MI325X": "mi325x",
             "H800": "h800-sxm", "A800-SXM4-80GB": "a800-80gb-sxm",
             # GCP's A3 Mega is an H100 node with its own network: its own spec
             "GCP A3 Mega (8x H100)": "a3-mega", "a3-megagpu-8g": "a3-mega"}
    assert {name: system_spec(name) for name in named} == named
    assert [system_spec(t) for t in ("H100 PCIe", "H100 NVL", "V100 PCIe", "H20")] == [""] * 4


@pytest.mark.parametrize("column, value, step", [
    ("step_time_ms", "1500", 1.5), ("elapsed_time_per_iteration_ms", "1500", 1.5),
    ("wps", "2730.67", 1.5), ("tokens_per_s", "174762.67", 1.5), ("samples_s", "42.667", 1.5),
    ("tflops_per_gpu", "400", 0.0)])
def test_a_held_out_row_gives_its_time_under_other_names(tmp_path, column, value, step):
    """Step times in ms, token rates per GPU or for the cluster, sequence rates: each is
    seconds per step; a TFLOP/s figure alone is not rebuilt (its FLOP convention unknown)."""
    from fidelity_published import published_cases

    path = tmp_path / "held.md"
    path.write_text("## 9. NVIDIA scaling\n\n```csv\nmodel,system,gpus,tp,gbs,seq,"
                    f"precision,{column}\nLlama2-7B,H100,64,1,64,4096,BF16,{value}\n```\n")
    (case,) = published_cases(path)
    if step:
        assert case.published_step_s == pytest.approx(step, rel=1e-4) and not case.reason
    else:
        assert case.reason.startswith("no step time, tokens/s or samples/s in the row")


@pytest.mark.parametrize("families, present, absent", [
    # the torchtitan and llm-foundry families (7d: the Float8 rows under torch.compile)
    ("PyTorch", ("published 7a torchtitan x PyTorch FSDP/DDP x A100",
                 "published 7b llm-foundry x PyTorch FSDP/DDP x H100",
                 "published 7c torchtitan eager x PyTorch FSDP/DDP x H100",
                 "x PyTorch FSDP + torch.compile x H100"), ("Narayanan",)),
    # GCP's A3 Mega recipes, NeMo's and MaxText's
    ("A3 Mega", ("published 10a A3 Mega NeMo recipes x Megatron-Core+TE x H100",
                 "published 10b A3 Mega MaxText recipe x MaxText/XLA x H100"),
     ("torchtitan", "Narayanan"))])
def test_documented_checks_on_the_repo_table(tmp_path, capsys, families, present, absent):
    """README: `fidelity.py --file scripts/tables/beyond-shared.md --families PyTorch` and
    `--families 'A3 Mega'` select those families (bounded here by --cached-only)."""
    import fidelity

    table = str(REPO / "scripts" / "tables" / "beyond-shared.md")
    assert fidelity.main(["--file", table, "--families", families, "--cached-only",
                          "--no-lofo", "--quiet", "--cache", str(tmp_path / "c")]) == 0
    out = capsys.readouterr().out
    assert all(p in out for p in present) and not any(a in out for a in absent)


def test_sharding_is_read_from_any_column_named_for_it():
    from published_rows import stated_sharding

    assert stated_sharding({"fsdp_mode": "SHARD_GRAD_OP"})["reshard_after_forward"] is False
    assert stated_sharding({"Strategy": "DDP"}) == {"zero": 0}
    assert stated_sharding({"ZeRO stage": "3"}) == {"zero": 3}
    assert stated_sharding({"schedule": "ddp-like 1F1B", "model": "FSDP-net"}) == {}


def test_a_held_out_table_names_its_columns_its_own_way(tmp_path):
    """num_gpus, tensor/pipeline parallel sizes, micro/global batch sizes, sequence length,
    dtype and GPU type under the names Megatron's and other tables use."""
    from fidelity_published import published_cases

    path = tmp_path / "held.md"
    path.write_text(
        "## 9. NVIDIA Megatron-Core scaling\n\n```csv\nmodel,gpu_type,num_gpus,"
        "tensor_model_parallel_size,pipeline_model_parallel_size,micro_batch_size,"
        "global_batch_size,seq_length,dtype,elapsed_time_per_iteration_ms\n"
        "Llama2-70B,H100 SXM,64,4,2,1,128,4096,BF16,5000\n```\n")
    (case,) = published_cases(path)
    f = case.fields
    assert not case.reason and case.published_step_s == pytest.approx(5.0)
    assert (f["devices"], f["tp"], f["pp"], f["micro_batch"], f["global_batch"],
            f["seq_len"], f["hardware"], f["precision"]) == (
        64, 4, 2, 1, 128, 4096, "h100-sxm", "bf16")
    assert case.family.endswith("x H100")


def test_a_benchmark_table_with_display_headers_is_read(tmp_path):
    """Headers as benchmark READMEs print them (llm-foundry's: `# GPUs`, `SeqLen (T)`,
    `MicroBatchSize`, `Throughput (T/s/GPU)`, `Sharding Strategy`, `Activation
    Checkpointing`; Composer's `amp_bf16`) read as the names this harness uses."""
    from fidelity_published import published_cases
    from table_columns import column_keys

    assert column_keys("# GPUs") == ("num_gpus",)
    assert column_keys("SeqLen (T)") == ("seq_len_t", "seq_len")
    assert column_keys("Throughput (T/s/GPU)")[0] == "throughput_t_s_gpu"
    path = tmp_path / "held.md"
    path.write_text(
        "## 9. A PyTorch FSDP benchmark\n\n```csv\nModel,SeqLen (T),# GPUs,GPU,MicroBatchSize,"
        "GradAccum,GlobalBatchSize,Throughput (T/s/GPU),Precision,Sharding Strategy,"
        "Activation Checkpointing,n_layers,d_model,n_heads,vocab_size\n"
        "mpt-7b,2048,128,h100_80gb,6,1,768,10643,amp_bf16,FULL_SHARD,False,32,4096,32,50368\n"
        "mpt-13b,2048,256,h100_80gb,2,1,512,4800,amp_bf16,SHARD_GRAD_OP,True,40,5120,40,"
        "50368\n```\n")
    full, grad_op = published_cases(path)
    assert not full.reason and not grad_op.reason and full.era == "pytorch"
    assert full.published_step_s == pytest.approx(768 * 2048 / (10643 * 128))
    f, g = full.fields, grad_op.fields
    assert (f["devices"], f["micro_batch"], f["global_batch"], f["hardware"], f["precision"],
            f["zero"], f["remat"]) == (128, 6, 768, "h100-sxm", "bf16", 3, "none")
    assert dict(f["model"])["hidden"] == 4096 and dict(g["model"])["layers"] == 40
    assert (g["remat"], g["reshard_after_forward"]) == ("full", False)


def test_a_held_out_row_names_its_model_its_own_way():
    """Model names as papers, Hugging Face and NeMo write them find the same presets."""
    from published_rows import _preset

    named = {"Llama 2 70B": "llama2-70b", "LLaMA-2-70B": "llama2-70b",
             "meta-llama/Llama-2-7b-hf": "llama2-7b", "Llama-3.1-405B": "llama3.1-405b",
             "Llama 3.1 8B": "llama3-8b", "LLAMA3_70B": "llama3-70b", "GPT-3 175B": "gpt3-175b",
             "Nemotron-4 340B": "nemotron-340b", "GPT 39.1B": "gpt-39.1b"}
    assert {name: _preset(name, "9") for name in named} == named
    assert _preset("Mixtral 8x7B", "9") == ""            # MoE: no dense preset
