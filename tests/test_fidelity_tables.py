"""scripts/fidelity.py without compiling: the rows of both shared table files, the family
each belongs to, the run fields its framework semantics give, and the rank correlation."""
from __future__ import annotations

import sys

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))


@pytest.fixture(scope="module")
def more():
    from more_published import MORE_TABLE, more_cases

    if not MORE_TABLE.is_file():
        pytest.skip("shared more-published table not present")
    return {c.label.split(" ")[0]: c for c in more_cases()}


@pytest.fixture(scope="module")
def published():
    from published_rows import TABLE

    from fidelity_published import published_cases

    if not TABLE.is_file():
        pytest.skip("shared published table not present")
    return published_cases()


def test_bloom_rows_state_their_dims_and_cluster(more):
    prod = more["1-P1"]           # the first production line (iteration 12695)
    assert prod.published_step_s == 105.22
    # Jean Zay's Omni-Path as measured: 135 Gb/s of all-reduce per 8-GPU node achieved
    # (more_published.JEAN_ZAY_OPA_MEASURED), i.e. 16.875 Gb/s per GPU after Flint's
    # scale-out bus efficiency
    assert prod.what_if == ("nic_bandwidth=18.75Gb/s",)
    from flint.hardware_models.network import DEFAULT_BUS_EFFICIENCY
    from flint.hardware_models.spec import load_spec

    spec = load_spec(prod.fields["hardware"], prod.what_if)
    achieved = spec.nic_bandwidth * spec.efficiency.get(
        "bus_scale_out", DEFAULT_BUS_EFFICIENCY["scale_out"])
    assert achieved * 8 * 8 == pytest.approx(135e9)        # bytes/s per GPU -> Gb/s per node
    f = prod.fields
    assert (f["devices"], f["tp"], f["pp"], f["micro_batch"], f["global_batch"]) == \
        (384, 4, 12, 2, 2048)
    assert (f["remat"], f["zero"], f["model"]["heads"], f["model"]["vocab"]) == \
        ("full", 1, 112, 250880)
    # 02-20 rows state no NHEADS: the author's "all NHEADS=64 (above too)"
    assert more["1-L476"].fields["model"]["heads"] == 64
    assert more["1-L476"].fields["model"]["layers"] == 80      # "80 (inferred)"
    assert more["1-L476"].fields["global_batch"] == 2040


def test_rows_without_a_time_are_listed_with_the_reason(more):
    assert "OOM" in more["1-L793"].reason
    assert "CUDA_LAUNCH_BLOCKING" in more["1-L450"].reason
    assert "inconsistent" in more["1-L669"].reason and "inconsistent" in more["1-L670"].reason
    assert more["1-L648"].reason.startswith("DP 8 x TP 8 x PP 10")
    assert not more["1-L608"].reason and more["1-L608"].published_step_s == 134.02


def test_internevo_and_mt_nlg_rows(more):
    first = more["2#1"]                         # tp1 zero1=-1, 8 GPUs, 2 x 4 micro-batches
    assert first.fields["global_batch"] == 8 * 2 * 4 and first.fields["remat"] == "none"
    assert first.fields["zero"] == 1 and first.what_if == ("nic_bandwidth=50Gb/s",)
    tp2 = next(c for k, c in more.items() if k.startswith("2#") and c.fields["tp"] == 2)
    assert tp2.fields["global_batch"] == tp2.fields["devices"] // 2 * 4 * 4
    ckpt = next(c for k, c in more.items() if "ckpt" in c.label)
    assert ckpt.fields["remat"] == "full"
    mt = more["3#1"]
    assert (mt.fields["tp"], mt.fields["pp"], mt.fields["global_batch"]) == (8, 35, 1920)
    assert mt.fields["model"]["vocab"] == 50272 and mt.what_if == ()


def test_families_name_source_framework_and_gpu(published, more):
    fams = {c.family for c in published}
    assert "published 1a Megatron-Bridge x Megatron-Core+TE x H100" in fams
    assert "published 4 Korthikanti 2022 x Megatron-LM 2022 x A100" in fams
    assert "published 2d tpu-recipes x MaxText/XLA x TPU v6e" in fams
    assert "published 1h NeMo AutoModel x PyTorch FSDP2+TE x H100" in fams
    assert more["1-P1"].family == "more 1 BigScience tr11 x Megatron-DeepSpeed 2022 x A100"
    assert more["2#1"].family == "more 2 InternEvo train_performance x InternEvo x A100"
    korthikanti = [c for c in published if c.section == "4" and not c.reason]
    full = [c for c in korthikanti if c.label.endswith("full-recompute")]
    assert len(full) == len(korthikanti) // 2 == 4
    assert full[0].fields["remat"] == "full" and full[0].fields["sp"] is False
    assert sum(not c.reason for c in published) >= 127


