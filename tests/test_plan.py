"""flint plan: the search space agrees with the run checks, the closed form's memory floor
stays under predict's, the plan prices with predict (library == plan), ties break the
same way every time, an interrupted plan resumes, co-design re-plans per point, the HTML
report opens in headless Chromium with its plots, and bad input is one line.

Every plan here is the tiny zoo model on 8 devices with its axes pinned to two stage
programs (the session cache shares them with tests/test_engine.py and test_sweep.py)."""
from __future__ import annotations

import json
import random
import shutil
import sys
from pathlib import Path

import pytest

from conftest import REPO, run_cli
from flint.errors import FlintError
from flint.plan_search import Budget, search
from flint.plan_space import PlanRequest, enumerate_space, invalid_reason, model_config

TINY = PlanRequest(model="tiny", devices=(8,), seq_len=64, global_batch=16, tp=(1, 2),
                   micro_batch=(1,), remat=("selective",), zero=(1,))
TINY_MOE = {"base": "tiny", "experts": 4, "top_k": 2, "moe_ffn": 64}
STABLE = ("time_s", "extracted")          # wall-clock facts of a row


def stable(rows):
    return [{k: v for k, v in r.items() if k not in STABLE} for r in rows]


@pytest.mark.parametrize("model", ["tiny", TINY_MOE])
def test_space_rules_agree_with_the_run_checks(model):
    """The planner's own divisibility verdict is TrainingRun's, on a random sample of
    raw layouts (valid and not)."""
    from flint.run import TrainingRun

    request = PlanRequest(model=model if isinstance(model, str) else tuple(model.items()),
                          devices=(8,), seq_len=64, global_batch=16, zero=(1, 3),
                          hsdp=(0, 2))
    cfg = model_config(request)
    rng = random.Random(0)
    agree = 0
    for _ in range(120):
        c = {"tp": rng.choice([1, 2, 3, 4]), "cp": rng.choice([1, 2, 4]),
             "pp": rng.choice([1, 2, 4]), "vp": rng.choice([1, 2, 3]),
             "ep": rng.choice([1, 2, 4]), "zero": rng.choice([1, 3]),
             "hsdp": rng.choice([0, 2]), "micro_batch": rng.choice([1, 2, 4]),
             "remat": "selective", "precision": "bf16"}
        why = invalid_reason(request, cfg, 8, c)
        from flint.plan_space import Candidate

        try:
            Candidate(devices=8, **c).run(request)
            ok = True
        except FlintError:
            ok = False
        assert ok == (why == ""), (c, why)
        agree += 1
    assert agree == 120
    space = enumerate_space(request)
    assert space.counts["valid"] == len(space.candidates) > 0
    assert space.counts["raw"] == space.counts["valid"] + space.counts["invalid"]


def test_program_signature_partitions_like_the_engine():
    """Layouts with one planner signature compile one stage program, and the other way
    round (the program budget counts what really compiles)."""
    from flint.engine import stage_program
    from flint.hardware_models.spec import load_spec
    from flint.template_cache import program_key

    request = TINY.with_(tp=None, micro_batch=(1, 2), zero=(1, 3), remat=None)
    spec = load_spec(request.hardware)
    sample = random.Random(1).sample(enumerate_space(request).candidates, 40)
    by_sig, by_key = {}, {}
    for c in sample:
        sig = c.program_signature(request, spec.devices_per_node)
        key = program_key(stage_program(c.run(request)))
        assert by_sig.setdefault(sig, key) == key
        assert by_key.setdefault(key, sig) == sig


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    out = tmp_path_factory.mktemp("plan") / "out"
    events = []
    result = search(TINY, Budget(candidates=6), out=out,
                    on_event=lambda kind, info: events.append((kind, dict(info))))
    return out, result, events


def test_plan_prices_with_predict_and_ranks(planned):
    from flint.engine import predict
    from flint.plan_space import Candidate

    out, result, events = planned
    rows = result.rows
    assert result.counts["raw"] >= result.counts["valid"] >= result.counts["ranked"] > 0
    assert 0 < len(rows) <= 6 and result.winner is rows[0]
    steps = [r["step_time_s"] for r in result.fitting]
    assert steps == sorted(steps)
    w = result.winner
    run = Candidate(**{k: w[k] for k in Candidate.__dataclass_fields__}).run(TINY)
    p = predict(run)
    assert p.step_time_s == w["step_time_s"] and p.memory_bytes == w["memory_bytes"]
    # the progress events count up to what was priced
    priced = [info["priced"] for kind, info in events if kind == "priced"]
    assert priced == list(range(1, len(rows) + 1))
    # the closed form's floor never exceeds what predict holds in memory
    for r in result.fitting:
        assert r["analytic"]["memory_floor_bytes"] <= r["memory_bytes"]
    lines = (out / "results.jsonl").read_text().splitlines()
    assert len(lines) == len(rows)


