"""Sweeps that cannot go wrong silently: a sweep whose every configuration fails when it
is priced ends in tables that say so (exit 0, no traceback), and two sweeps started at once
on one output directory price every configuration once between them."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from conftest import REPO

SPACE = "model: tiny\nseq_len: 64\ndevices: [8, 16]\ntp: [2]\npp: [1, 2]\n"


def test_a_sweep_of_only_invalid_configurations_says_so(tmp_path):
    """Valid runs that no spec can lay out (6 or 10 GPUs in GB200 NVL72 nodes of 4): each
    point fails when priced, before any compile; the sweep says why and writes its tables."""
    from conftest import run_flint

    space = tmp_path / "space.yaml"
    space.write_text("model: tiny\nseq_len: 64\ndevices: [6, 10]\ntp: [1, 2]\n"
                     "hardware: [gb200-nvl72]\n")
    r = run_flint("sweep", str(space), "--out", str(tmp_path / "o"), "--json")
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and "a bug in Flint" not in r.stderr
    assert "no valid configuration; why:" in r.stderr
    assert "2 x 6 devices do not fill whole gb200-nvl72 nodes of 4 devices" in r.stderr
    report = json.loads(r.stdout)
    assert (report["configurations"], report["priced"]) == (4, 0)
    assert report["pareto"] == {"gb200-nvl72": []}
    rows = [json.loads(x) for x in (tmp_path / "o" / "results.jsonl").read_text().splitlines()]
    assert [r["status"] for r in rows] == ["invalid"] * 4
    assert not any(r["extracted"] for r in rows)          # failed before compiling
    table = (tmp_path / "o" / "results.csv").read_text().splitlines()
    assert len(table) == 5 and all(",invalid," in line for line in table[1:])
    assert (tmp_path / "o" / "sweep_pareto.png").read_bytes()[:4] == b"\x89PNG"


# A `flint sweep` that waits at a barrier once it is imported, so that two of them start
# pricing at the same moment (process start-up takes seconds and varies).
_AT_THE_BARRIER = """
import sys, time, pathlib
import flint.engine, flint.sweep, flint.cli
from flint.frontends.targets import import_jax_quietly
import_jax_quietly()
ready, go = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
ready.touch()
while not go.exists():
    time.sleep(0.005)
flint.cli.main(sys.argv[3:])
"""


def test_two_sweeps_on_one_directory_price_each_configuration_once(tmp_path):
    from flint.engine import stage_program
    from flint.sweep_space import SearchSpace, program_of
    from flint.template_cache import TemplateCache

    import yaml

    space = tmp_path / "space.yaml"
    space.write_text(SPACE + "what_if: [{}, {nic_bandwidth: 800Gb/s}]\n")
    points, _ = SearchSpace.from_dict(yaml.safe_load(space.read_text())).expand()
    out = tmp_path / "out"
    # the directory starts with the session's compiled programs: the two sweeps race on
    # pricing, not on a compile
    (out / "templates").mkdir(parents=True)
    cache = TemplateCache(os.environ["FLINT_CACHE"])
    for program in {program_of(p): stage_program(p.run) for p in points}.values():
        cache.get(program)
        shutil.copy(cache.path(program), out / "templates")
    go = tmp_path / "go"
    procs = []
    for i in range(2):
        cmd = [sys.executable, "-c", _AT_THE_BARRIER, str(tmp_path / f"ready{i}"), str(go),
               "sweep", str(space), "--out", str(out), "--json"]
        procs.append(subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    deadline = time.time() + 300
    while not all((tmp_path / f"ready{i}").exists() for i in range(2)):
        assert time.time() < deadline and all(p.poll() is None for p in procs)
        time.sleep(0.05)
    go.touch()
    results = [p.communicate(timeout=300) for p in procs]
    for p, (stdout, stderr) in zip(procs, results):
        assert p.returncode == 0, stderr
        assert json.loads(stdout)["configurations"] == len(points) == 8
    rows = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    keys = [r["key"] for r in rows]
    assert sorted(keys) == sorted(p.key() for p in points)     # each key priced once
    assert all(r["status"] == "ok" for r in rows)
    # both reported every configuration, priced by either of them
    lines = [s.count("ms/step") for _, s in results]
    assert sum(lines) == len(points), [s for _, s in results]
    assert not list((out / "claims").glob("*.lock")) or all(
        _unlocked(f) for f in (out / "claims").glob("*.lock"))


def _unlocked(path: Path) -> bool:
    """No process holds the claim (a finished sweep releases every one it took)."""
    import fcntl

    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
