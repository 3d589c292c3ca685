"""Hostile input on every surface: the generated corpus (tests/hostile_cases.py), each case
run in-process through the real `flint` entry point, must end with exit code 2, one line
on stderr, no traceback and nothing written; plus interrupts and injection checks."""
import ast
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hostile_cases import all_cases, write_graph

from tests.conftest import run_cli

CASES = all_cases()




def snapshot(directory: Path) -> dict:
    return {str(p.relative_to(directory)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in directory.rglob("*")}


def test_corpus_is_large_and_names_are_unique():
    names = [c[0] for c in CASES]
    assert len(names) >= 150
    assert len(set(names)) == len(names), [n for n in names if names.count(n) > 1]


@pytest.mark.parametrize("name,setup,argv", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2_nothing_written(tmp_path, monkeypatch, name, setup,
                                                      argv):
    monkeypatch.chdir(tmp_path)     # a relative output would land here, and be seen
    setup(tmp_path)
    before = snapshot(tmp_path)
    code, out, err = run_cli(argv(tmp_path))
    lines = err.strip().splitlines()
    assert code == 2, (code, out[-500:], err[-2000:])
    assert len(lines) == 1 and lines[0].startswith("flint: error: "), err[-2000:]
    assert "Traceback" not in err + out
    assert "unexpected" not in lines[0], lines[0]          # an error Flint did not foresee
    assert snapshot(tmp_path) == before, name
    assert not (tmp_path / "pwned").exists()


def test_injection_cases_are_refused():
    names = {c[0] for c in CASES}
    assert {"injection: export --prefix shell command",
            "injection: replay graph name with a newline"} <= names


def test_replay_quotes_the_graph_name(tmp_path):
    """Defence in depth: even a name that is let through lands in the program as a
    Python literal, never as code (the CLI refuses control characters besides)."""
    from flint.graph import WorkloadGraph
    from flint.replay import replay_program

    graph = WorkloadGraph.from_json(__import__("hostile_cases").GRAPH)
    evil = "g\nimport os; os.system('touch pwned')\n#"
    plain = ast.parse(replay_program(graph, "g.json"))
    hostile = ast.parse(replay_program(graph, evil))
    assert [type(s).__name__ for s in hostile.body] == [type(s).__name__ for s in plain.body]
    assert not any(isinstance(s, ast.Expr) and "system" in ast.unparse(s)
                   for s in hostile.body)


def test_error_text_keeps_square_brackets(tmp_path):
    code, _, err = run_cli(["estimate", str(tmp_path / "[x].json")])
    assert code == 2 and "[x].json" in err


def test_stale_partial_export_is_removed(tmp_path):
    write_graph(tmp_path)
    stale = tmp_path / ".et.abc123.partial"
    stale.mkdir()
    (stale / "w.0.et").write_bytes(b"half")
    code, _, err = run_cli(["export", str(tmp_path / "g.json"), "--out", str(tmp_path / "et")])
    assert code == 0, err
    assert not stale.exists() and (tmp_path / "et" / "workload.0.et").is_file()


def _flint(*args, **kw):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-m", "flint.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, **kw)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_export_leaves_nothing_and_exits_130(tmp_path, signum):
    """A signal while the rank files are written: exit 130, one line, no `.partial`."""
    from hostile_cases import tiny_graph

    from flint.cluster import Cluster
    from flint.graph import WorkloadGraph

    g = tiny_graph()
    big = WorkloadGraph(Cluster(65536, (("data", 65536),), "h100-sxm"), g.nodes[:1] +
                        g.nodes[2:3], [], [], {})
    big.nodes[1].inputs, big.nodes[1].id = [0], 1
    big.save(tmp_path / "big.json")
    p = _flint("export", str(tmp_path / "big.json"), "--out", str(tmp_path / "et"),
               "--workers", "1")
    deadline = time.time() + 60
    while time.time() < deadline and not list(tmp_path.glob(".et.*.partial/*.et")):
        time.sleep(0.05)
    assert list(tmp_path.glob(".et.*.partial/*.et")), "the export never started writing"
    p.send_signal(signum)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert err.strip().splitlines() == ["flint: interrupted"]
    assert sorted(x.name for x in tmp_path.iterdir()) == ["big.json"]


@pytest.fixture
def python_sigint():
    """Python's own SIGINT handler for the test (an earlier test's library may have left
    SIGINT ignored, which HeldSignals then rightly keeps ignoring), restored after."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_signal_during_the_writes_is_taken_between_files(tmp_path, monkeypatch,
                                                         python_sigint):
    """A SIGINT while writer threads run is held until the main thread is between files
    (flint.guard.HeldSignals), then raised: few files after it, the pool's threads gone,
    nothing left behind. Raised at an arbitrary point, it once left the pool's lock held
    and the export hung (CI)."""
    import os
    import threading

    from hostile_cases import tiny_graph

    import flint.exporters.chakra as chakra
    from flint.cluster import Cluster
    from flint.graph import WorkloadGraph

    g = tiny_graph()
    graph = WorkloadGraph(Cluster(512, (("data", 512),), "h100-sxm"), g.nodes[:1] +
                          g.nodes[2:3], [], [], {})
    graph.nodes[1].inputs, graph.nodes[1].id = [0], 1
    started, handlers, threads_before = [], [], threading.active_count()
    rank_bytes = chakra.ChakraPlan.rank_bytes

    def signalling(plan, rank):
        started.append(rank)
        if rank == 0:          # what a signal would run in the main thread meanwhile
            handlers.append(signal.getsignal(signal.SIGINT))
        if rank == 100:
            os.kill(os.getpid(), signal.SIGINT)   # from a writer thread, as a terminal's would
        return rank_bytes(plan, rank)

    monkeypatch.setattr(chakra.ChakraPlan, "rank_bytes", signalling)
    with pytest.raises(KeyboardInterrupt):
        chakra.export_chakra(graph, tmp_path / "et", workers=2, check=False)
    assert 100 in started and len(started) <= 110, f"{len(started)} ranks were written"
    assert handlers[0] is not signal.default_int_handler, "a signal would raise mid-write"
    assert threading.active_count() == threads_before
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_held_signals_act_only_at_a_check_or_the_end(python_sigint):
    import os

    from flint.guard import HeldSignals

    with pytest.raises(KeyboardInterrupt):
        with HeldSignals() as held:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)                      # a handler would have run by now
            reached = True
            held.check()
            raise AssertionError("check() did not raise")
    assert reached
    with pytest.raises(KeyboardInterrupt):
        with HeldSignals():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            reached_end = True
    assert reached_end
    with HeldSignals() as held:
        held.check()                              # nothing held: nothing happens
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_unwritable_output_directory_is_refused_before_work(tmp_path, monkeypatch):
    """A read-only directory (simulated: the tests run as root, who may write anywhere)
    is found by the probe before the graph is even read."""
    import flint.guard

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    write_graph(tmp_path)
    monkeypatch.setattr(flint.guard.tempfile, "mkstemp", refuse)
    for argv in (["replay", str(tmp_path / "g.json"), "--out", str(tmp_path / "b.py")],
                 ["extract", "-n", "8", "--out", str(tmp_path / "x.json")],
                 ["export", str(tmp_path / "g.json"), "--out", str(tmp_path / "et")]):
        code, _, err = run_cli(argv)
        assert code == 2 and err.count("\n") == 1 and "cannot write in" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.json"]