def test_why_runner_up_and_pareto(planned):
    from flint.plan_explain import layout, pareto, report, why

    _, result, _ = planned
    text = why(result.rows)
    assert text[0].startswith(f"winner {layout(result.winner)}")
    assert any(line.startswith("dominated by") for line in text)
    assert any(line.startswith("runner-up") and "slower" in line for line in text)
    fronts = pareto(result.rows)
    for front in fronts.values():      # each front strictly improves its step time
        steps = [r["step_time_s"] for r in front]
        assert steps == sorted(steps, reverse=True) and len(set(steps)) == len(steps)
    assert fronts["memory"][-1]["step_time_s"] == result.winner["step_time_s"]
    doc = report(result, 3)
    assert json.loads(json.dumps(doc)) == doc and len(doc["top"]) <= 3


def test_plan_is_deterministic_and_resumes_after_an_interrupt(planned, tmp_path):
    _, result, _ = planned
    again = search(TINY, Budget(candidates=6))
    assert stable(again.rows) == stable(result.rows)
    seen = []

    def stop_after_two(kind, info):
        if kind == "priced":
            seen.append(info["row"]["key"])
            if len(seen) == 2:
                raise KeyboardInterrupt
    out = tmp_path / "resumed"
    with pytest.raises(KeyboardInterrupt):
        search(TINY, Budget(candidates=6), out=out, on_event=stop_after_two)
    assert len((out / "results.jsonl").read_text().splitlines()) == 2
    fresh = []
    resumed = search(TINY, Budget(candidates=6), out=out,
                     on_event=lambda kind, info: kind == "pricing" and fresh.append(1))
    assert stable(resumed.rows) == stable(result.rows)
    assert len(fresh) == len(result.rows) - 2          # the two kept rows were not re-priced
    assert len((out / "results.jsonl").read_text().splitlines()) == len(result.rows)


def test_codesign_replans_each_point():
    from flint.hardware_models.spec import load_spec
    from flint.plan_whatif import codesign, knob_points

    spec = load_spec("h100-sxm")
    points = knob_points(spec, ["scale_up_bandwidth", "peak_bf16=2000TFLOP/s"], 8)
    assert [p.text for p in points] == ["225GB/s", "900GB/s", "2000TFLOP/s"]
    study = codesign(TINY, points, Budget(candidates=4, min_priced=2))
    names = [r["knob"] for r in study.sensitivity]
    assert sorted(names) == ["peak_bf16", "scale_up_bandwidth"]
    for row in study.sensitivity:
        assert row["elasticity"] is not None and len(row["points"]) >= 1
        assert all(c["step_time_s"] > 0 for c in row["points"])
    nvlink = next(r for r in study.sensitivity if r["knob"] == "scale_up_bandwidth")
    slow, fast = (c["step_time_s"] for c in nvlink["points"])
    assert slow >= fast                 # a faster NVLink never slows the best plan
    with pytest.raises(FlintError, match="not a co-design knob"):
        knob_points(spec, ["nic_speed"], 8)


def test_html_report_opens_offline_in_chromium(planned, tmp_path):
    from flint.engine import predict
    from flint.plan_explain import report
    from flint.plan_html import render_html
    from flint.plan_space import Candidate

    _, result, _ = planned
    w = result.winner
    run = Candidate(**{k: w[k] for k in Candidate.__dataclass_fields__}).run(TINY)
    page = render_html(report(result, 5), predict(run, timeline=True).timeline,
                       [{"knob": "nic_bandwidth", "name": "NIC bandwidth", "unit": "Gb/s",
                         "baseline": 400, "baseline_winner": None, "elasticity": -0.1,
                         "largest_change": 0.05,
                         "points": [{"value": 200, "text": "200Gb/s", "step_time_s": 1.0,
                                     "change": 0.05, "winner": "x", "note": ""}]}])
    assert "<script src" not in page and "<link" not in page
    assert "https://" not in page and "http://" not in page.replace(
        'xmlns="http://www.w3.org/2000/svg"', "")
    path = tmp_path / "plan.html"
    path.write_text(page)
    if shutil.which("chromium") is None and shutil.which("chromium-browser") is None:
        pytest.skip("no chromium on this machine (apt-get install chromium)")
    sys.path.insert(0, str(REPO / "scripts"))
    from check_plan_html import check

    got = check(path, tmp_path / "plan.png")
    assert got["console"] == [] and got["missing"] == [], got
    # a broken page is caught: an empty chart makes the page's self-check log an error
    broken = tmp_path / "broken.html"
    broken.write_text(page.replace("</body>", '<svg class="plot" data-plot="gone"></svg></body>'))
    assert check(broken, tmp_path / "broken.png")["console"]