def test_before_and_after_run_fields(published, more):
    from fidelity_families import applicable, before_fields, variant_fields

    from flint.run import TrainingRun

    bloom = more["1-P1"]
    before = TrainingRun(**variant_fields(bloom, []))
    after = TrainingRun(**variant_fields(bloom, applicable(bloom)))
    assert (before.attention, before.sp, before.pipeline_split) == ("flash", True, "time")
    assert (after.attention, after.sp, after.pipeline_split) == ("unfused", False, "layers")
    assert (before.attention_dropout, after.attention_dropout) == (0.0, 0.1)
    assert after.remat == "full" and after.zero == 1         # stated, in both
    assert (before.grad_accumulation, after.grad_accumulation) == ("in-gemm", "fp32-copy")
    # the production rows are bf16: BF16_Optimizer's all-reduce and bf16 communication
    assert (before.zero_sync, before.grad_reduce_dtype) == ("reduce-scatter", "fp32")
    assert (after.zero_sync, after.grad_reduce_dtype) == ("all-reduce", "bf16")
    fp16 = more["1-L389"]                                  # 02-17, fp16
    run = TrainingRun(**variant_fields(fp16, applicable(fp16)))
    assert (run.grad_accumulation, run.zero_sync, run.grad_reduce_dtype) == (
        "autograd", "reduce-scatter", "bf16")
    nemo = next(c for c in published if c.family.startswith("published 1a") and not c.reason)
    assert variant_fields(nemo, [])["framework"] == "megatron"
    assert before_fields(nemo)["attention"] == "flash"
    assert not any(m.assign and dict(m.assign).get("attention") for m in applicable(nemo))
    intern = more["2#1"]
    assert [m.name for m in applicable(intern)] == [
        "no sequence parallelism before Megatron-LM 2022-05",
        "PyTorch autograd gradient accumulation",
        "FlashAttention v1 where a framework pinned it",
        "InternEvo's ZeRO-1: gradients all-reduced, parameters broadcast by owner",
        "gradients reduced in the model's dtype (DeepSpeed, InternEvo)",
        "TP input-gradient reduction beside the weight-gradient GEMM (async all-reduce)"]
    # the Megatron-DeepSpeed forks reduce input gradients with a synchronous autograd op
    assert not before.tp_grad_overlap and not after.tp_grad_overlap
    run = TrainingRun(**variant_fields(more["2#9"], applicable(more["2#9"])))
    assert (run.attention, run.zero_sync, run.hsdp) == ("flash1", "broadcast", 8)  # zero1=8
    assert TrainingRun(**variant_fields(intern, applicable(intern))).hsdp == 0    # zero1=-1
    mtnlg = TrainingRun(**variant_fields(more["3#1"], applicable(more["3#1"])))
    assert mtnlg.grad_accumulation == "autograd"
    # NeMo AutoModel's Llama3-70B states no recompute: its benchmark recipe checkpoints
    # every layer and reduce-scatters in every micro-batch (defer_fsdp_grad_sync False)
    auto = next(c for c in published if c.label.startswith("1h#10 "))
    before = TrainingRun(**variant_fields(auto, []))
    after = TrainingRun(**variant_fields(auto, applicable(auto)))
    assert (before.remat, before.grad_sync) == ("selective", "last-microbatch")
    assert (after.remat, after.grad_sync, after.zero, after.cp) == (
        "full", "every-microbatch", 3, 2)


