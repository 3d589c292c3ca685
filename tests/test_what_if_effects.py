"""Every prediction says what each what-if did (flint/what_if_effects.py): applied, or
changed nothing and why, by name, in the report and the JSON of `flint predict` and
`flint estimate`."""
from __future__ import annotations

import json

import pytest

from conftest import run_cli
from flint.engine import predict
from flint.run import TrainingRun

ONE_NODE = TrainingRun(model="tiny", seq_len=64, devices=8, tp=2, global_batch=8)
TWO_NODES = ONE_NODE.replace(devices=16, global_batch=16)


def _effects(run, what_if) -> dict:
    return {e["what_if"]: e for e in predict(run, what_if=what_if).facts["what_if_effects"]}


def test_a_what_if_that_changes_nothing_says_so_and_why():
    effects = _effects(ONE_NODE, [
        "nic_bandwidth=800Gb/s",            # one node: nothing leaves NVLink
        "peak_fp8=4PFLOP/s",                # a bf16 run has no FP8 GEMM
        "hbm_bandwidth=4TB/s", "hbm_bandwidth=3.35TB/s",   # the later one wins...
        "scale_up_bandwidth=450GB/s",       # ...and is the spec's own figure, as is this
        "hbm_capacity=40GB",                # the memory verdict, not the step
        "kernel_floor=8us"])
    none = {k: e["detail"] for k, e in effects.items() if e["effect"] == "none"}
    assert none == {
        "nic_bandwidth=800Gb/s": "no collective crosses a node in this run (every group "
                                 "stays inside one 8-device nvlink domain)",
        "peak_fp8=4PFLOP/s": "no GEMM of this run runs in fp8 (its GEMMs: bf16 x 50, f32 x 2)",
        "hbm_bandwidth=4TB/s": "hbm_bandwidth=3.35TB/s later in the list overrides it",
        "hbm_bandwidth=3.35TB/s": "the h100-sxm spec already has hbm_bandwidth = 3.35TB/s",
        "scale_up_bandwidth=450GB/s": "the h100-sxm spec already has scale_up_bandwidth = "
                                      "450GB/s"}
    assert effects["hbm_capacity=40GB"]["effect"] == "memory only"
    assert "fits" in effects["hbm_capacity=40GB"]["detail"]
    assert effects["kernel_floor=8us"]["effect"] == "applied"
    assert "re-priced" in effects["kernel_floor=8us"]["detail"]


def test_the_network_what_ifs_apply_where_the_run_crosses_nodes():
    effects = _effects(TWO_NODES, ["nic_bandwidth=100Gb/s"])
    assert effects["nic_bandwidth=100Gb/s"]["effect"] == "applied"
    assert "collectives" in effects["nic_bandwidth=100Gb/s"]["detail"]
    assert predict(TWO_NODES, what_if=["nic_bandwidth=100Gb/s"]).step_time_s > \
        predict(TWO_NODES).step_time_s
    # tiny's messages are small: a faster NIC changes no collective's price, and says why
    (faster,) = _effects(TWO_NODES, ["nic_bandwidth=800Gb/s"]).values()
    assert faster["effect"] == "none"
    assert faster["detail"].startswith("no collective of this run is bound by it")
    # the NCCL_PROTO of an environment that allows Simple only (GCP's TCPXO): tiny's small
    # messages lose LL's latency
    simple = _effects(TWO_NODES, ["nccl_protocol=Simple", "nccl_protocol=auto"])
    assert simple["nccl_protocol=auto"]["detail"] == ("the h100-sxm spec already has "
                                                      "nccl_protocol = auto")
    (simple,) = _effects(TWO_NODES, ["nccl_protocol=Simple"]).values()
    assert simple["effect"] == "applied" and "collectives" in simple["detail"]
    assert predict(TWO_NODES, what_if=["nccl_protocol=Simple"]).step_time_s > \
        predict(TWO_NODES).step_time_s


@pytest.mark.parametrize("command", ["predict", "estimate"])
def test_report_and_json_name_the_what_if_that_changed_nothing(command, tmp_path):
    if command == "predict":
        # the README's example ("Wrong numbers")
        args = ["predict", "--model", "tiny", "--seq-len", "64", "--devices", "8", "--tp", "2"]
    else:
        from flint import engine

        layered, _ = engine.layered_graph(ONE_NODE, engine._cache(None))
        layered.save(tmp_path / "g.json")
        args = ["estimate", tmp_path / "g.json"]
    sets = ["--set", "nic_bandwidth=800Gb/s", "--set", "hbm_bandwidth=4.8TB/s"]
    code, out, err = run_cli([*args, *sets])
    assert code == 0, err
    assert ("what-if nic_bandwidth=800Gb/s changed nothing: no collective crosses a node "
            "in this run") in " ".join(out.split())
    assert "what-if hbm_bandwidth=4.8TB/s applied: re-priced" in out
    code, out, err = run_cli([*args, *sets, "--json"])
    assert code == 0, err
    doc = json.loads(out)
    effects = doc["facts"]["what_if_effects"] if command == "predict" else \
        doc["what_if_effects"]
    assert [(e["what_if"], e["effect"]) for e in effects] == [
        ("nic_bandwidth=800Gb/s", "none"), ("hbm_bandwidth=4.8TB/s", "applied")]


def test_a_latency_the_spec_does_not_state_says_what_it_replaces():
    (effect,) = _effects(TWO_NODES, ["nic_latency=20us"]).values()
    assert effect["effect"] == "applied"
    assert "replaces NCCL's own per-step latencies" in effect["detail"]


def test_no_what_if_no_effects():
    assert predict(ONE_NODE).facts["what_if_effects"] == []
