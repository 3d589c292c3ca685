"""The engine: TrainingRun (validated, hashable, round trips), predict (one number by
library, CLI and sweep), layer templates that re-price for any spec and what-if."""
from __future__ import annotations

import json

import pytest
import yaml

from conftest import LLAMA6, cli_json_per, run_cli
from flint.errors import FlintError
from flint.run import TrainingRun



def test_run_derives_its_layout_and_round_trips():
    run = TrainingRun(model="llama3-70b", seq_len=8192, devices=1024, tp=8, pp=4, vp=5,
                      global_batch=512, precision="fp8")
    assert (run.dp, run.microbatches, run.stage_devices) == (32, 16, 256)
    assert run.sp and run.schedule == "interleaved" and run.zero == 1
    assert run.mesh() == (("data", 32), ("model", 8))
    assert TrainingRun.from_json(run.to_json()) == run
    assert TrainingRun.from_json(yaml.safe_load(run.to_yaml())) == run
    assert len({run, TrainingRun.from_json(run.to_json())}) == 1          # hashable
    assert run.key() == TrainingRun.from_json(run.to_json()).key()
    assert run.key() != run.replace(precision="bf16").key()
    mapped = TrainingRun(model=LLAMA6, devices=8, tp=2, zero=3, hsdp=2)
    assert mapped.seq_len == 2048 and hash(mapped)       # the mapping states its sequence
    assert mapped.mesh() == (("data", 2), ("fsdp", 2), ("model", 2))


@pytest.mark.parametrize("fields, message", [
    ({"devices": 100, "tp": 8}, "devices: 100 do not split into tp 8"),
    ({"pp": 4, "vp": 3, "global_batch": 8}, "vp: pp 4 x vp 3 = 12 model chunks do not fill"),
    ({"micro_batch": 3, "global_batch": 16}, "global_batch: 16 sequences are not a multiple"),
    ({"hardware": "h100-sxn"}, "hardware: unknown .h100-sxn. .did you mean .h100-sxm"),
    ({"tpp": 2}, "unknown field 'tpp'.*did you mean 'tp'"),
    ({"model": "llama9"}, "unknown model"),
    ({"seq_len": None, "model": "llama3-8b"}, "seq_len: give the training sequence length"),
    ({"precision": "fp8", "hardware": "a100-80gb-sxm"}, "precision: fp8 GEMMs need FP8"),
    ({"fp8_recipe": "delayed"}, "fp8_recipe: delayed scaling is a recipe of precision fp8"),
    ({"precision": "fp8", "fp8_recipe": "stale"}, "fp8_recipe"),
    ({"devices": 12, "tp": 3}, "tp: 3 does not divide"),
    ({"ep": 2}, "ep: .* has no experts"),
    ({"zero": 5}, "zero"),
])
def test_impossible_runs_name_the_field(fields, message):
    doc = {"model": LLAMA6, "devices": 8, **fields}
    doc = {k: v for k, v in doc.items() if v is not None}
    with pytest.raises(FlintError, match=message):
        TrainingRun.from_json(doc)


def test_cli_bad_run_is_one_line_and_exit_2(tmp_path):
    out = tmp_path / "p.json"
    code, stdout, stderr = run_cli(["predict", "--model", "llama3-8b", "--seq-len", "4096",
                                    "--devices", "12", "--tp", "8", "--trace", out])
    assert code == 2 and "devices: 12 do not split" in stderr
    assert len(stderr.strip().splitlines()) == 1 and not out.exists() and not stdout
    code, _, stderr = run_cli(["predict", "--model", "llama3-8b", "--devices", "8"])
    assert code == 2 and "--seq-len" in stderr
    code, stdout, stderr = run_cli(["predict", "--model", "llama3-8b", "--seq-len", "4096",
                                    "--devices", "8", "--framework", "torch-eager",
                                    "--attention", "flash3"])
    assert code == 2 and "attention: torch-eager runs SDPA's fused attention" in stderr
    assert len(stderr.strip().splitlines()) == 1 and not stdout


