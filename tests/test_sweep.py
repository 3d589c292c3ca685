"""Design-space sweeps: space validation, caching by program, resume, Pareto, executors."""
from __future__ import annotations

import json

import pytest

from conftest import run_flint
from flint.errors import FlintError
from flint.sweep import load_results, run_sweep
from flint.sweep_report import pareto_front, stable_rows, write_outputs
from flint.sweep_space import SearchSpace

TINY = {"model": "tiny", "seq_len": 64, "devices": [4, 8], "tp": [1, 2], "pp": [1, 2],
        "global_batch": 8,
        "what_if": [{}, {"nic_bandwidth": "800Gb/s"}, {"hbm_bandwidth": "4.8TB/s"}]}


def test_expand_counts_programs_and_skips_invalid():
    from flint.sweep_space import program_of

    points, skipped = SearchSpace.from_dict(TINY).expand()
    # 2 device counts x tp 2 x pp 2 = 8 shapes, each with 3 hardware scenarios
    assert len(points) == 24 and not skipped
    # one stage program per tensor-parallel degree: data-parallel replicas compile as two
    # and are re-targeted (tp 2 alone on a stage of 2 devices has none: its own program)
    assert len({program_of(p) for p in points}) == 3
    run = next(p.run for p in points if p.run.devices == 8 and p.run.tp == 2
               and p.run.pp == 2)
    assert (run.dp, run.microbatches, run.stage_devices) == (2, 4, 4)
    assert run.mesh() == (("data", 2), ("model", 2))
    points, skipped = SearchSpace.from_dict({**TINY, "devices": [4, 6]}).expand()
    assert any("do not split" in s["reason"] for s in skipped)


@pytest.mark.parametrize("doc, message", [
    ({"devices": []}, "empty search space"),
    ({"what_if": [{"nic_bandwidth": "fast"}]}, "nic_bandwidth"),
    ({"remat": ["some"]}, "remat"),
    ({"colour": 1}, "unknown search-space key"),
    ({"microbatch": [1]}, "'microbatch' is now micro_batch"),
])
def test_bad_spaces_are_errors(doc, message):
    with pytest.raises(FlintError, match=message):
        SearchSpace.from_dict({**TINY, **doc}).expand()


@pytest.mark.parametrize("doc, reason", [
    ({"tp": [3], "devices": [6]}, "tp: 3 does not divide tiny's 4 attention heads"),
    ({"pp": [4]}, "vp: pp 4 x vp 1 = 4 model chunks do not fill tiny's 2 layers"),
    ({"ep": [2]}, "has no experts"),
])
def test_invalid_points_are_skipped_with_the_reason(doc, reason):
    points, skipped = SearchSpace.from_dict({**TINY, **doc}).expand()
    assert reason in skipped[0]["reason"]


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep") / "run"
    seen = []
    rows = run_sweep(SearchSpace.from_dict(TINY), out, on_result=lambda r, i, n: seen.append(r))
    return out, rows, seen


def test_sweep_caches_programs_and_reestimates_hardware(swept):
    out, rows, seen = swept
    assert len(rows) == 24 and all(r["status"] == "ok" for r in rows)
    assert len(list((out / "templates").glob("*.json"))) == 3
    assert sum(r["extracted"] for r in seen) == 3      # each program compiled once
    for r in rows:
        assert r["step_time_s"] > 0 and r["memory_gib"] > 0
        # global batch 8 sequences of tiny's 64 tokens, however it is split
        assert r["tokens_per_s"] == pytest.approx(8 * 64 / r["step_time_s"])
        assert r["dp"] * r["micro_batch"] * r["microbatches"] == 8
    # a hardware-only what-if changes the prediction but not the program
    base = {(r["devices"], r["tp"], r["pp"]): r for r in rows if not r["what_if"]}
    fast = [r for r in rows if r["what_if"].get("hbm_bandwidth")]
    assert all(r["program"] == base[(r["devices"], r["tp"], r["pp"])]["program"] for r in fast)
    # (a 2-layer template's blocks share the slack a faster HBM leaves between them a
    # little differently: within 0.5%, see hardware_models/composite.py)
    assert all(r["step_time_s"] <= 1.005 * base[(r["devices"], r["tp"], r["pp"])]["step_time_s"]
               for r in fast)
    piped = [r for r in rows if r["pp"] == 2]
    assert all(0 < r["bubble_fraction"] < 1 for r in piped)


def test_sweep_resumes_and_survives_a_torn_line(swept, tmp_path):
    out, rows, _ = swept
    copy = tmp_path / "resume"
    copy.mkdir()
    (copy / "templates").mkdir()
    for f in (out / "templates").iterdir():
        (copy / "templates" / f.name).write_bytes(f.read_bytes())
    lines = (out / "results.jsonl").read_text().splitlines()
    (copy / "results.jsonl").write_text("\n".join(lines[:10]) + "\n" + lines[10][:40])
    assert len(load_results(copy)) == 10
    seen = []
    again = run_sweep(SearchSpace.from_dict(TINY), copy, on_result=lambda r, i, n: seen.append(r))
    assert len(seen) == 14 and not any(r["extracted"] for r in seen)   # cache hit
    assert stable_rows(again) == stable_rows(rows)


