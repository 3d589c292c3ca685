"""One number per configuration: three rows of ../shared/tables/published.md (a dense
pipeline row, an FSDP row and a MoE expert-parallel row) priced by the table script, by
`flint predict` and by `flint sweep` give the same step."""
from __future__ import annotations

import json
import sys

import pytest

from conftest import REPO, run_cli

sys.path.insert(0, str(REPO / "scripts"))
ROWS = ("1b#6 v1 LLAMA2-13B DGX-H100 16 FP8",          # tp1 pp4 vp10, distributed optimizer
        "1a#256 25.11 LLAMA3_8B Pre-Training DGX-H100 8 FP8-CS",   # FSDP (zero 3)
        "1a#254 25.11 Qwen3_30B_a3B Pre-Training DGX-B200 8 FP8-MX")  # MoE, EP 8


def _table_runs():
    import published_moe
    from compare_published import training_run
    from published_rows import TABLE, rows_of
    from table_columns import tables

    if not TABLE.is_file():
        pytest.skip("shared published table not present")
    dense = {r.label: r for h, recs in tables(TABLE) for r in rows_of(h, recs)}
    moe = {r.label: r for r in published_moe.moe_rows(TABLE)}
    out = {}
    for label in ROWS:
        row = dense.get(label) if label in dense and not dense[label].moe else moe[label]
        out[label] = row.run if hasattr(row, "run") and row.run is not None else \
            training_run(row)
    return dense, moe, out


def _flags(run) -> list[str]:
    doc = run.to_json()
    flags = []
    for key, value in doc.items():
        if isinstance(value, bool):
            flags.append(f"--{'' if value else 'no-'}{key.replace('_', '-')}")
        else:
            flags += [f"--{key.replace('_', '-')}", str(value)]
    return flags


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("published-engine-cache")


@pytest.mark.parametrize("label", ROWS)
def test_script_cli_and_sweep_agree_on_a_published_row(label, cache, tmp_path):
    import published_moe  # noqa: F401  (the MoE script's row parsing)
    from compare_published import rebuild
    from moe_step import routed_rows

    from flint.sweep import run_sweep
    from flint.sweep_space import SearchSpace

    dense, moe, runs = _table_runs()
    run = runs[label]
    if label in dense and not dense[label].moe:
        row = dense[label]
        rebuild(row, cache)
        script = row.result["predicted_step_s"]
    else:
        script = routed_rows(run, ["balanced"], cache)[0]["step_s"]
    code, stdout, stderr = run_cli(["predict", *_flags(run), "--cache", cache, "--json"])
    assert code == 0, stderr
    cli = json.loads(stdout)["step_time_s"]
    (row,) = run_sweep(SearchSpace.from_dict(run.to_json()), tmp_path / "sweep")
    print(f"{label}: script {script:.4f} s, flint predict {cli:.4f} s, flint sweep "
          f"{row['step_time_s']:.4f} s")
    assert script == cli == row["step_time_s"] > 0