def test_library_cli_and_sweep_give_the_same_number(tmp_path):
    from flint.engine import predict
    from flint.sweep import run_sweep
    from flint.sweep_space import SearchSpace

    fields = {"model": "tiny", "seq_len": 64, "devices": 8, "tp": 2, "pp": 2,
              "global_batch": 16, "hardware": "h100-sxm"}
    lib = predict(TrainingRun.from_json(fields), what_if=["hbm_bandwidth=2TB/s"])
    code, stdout, stderr = run_cli(["predict", "--model", "tiny", "--seq-len", "64",
                                    "--devices", "8", "--tp", "2", "--pp", "2",
                                    "--global-batch", "16", "--set", "hbm_bandwidth=2TB/s",
                                    "--json"])
    assert code == 0, stderr
    cli = json.loads(stdout)
    rows = run_sweep(SearchSpace.from_dict({**fields, "what_if": [{"hbm_bandwidth": "2TB/s"}]}),
                     tmp_path / "sweep")
    assert lib.step_time_s == cli["step_time_s"] == rows[0]["step_time_s"] > 0
    assert lib.mfu == cli["mfu"] == rows[0]["mfu"]
    assert cli["facts"]["seq_len"] == 64 and cli["facts"]["global_batch_sequences"] == 16


@pytest.fixture(scope="module")
def llama6():
    # TP communication overlap off: its ring steps cross the template's block boundaries
    # (a layer's reduce-scatter overlaps the next layer's norm), which block prices see
    # about 4% slower than the whole graph (tests/test_tp_comm_overlap.py)
    return TrainingRun(model=LLAMA6, devices=8, tp=4, global_batch=4, zero=0,
                       tp_comm_overlap=False)


def test_templated_what_if_matches_the_full_graph(llama6):
    """Three compiled layers widened to six price like the six-layer program, under the
    spec and under what-ifs on each resource (the gradient all-reduce kept as XLA
    combined it in both: zero 0; XLA's kernels and XLA's placement of the work on reduced
    gradients in both: framework xla)."""
    from flint import engine
    from flint.hardware_models.estimate import estimate
    from flint.models.decoder import model_flops
    from flint.passes.expand_loops import ExpandLoops
    from flint.passes.kernel_population import KernelPopulation
    from flint.passes.pipeline import PipelineParallel
    from flint.template_cache import extract_program

    run = llama6.replace(framework="xla")     # its derived fields (command buffers) too
    full = extract_program(dict(engine.stage_program(run), layers=6))
    full = KernelPopulation(run.framework).run(ExpandLoops().run(full))
    if run.tp_comm_overlap:         # the engine's passes, the layer template aside
        from flint.passes.tp_comm_overlap import TpCommOverlap

        full = TpCommOverlap().run(full)
    full.meta["model_flops_per_device"] = model_flops(
        run.model_config(), run.micro_batch * run.dp * run.seq_len) / run.stage_devices
    full = PipelineParallel(1, run.microbatches).run(full)
    for what_if in ([], ["hbm_bandwidth=1.675TB/s"], ["peak_bf16=1979TFLOP/s"],
                    ["scale_up_bandwidth=225GB/s"]):
        whole = estimate(full, run.hardware, what_if).step_time_s
        templated = engine.predict(run, what_if=what_if).step_time_s
        print(f"{what_if or 'spec'}: full {whole * 1e3:.3f} ms, templated "
              f"{templated * 1e3:.3f} ms ({100 * (templated / whole - 1):+.2f}%)")
        assert templated == pytest.approx(whole, rel=0.02), what_if


def test_another_spec_or_a_faster_resource_reprices(llama6):
    from flint.engine import predict

    base = predict(llama6)
    for spec in ("b200", "a100-80gb-sxm", "h200"):
        other = predict(llama6.replace(hardware=spec)).step_time_s
        print(f"{spec}: {other * 1e3:.3f} ms vs h100-sxm {base.step_time_s * 1e3:.3f} ms")
        assert other != base.step_time_s
    shares = {"peak_bf16=1979TFLOP/s": base.by_class_s["gemm"],
              "hbm_bandwidth=6.7TB/s": base.by_class_s["elementwise"],
              "scale_up_bandwidth=900GB/s": base.by_class_s.get("collective", 0.0)}
    for what_if, bound in shares.items():
        faster = predict(llama6, what_if=[what_if]).step_time_s
        print(f"{what_if}: {faster * 1e3:.3f} ms vs {base.step_time_s * 1e3:.3f} ms")
        assert faster <= base.step_time_s
        if bound > 0.05 * base.step_time_s:          # the breakdown says it binds
            assert faster < 0.99 * base.step_time_s, what_if


