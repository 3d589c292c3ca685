"""`flint extract DUMP`: an XLA dump (directory or file) read as the direct path reads the
compile, with its device count, mesh and target recovered from the dump."""
import shutil
from pathlib import Path

import pytest

from tests.conftest import run_cli, run_libtpu_process
from flint.errors import FlintError
from flint.frontends.hlo_dump import load_dump
from flint.graph import WorkloadGraph

STEP = Path(__file__).parent / "hlo_dump_step.py"
# The graph's own content; meta says where it came from (jax vs hlo-dump) and may differ.
SAME = ("cluster", "nodes", "communicators", "loops")




@pytest.fixture(scope="module", params=["h100", "cpu", "tpu-v5p"])
def dumped(request, tmp_path_factory):
    """(dump dir, graph of the direct path) for one compile target, from a fresh process
    with XLA_FLAGS=--xla_dump_to (XLA reads it once, when its backends start). TPU: only
    with libtpu (the `tpu` extra), as MaxText's AOT compile for a TPU topology dumps."""
    if request.param.startswith("tpu"):
        pytest.importorskip("libtpu")
    root = tmp_path_factory.mktemp(f"dump-{request.param}")
    out = root / "direct.json"
    done = run_libtpu_process([str(STEP), str(root / "dump"), request.param, str(out)],
                              timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return root / "dump", WorkloadGraph.load(out), request.param


def test_dump_directory_round_trips_to_the_direct_graph(dumped):
    directory, direct, hardware = dumped
    graph = load_dump(str(directory))
    a, b = direct.to_json(), graph.to_json()
    for key in SAME:
        assert a[key] == b[key], key
    assert graph.cluster.mesh == (("data", 4), ("model", 2))       # from the Shardy mesh
    assert graph.cluster.hardware == {"cpu": "cpu", "h100": "h100-sxm"}.get(hardware, hardware)
    assert graph.meta["mesh_from"] == "module"
    assert any(n.collective is not None for n in graph.nodes)
    assert graph.loops and graph.loops[0].trip_count == 3           # the scanned layers


def test_proto_file_round_trips_too(dumped):
    directory, direct, hardware = dumped
    proto = next(directory.glob("*train_step*after_optimizations.hlo.pb"))
    # a lone TPU proto shows no tiled layouts to tell the target by: name it
    graph = load_dump(str(proto), hardware=hardware if hardware.startswith("tpu") else None)
    assert all(direct.to_json()[k] == graph.to_json()[k] for k in SAME)


def test_module_is_the_train_step_or_the_one_named(dumped):
    directory, _, _ = dumped
    assert load_dump(str(directory)).meta["module"] == "jit_train_step"
    small = [p for p in directory.glob("*after_optimizations.txt") if "train_step" not in
             p.name]
    assert small, "the dump should hold a second module"
    name = small[0].name.split(".")[1]
    assert load_dump(f"{directory}:{name}").meta["module"] != "jit_train_step"
    with pytest.raises(FlintError, match="matches no module"):
        load_dump(f"{directory}:no_such_module")


def test_the_text_module_takes_the_buffer_assignment_of_its_proto(dumped):
    """The dump's HloProto beside the text holds XLA's buffer assignment: read for which
    dynamic-update-slice fusions ran in place (every one here: the scanned layers'
    stacks), so the graph matches the direct path's (test above)."""
    from flint.hlo.dump import choose_module
    from flint.hlo.loaders import load_hlo

    directory, _, hardware = dumped
    chosen = choose_module(str(directory))
    assert chosen.path.name.endswith("after_optimizations.txt")
    assert chosen.proto is not None and chosen.proto.name.endswith("after_optimizations.hlo.pb")
    module = load_hlo(chosen.proto)
    updates = [n for n in load_dump(str(directory)).nodes if "update_element_bytes" in n.meta]
    assert module.copied_updates == frozenset()
    if hardware == "h100":                   # XLA:GPU's in-place emitter
        assert updates and all(n.meta["update_element_bytes"] in (2, 4) for n in updates)


def test_cli_reads_a_dump_and_takes_a_mesh(dumped, tmp_path):
    directory, direct, hardware = dumped
    if hardware != "h100":
        pytest.skip("one CLI run is enough")
    code, out, err = run_cli(["extract", directory, "--json"])
    assert code == 0, err
    assert '"devices": 8' in out and '"model": 2' in out
    code, _, err = run_cli(["extract", directory, "--mesh", "fsdp=8", "--out", tmp_path / "g"])
    assert code == 0, err
    assert WorkloadGraph.load(tmp_path / "g").cluster.mesh == (("fsdp", 8),)
    code, _, err = run_cli(["extract", directory, "--mesh", "fsdp=4", "--devices", "4"])
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "partitioned for 8 devices" in err
    code, _, err = run_cli(["extract", directory, "--devices", "16"])
    assert code == 2 and "but --devices is 16" in err


def test_newer_hlo_text_fails_on_one_line_naming_the_construct(dumped, tmp_path):
    directory, _, _ = dumped
    text = next(directory.glob("*train_step*after_optimizations.txt")).read_text()
    # attributes XLA may add to the module header or instructions later are read past
    newer = text.replace("num_partitions=8", "num_partitions=8, future_option={a=1}", 1)
    (tmp_path / "newer.after_optimizations.txt").write_text(newer)
    assert load_dump(str(tmp_path / "newer.after_optimizations.txt")).cluster.devices == 8
    # a primitive type this XLA does not know is named, on one line, exit code 2
    first = next(line for line in text.splitlines() if "= bf16[" in line)
    bad = text.replace(first, first.replace("bf16[", "f3e1m1[", 1), 1)
    (tmp_path / "bad.after_optimizations.txt").write_text(bad)
    code, out, err = run_cli(["extract", tmp_path / "bad.after_optimizations.txt"])
    assert code == 2 and not out and len(err.strip().splitlines()) == 1
    assert "f3e1m1[" in err and "line " in err and "Traceback" not in err


def test_dump_without_optimized_hlo_is_one_line(tmp_path):
    (tmp_path / "module_0000.jit_f.before_optimizations.txt").write_text("HloModule x\n")
    code, _, err = run_cli(["extract", tmp_path])
    assert code == 2 and "no optimized HLO" in err and len(err.strip().splitlines()) == 1
    shutil.rmtree(tmp_path)