def test_rank_correlation_averages_ties():
    from fidelity_stats import median, ranks, spearman

    assert ranks([3, 1, 2, 2]) == [4.0, 1.0, 2.5, 2.5]
    assert spearman([1, 2, 3, 4], [10, 20, 30, 45]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [9, 7, 5, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(4.5 / (4.5 * 5) ** 0.5)
    assert spearman([1, 2], [1, 2]) is None and spearman([1, 1, 1], [1, 2, 3]) is None
    assert median([3, 1, 2]) == 2 and median([4, 1, 2, 3]) == 2.5 and median([]) is None


def _priced(more, label, step):
    case = more[label]
    return type(case)(**{**vars(case), "predicted": {"after": {"step_s": step}}})


def test_bloom_errors_grouped_by_head_width(more):
    import fidelity_bloom

    # 1-L583: 13824 / 64 = 216 wide; 1-L582: 14400 / 64 = 225; 1-L389: 14400 / 32 = 450
    cases = [_priced(more, "1-L583", 144.261), _priced(more, "1-L582", 110.605),
             _priced(more, "1-L389", 846.989), more["1-L518"]]
    text, doc = fidelity_bloom.alignment_table(cases)
    assert doc["multiple of 8"] == {"rows": 1, "median_pct": pytest.approx(-10.0, abs=0.01),
                                    "within_10": 1, "within_15": 1}
    assert doc["odd"]["rows"] == 1 and doc["odd"]["median_pct"] == pytest.approx(-50.0, abs=0.01)
    assert doc["even, not a multiple of 8"]["median_pct"] == pytest.approx(10.0, abs=0.01)
    assert "odd" in text and "-50.0%" in text
    assert fidelity_bloom.alignment_table([more["1-L518"]]) == ("", {})


def test_bloom_errors_by_tp_and_dp_with_one_node_rows_apart(more):
    """Aligned rows only, by TP and DP, a one-node row in its own column: 1-L658 (TP8 on
    8 GPUs), 1-L609 (TP8 PP12 DP4), 1-L617 (TP8 PP6 DP8) and 1-L792 (TP8 PP2 DP24), 1-L802
    (TP4 PP12 DP8); 1-L582 (head width 225) is left out."""
    import fidelity_bloom

    published = {c: more[c].published_step_s for c in
                 ("1-L658", "1-L609", "1-L617", "1-L792", "1-L802", "1-L582")}
    errors = {"1-L658": -0.2, "1-L609": -0.1, "1-L617": -0.2, "1-L792": -0.3,
              "1-L802": -0.1, "1-L582": +0.5}
    cases = [_priced(more, c, published[c] * (1 + e)) for c, e in errors.items()]
    text, doc = fidelity_bloom.topology_table(cases)
    assert doc["8"] == {"one node": {"rows": 1, "median_pct": pytest.approx(-20.0)},
                        "DP 1-4": {"rows": 1, "median_pct": pytest.approx(-10.0)},
                        "DP 8": {"rows": 1, "median_pct": pytest.approx(-20.0)},
                        "DP 12-48": {"rows": 1, "median_pct": pytest.approx(-30.0)}}
    assert doc["4"] == {"DP 8": {"rows": 1, "median_pct": pytest.approx(-10.0)}}
    assert "one node" in text and "-30.0% ( 1)" in text
    assert fidelity_bloom.topology_table([_priced(more, "1-L582", 100.0)]) == ("", {})


def test_documented_command_bounded_by_cached_only(more, tmp_path, capsys):
    """`scripts/fidelity.py --cached-only` on an empty cache prices nothing and says so;
    a bad regex is one line and exit 2."""
    import json

    import fidelity

    out = tmp_path / "fidelity.json"
    code = fidelity.main(["--file", "more", "--families", "MT-NLG", "--cached-only",
                          "--cache", str(tmp_path / "cache"), "--quiet", "--json", str(out)])
    assert code == 0
    text = capsys.readouterr().out
    assert "runs left out by --cached-only: " in text and "MT-NLG" in text
    doc = json.loads(out.read_text())
    assert [c["label"][:3] for c in doc["cases"]] == ["3#1", "3#2", "3#3"]
    assert {m["id"] for m in doc["mechanisms"]} >= {"M1", "M2", "M3", "M4"}
    assert fidelity.main(["--families", "(", "--quiet"]) == 2
    assert "bad regex" in capsys.readouterr().err


def test_maxtext_2023_rows_state_their_decoder_sharding_and_slices():
    """published.md 2a: the 2023 MaxText decoder (non-gated ReLU MLP, head_dim 256, tied
    embeddings), FSDP within each slice and data parallelism across slices (HSDP over a
    slice's FSDP ranks), each slice its own torus, remat minimal as the zoo's dots policy,
    and the step from the table's own conversion of its TFLOP/s under MaxText's FLOP count."""
    from published_rows import TABLE, rows_of
    from table_columns import tables

    if not TABLE.is_file():
        pytest.skip("shared published table not present")
    rows = {r.label.split(" ")[0]: r for h, recs in tables(TABLE) if h.startswith("2a")
            for r in rows_of(h, recs)}
    one, two = rows["2a#1"], rows["2a#2"]
    dims = dict(one.model)
    assert (dims["activation"], dims["head_dim"], dims["heads"], dims["ffn"], dims["vocab"],
            dims["tie_embeddings"]) == ("relu", 256, 32, 32768, 32768, True)
    assert (one.system, one.gpus, one.tp, one.zero, one.hsdp, one.remat, one.what_if) == \
        ("tpu v5p", 64, 4, 3, 0, "dots", ())
    # 8 sequences per chip, 4 chips per tensor-parallel group, one micro-batch per step
    assert (one.gbs, one.mbs) == (512, 32)
    assert (two.gpus, two.hsdp, two.what_if) == (128, 16, ("torus=4x4x4",))
    assert one.published_step_s == pytest.approx(9.92)
    v5e = rows["2a#40"]
    assert (v5e.tp, v5e.hsdp, v5e.remat, v5e.what_if) == (16, 16, "full", ("torus=16x16",))
    assert all(not r.reason or "libtpu" in r.reason for r in rows.values())


def test_maxtext_v4_rows_run_the_attention_of_their_date():
    """The v4 rows were measured in 2023-03, before JAX had a Pallas TPU flash kernel: their
    family runs XLA's dot-product attention after its mechanisms; v5p and v5e rows (the
    2023-12 scripts, attention=flash) keep the fused kernel."""
    from fidelity_families import applicable, variant_fields
    from fidelity_published import published_cases

    cases = {c.label.split(" ")[0]: c for c in published_cases() if c.section == "2a"}
    if not cases:
        pytest.skip("shared published table not present")
    for label, attention in (("2a#41", "unfused"), ("2a#42", "unfused"), ("2a#1", "flash"),
                             ("2a#17", "flash")):
        case = cases[label]
        assert variant_fields(case, [])["attention"] == "flash"             # before
        assert variant_fields(case, applicable(case))["attention"] == attention, label
