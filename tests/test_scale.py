"""The per-device graph does not grow with the cluster; large CPU device counts work."""
import json

import pytest

from conftest import run_flint
from flint.frontends.jax import capture
from flint.models.train import build


def _graph(devices):
    mesh = (("data", devices // 8), ("model", 8))
    w = build("tiny", mesh, layers=2)
    step = capture(w.step, devices=devices, mesh=dict(mesh), hardware="h100-sxm",
                   in_specs=w.in_specs, out_specs=w.out_specs, donate_argnums=w.donate_argnums)
    return step.workload(*w.args)


def test_graph_size_independent_of_device_count():
    small, large = _graph(64), _graph(4096)
    assert large.cluster.devices == 4096
    assert abs(len(large.nodes) - len(small.nodes)) <= 0.05 * len(small.nodes)
    # weak scaling: one sequence per replica, so each device does the same work
    assert large.total_flops() == pytest.approx(small.total_flops(), rel=0.01)
    sizes = {c.size for c in large.communicators if c.kind == "groups"}
    assert 8 in sizes and 512 in sizes
    for c in large.communicators:
        groups = c.groups()
        assert groups.shape == (c.num_groups, c.size if c.kind == "groups" else 2)
        if c.kind == "groups":
            assert sorted(groups.ravel().tolist()) == list(range(4096))


def test_cpu_target_beyond_2048_devices():
    r = run_flint("extract", "--model", "tiny", "--devices", "4096", "--hardware", "cpu",
                  "--mesh", "data=512,model=8", "--layers", "1", "--json", timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    s = json.loads(r.stdout)["summary"]
    assert s["devices"] == 4096 and s["hardware"] == "cpu"
    assert set(s["collectives_by_mesh_axis"]) >= {"data", "model"}