def test_cli_plan_json_and_bad_input(tmp_path):
    args = ["plan", "--model", "tiny", "--seq-len", "64", "--devices", "8",
            "--global-batch-tokens", "1024", "--tp", "1,2", "--micro-batch", "1",
            "--remat", "selective", "--zero", "1", "--budget", "4", "--json"]
    code, stdout, stderr = run_cli(args)
    assert code == 0, stderr
    doc = json.loads(stdout)
    assert doc["request"]["global_batch"] == 16 and doc["winner"]["status"] == "ok"
    assert doc["counts"]["priced"] <= 4 and doc["why"][0].startswith("winner")
    for bad, message in [(["--devices", "0"], "--devices"),
                         (["--global-batch", "16"], "--global-batch SEQUENCES or"),
                         (["--what-if", "colour"], "not a co-design knob"),
                         (["--budget", "soon"], "--budget takes"),
                         (["--precision", "fp8", "--hardware", "a100-80gb-sxm"],
                          "precision: fp8 GEMMs need FP8"),
                         (["--hardware", "h100-sxn"], "unknown hardware")]:
        code, stdout, stderr = run_cli(args + bad)
        assert code == 2, (bad, stderr)
        assert message in stderr and "Traceback" not in stderr, (bad, stderr)
        assert len(stderr.strip().splitlines()) == 1 and not stdout


def test_cli_parsers():
    from flint.cli.plan import parse_budget, parse_devices, parse_tokens

    assert parse_devices("256-1024") == (256, 512, 1024)
    assert parse_devices("96-256") == (96, 128, 256)
    assert parse_devices("64,8") == (8, 64)
    assert parse_tokens("8M") == 8_000_000 and parse_tokens("4194304") == 4194304
    assert parse_budget("40") == (40, None) and parse_budget("5m") == (None, 300.0)
    assert parse_budget("90s") == (None, 90.0)


def test_ray_executor_gives_the_local_plan(planned, tmp_path, ray_session):
    _, result, _ = planned
    remote = search(TINY, Budget(candidates=6), out=tmp_path / "ray", executor="ray",
                    workers=2)
    assert stable(remote.rows) == stable(result.rows)


def _readme_section() -> str:
    text = (REPO / "README.md").read_text()
    start = text.index("## Planning a training run")
    return text[start:text.index("\n## ", start + 10)]


def test_readme_plan_commands_run(tmp_path, monkeypatch):
    """Every `flint plan` command of the README runs: parsed, enumerated and ranked (with
    no stage program compiled: the session cache holds none of these models', so
    nothing is priced) and answered as JSON."""
    import shlex

    section = _readme_section()
    commands, current = [], ""
    for line in section.splitlines():
        if line.startswith("    flint plan") or (current and line.startswith("        ")):
            current += " " + line.strip().rstrip("\\")
            if not line.rstrip().endswith("\\"):
                commands.append(current)
                current = ""
    assert len(commands) == 5
    monkeypatch.chdir(tmp_path)
    for command in commands:
        argv = shlex.split(command)[1:] + ["--programs", "0", "--budget", "1", "--json"]
        code, stdout, stderr = run_cli(argv)
        assert code == 0, (command, stderr)
        doc = json.loads(stdout)
        assert doc["counts"]["ranked"] > 0 and doc["counts"]["priced"] == 0, command
        if "--what-if" in command:
            assert {r["knob"] for r in doc["sensitivity"]} == {"nic_bandwidth",
                                                               "scale_up_domain"}


def test_readme_plan_python_runs():
    """The README's library example, on the tiny model (its names and arguments as
    written; only the model, sizes and budget are made small)."""
    section = _readme_section()
    code = section[section.index("```python") + 9:section.index("```", section.index(
        "```python") + 9)]
    small = (code.replace('"llama3-70b"', '"tiny"').replace("(1024,)", "(8,)")
             .replace("seq_len=8192", "seq_len=64").replace("global_batch=1024",
                                                            "global_batch=16")
             .replace("Budget(candidates=24)", "Budget(candidates=2, programs=1)"))
    assert small != code and "search(PlanRequest(" in small
    scope: dict = {}
    exec(compile(small, "README.md", "exec"), scope)
    assert scope["result"].winner["step_time_s"] > 0