def test_saved_layer_templated_graph_reprices_for_estimate(tmp_path):
    """The reproduction of the stale-price bug: a layer-templated graph file estimated for
    another spec or with a what-if gives another step."""
    graph = tmp_path / "lt.json"
    code, _, stderr = run_cli(["extract", "--model", "tiny", "--devices", "8", "--mesh",
                               "data=4,model=2", "--unroll", "--layers", "2", "--passes",
                               "layer-template{layers=8}", "--out", graph])
    assert code == 0, stderr
    steps = {}
    for args in ([], ["--hardware", "b200"], ["--set", "hbm_bandwidth=0.5TB/s"]):
        code, stdout, stderr = run_cli(["estimate", graph, "--json", *args])
        assert code == 0, stderr
        steps[" ".join(args)] = json.loads(stdout)["step_time_s"]
    assert len(set(steps.values())) == 3, steps
    code, _, stderr = run_cli(["extract", "--model", "tiny", "--devices", "8", "--unroll",
                               "--passes", "layer-template{layers=8,hardware=b200}"])
    assert code == 2 and "hardware" in stderr


def test_models_and_hardware_list(tmp_path):
    code, stdout, _ = run_cli(["models", "--json"])
    models = json.loads(stdout)
    assert code == 0 and models["llama3-70b"]["layers"] == 80
    assert models["deepseek-v3"]["experts"] == 256
    code, stdout, _ = run_cli(["hardware", "--json"])
    report = json.loads(stdout)
    assert code == 0 and report["specs"]["gb200-nvl72"]["compile_target"] == "b200"
    assert report["specs"]["mi300x"]["compile_target"] == "h100-sxm"
    assert report["specs"]["v100-sxm2"]["compile_target"] == "a100-80gb-sxm"
    assert "h100-sxm" in report["compile_targets"]


@pytest.mark.parametrize("fields", [dict(pp=2, vp=3, global_batch=12),
                                    dict(pp=3, global_batch=11),
                                    dict(pp=2, schedule="gpipe", global_batch=9)])
def test_long_pipelines_extrapolate_the_steady_state(fields):
    """A step of many micro-batches priced from two short ones (flint.steady_state)
    matches the whole simulation (timeline=True simulates every micro-batch)."""
    from flint.engine import predict

    run = TrainingRun(model=LLAMA6, devices=fields["pp"] * 2, tp=2, **fields)
    short, whole = predict(run), predict(run, timeline=True)
    assert len(short.facts["pipeline_simulated_microbatches"]) == 2
    assert whole.facts["pipeline_simulated_microbatches"] == [run.microbatches]
    for name in ("step_time_s", "compute_busy_s", "memory_bytes", "mfu"):
        print(f"{run.schedule} m={run.microbatches} {name}: {getattr(short, name):.6g} vs "
              f"{getattr(whole, name):.6g}")
        assert getattr(short, name) == pytest.approx(getattr(whole, name), rel=0.005), name
    assert short.bubble_fraction == pytest.approx(whole.bubble_fraction, abs=0.005)


def test_interleaved_steady_state_starts_at_four_times_the_stages():
    """Llama-3-8B, PP2 VP2 CP2, 32 micro-batches: its stages are unequal (the 128K-vocab
    head), and the step only grows by the same time per group of p micro-batches from
    m = 4p on (warm-up and cool-down each span up to 2p). Priced from 2p and 3p it came
    out 6% short of the whole simulation with a negative bubble."""
    from flint.engine import predict

    run = TrainingRun(model="llama3-8b", seq_len=8192, devices=64, cp=2, pp=2, vp=2,
                      zero=1, remat="none", global_batch=512)
    short, whole = predict(run), predict(run, timeline=True)
    assert short.facts["pipeline_simulated_microbatches"] == [8, 10]
    assert short.step_time_s == pytest.approx(whole.step_time_s, rel=0.002)
    assert 0 < short.bubble_fraction == pytest.approx(whole.bubble_fraction, abs=0.003)