def test_a_claimed_point_without_its_row_is_priced_not_waited_on(tmp_path, monkeypatch):
    """A point this process claimed whose task came back without its row (a worker on
    other code wrote another key) is priced again here: waiting for its claim would wait
    on this process's own lock, for ever."""
    import threading

    import flint.sweep as sweep
    from flint.sweep import Claims

    claims = Claims(tmp_path)
    assert claims.take("k") and claims.take("k") and claims.take("k", wait=True)
    claims.release_all()
    real, calls = sweep.evaluate, []

    def first_call_loses_its_key(point, directory, factory):
        row = real(point, directory, factory)
        calls.append(point.key())
        return dict(row, key="elsewhere") if len(calls) == 1 else row

    monkeypatch.setattr(sweep, "evaluate", first_call_loses_its_key)
    space = SearchSpace.from_dict({**TINY, "devices": [4], "tp": [1], "pp": [1],
                                   "what_if": [{}]})
    out = []
    t = threading.Thread(target=lambda: out.append(run_sweep(space, tmp_path / "s")),
                         daemon=True)
    t.start()
    t.join(120)
    assert out, "the sweep waited on its own claim"
    assert [r["key"] for r in out[0]] == [p.key() for p in space.expand()[0]]
    assert len(calls) == 2


def test_outputs_are_deterministic_and_pareto_is_a_front(swept, tmp_path):
    out, rows, _ = swept
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    pa, pb = write_outputs(a, rows), write_outputs(b, list(reversed(rows))[::-1])
    for kind in pa:
        assert open(pa[kind], "rb").read() == open(pb[kind], "rb").read(), kind
    fronts = pareto_front(rows)
    assert len(fronts) == 3
    for name, front in fronts.items():
        assert front and all(not r["oom"] for r in front)
        times = [r["step_time_s"] for r in front]
        assert times == sorted(times, reverse=True)
        assert [r["devices"] for r in front] == sorted({r["devices"] for r in front})
    header = (a / "results.csv").read_text().splitlines()[0]
    assert header.startswith("model,seq_len,global_batch,devices")
    assert open(pa["plot"], "rb").read(4) == b"\x89PNG"


def test_ray_executor_gives_the_local_results(swept, tmp_path):
    pytest.importorskip("ray")
    out, rows, _ = swept
    space = SearchSpace.from_dict({**TINY, "devices": [8], "tp": [2]})
    local = run_sweep(space, tmp_path / "local")
    remote = run_sweep(space, tmp_path / "ray", executor="ray", workers=2)
    assert stable_rows(remote) == stable_rows(local)


def test_cli_sweep_and_bad_input(tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text("model: tiny\nseq_len: 64\ndevices: [4]\ntp: [1, 2]\nglobal_batch: 4\n")
    r = run_flint("sweep", str(space), "--out", str(tmp_path / "o"), "--pp", "1,2",
                  "--what-if", "", "--what-if", "nic_bandwidth=800Gb/s", "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["configurations"] == 8
    assert "[1/8]" in r.stderr and "configurations with pricing only" in r.stderr
    # the same sweep again reads its rows and says so, pricing nothing
    again = run_flint("sweep", str(space), "--out", str(tmp_path / "o"), "--pp", "1,2",
                      "--what-if", "", "--what-if", "nic_bandwidth=800Gb/s")
    assert again.returncode == 0 and "[1/8]" not in again.stderr, again.stderr
    assert "8 configurations read from" in again.stderr and "not priced again" in again.stderr
    for args, message in [(["--what-if", "hbm_bandwidth=-1TB/s"], "hbm_bandwidth"),
                          (["--axis", "zero"], "--axis takes FIELD=V1,V2"),
                          (["--axis", "colour=red"], "unknown search-space key")]:
        target = tmp_path / "bad"
        r = run_flint("sweep", str(space), "--out", str(target), *args)
        assert r.returncode == 2, (args, r.stderr)
        assert message in r.stderr and "Traceback" not in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
        assert not target.exists()
    bad = tmp_path / "bad.yaml"
    bad.write_text("devices: [4\n")
    r = run_flint("sweep", str(bad), "--out", str(tmp_path / "x"))
    assert r.returncode == 2 and "not valid YAML" in r.stderr


def test_every_point_invalid_is_a_table_not_a_crash(tmp_path):
    """All points invalid (here: no tensor-parallel degree divides the heads): the sweep
    says why, writes its tables, and exits 0."""
    space = tmp_path / "space.yaml"
    space.write_text("model: tiny\nseq_len: 64\ndevices: [6]\ntp: [3, 6]\n")
    r = run_flint("sweep", str(space), "--out", str(tmp_path / "o"), "--json")
    assert r.returncode == 0, r.stderr
    assert "no valid configuration" in r.stderr and "does not divide" in r.stderr
    skipped = (tmp_path / "o" / "skipped.csv").read_text().splitlines()
    assert len(skipped) == 3 and skipped[0].endswith("reason")
    assert json.loads(r.stdout)["configurations"] == 0