def test_block_recompute_is_priced_between_its_two_ends():
    """remat full over k of a chunk's L layers (Megatron's block method): step and memory
    k/L of the way from no recompute to full recompute, the prediction saying so; k must
    fit the chunk and belongs to remat full; least_recompute picks the fewest layers that
    fit a capacity the run exceeds."""
    from dataclasses import replace

    from flint.engine import predict
    from flint.fit_memory import least_recompute

    base = dict(model=LLAMA6, seq_len=2048, devices=4, pp=2, micro_batch=2, global_batch=16)
    none = predict(TrainingRun(**base, remat="none"))
    full = predict(TrainingRun(**base, remat="full"))
    one = TrainingRun(**base, remat="full", recompute_layers=1)    # 1 of 3 per chunk
    p = predict(one)
    assert p.step_time_s == pytest.approx(none.step_time_s + (full.step_time_s
                                                              - none.step_time_s) / 3)
    assert p.memory_bytes == pytest.approx(none.memory_bytes + (full.memory_bytes
                                                                - none.memory_bytes) / 3)
    assert full.step_time_s > p.step_time_s > none.step_time_s
    assert "1 of 3 layers per chunk" in p.facts["block_recompute"]
    assert predict(replace(one, recompute_layers=3)).step_time_s == full.step_time_s
    assert "remat=full/1" in one.label()
    with pytest.raises(FlintError, match="recompute_layers: block recompute .* not selective"):
        TrainingRun(**base, recompute_layers=1)
    with pytest.raises(FlintError, match="recompute_layers: 4 exceeds the 3 layers"):
        TrainingRun(**base, remat="full", recompute_layers=4)
    with pytest.raises(FlintError, match="no single timeline"):
        predict(one, timeline=True)
    # a capacity between the two ends: the fewest layers that fit
    gib = (none.memory_bytes + 2 * full.memory_bytes) / 3 / 2**30 + 0.01
    what_if = (f"hbm_capacity={gib:.3f}GiB",)
    fitted = least_recompute(TrainingRun(**base, remat="none"), what_if)
    assert (fitted.remat, fitted.recompute_layers) == ("full", 2)
    assert not predict(fitted, what_if=what_if).oom
    roomy = TrainingRun(**base, remat="none")
    assert least_recompute(roomy) is roomy
    code, stdout, stderr = run_cli(["predict", "--model", "tiny", "--seq-len", "64",
                                    "--devices", "4", "--global-batch", "8",
                                    "--remat", "full", "--recompute-layers", "1"])
    assert code == 0, stderr
    assert "block recompute" in stdout and "1 of 2 layers per chunk" in stdout


def test_fp8_report_states_the_mfu_basis():
    """An FP8 run's MFU and HFU are shares of the dense BF16 peak, which FP8 GEMMs can
    exceed: the report says so (a bf16 run's does not need to)."""
    argv = ["predict", "--model", "tiny", "--seq-len", "64", "--devices", "4",
            "--global-batch", "8"]
    code, stdout, stderr = run_cli(argv + ["--precision", "fp8"])
    assert code == 0, stderr
    assert "MFU / HFU basis" in stdout and "dense BF16 peak" in stdout
    code, stdout, stderr = run_cli(argv)
    assert code == 0, stderr
    assert "MFU / HFU basis" not in stdout


def test_fp8_delayed_scaling_drops_the_amax_passes():
    """Delayed scaling (Transformer Engine's DelayedScaling) takes each tensor's scale from
    earlier steps, so the cast is the only pass over it; current scaling first reads the
    tensor for its amax (and all-reduces it across TP): delayed is faster, with fewer
    reductions, and the report names the recipe."""
    argv = ["predict", "--model", "tiny", "--seq-len", "64", "--devices", "4", "--tp", "2",
            "--global-batch", "8", "--precision", "fp8", "--json"]
    out = cli_json_per(argv, "--fp8-recipe", ("current", "delayed"))
    cur, dly = out["current"], out["delayed"]
    assert dly["step_time_s"] < cur["step_time_s"]
    assert dly["by_class_s"]["reduction"] < cur["by_class_s"]["reduction"]
    assert dly["facts"]["fp8_scaling"].startswith("delayed")
    assert cur["facts"]["fp8_scaling"].startswith("current")
