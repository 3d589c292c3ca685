"""XLA's collective matmul on a TPU as a choice of the run (TrainingRun.collective_matmul):
a compile option of the stage program, only where libtpu reads it, and what the
tpu-recipes configs that turn it off say."""
from __future__ import annotations

import sys

import pytest

from conftest import REPO
from flint.errors import FlintError
from flint.frontends.targets import COLLECTIVE_MATMUL_OFF_MIB, WINDOWED_EINSUM_THRESHOLD
from flint.run import TrainingRun

V6E = dict(model="llama3-8b", seq_len=8192, devices=8, hardware="tpu-v6e", framework="xla",
           zero=3, micro_batch=3, global_batch=24)


def test_the_choice_is_a_compile_option_keyed_with_the_program():
    from flint.stage import stage_program
    from flint.template_cache import program_key

    auto, off = (stage_program(TrainingRun(**V6E, collective_matmul=c))
                 for c in ("auto", "off"))
    assert "compiler_options" not in auto         # the programs cached before keep their key
    assert off["compiler_options"] == {WINDOWED_EINSUM_THRESHOLD: COLLECTIVE_MATMUL_OFF_MIB}
    assert program_key(auto) != program_key(off)
    with pytest.raises(FlintError, match="collective_matmul"):
        TrainingRun(**V6E, collective_matmul="on")


def test_only_xla_on_a_tpu_takes_it():
    for changes in (dict(hardware="h100-sxm"), dict(hardware="h100-sxm", framework="megatron")):
        with pytest.raises(FlintError, match="collective_matmul: off sets libtpu's"):
            TrainingRun(**dict(V6E, **changes), collective_matmul="off")


def test_compile_options_are_refused_where_nothing_compiles_them():
    from flint.frontends.request import ExtractRequest

    req = ExtractRequest(framework="torch", model="tiny", devices=2,
                         compiler_options=((WINDOWED_EINSUM_THRESHOLD, 0),))
    with pytest.raises(FlintError, match="XLA compile options apply to a JAX step"):
        req.check()


def test_tpu_recipes_no_collective_matmul_configs_turn_it_off():
    sys.path.insert(0, str(REPO / "scripts"))
    from published_rows import TABLE, rows_of
    from table_columns import tables

    if not TABLE.is_file():
        pytest.skip("shared published table not present")
    rows = {r.label.split(" ")[0]: r for h, recs in tables(TABLE) if h.startswith("2d")
            for r in rows_of(h, recs)}
    # llama3_1_8b_8192_no_collective_matmul (v6e-8/16/32),
    # llama3_1_70b_8192_bs2_bfloat16_no_collective_matmul (v6e-32) and mistral_7b (v6e-8)
    assert {k for k, r in rows.items() if r.collective_matmul == "off"} == \
        {"2d#1", "2d#2", "2d#3", "2d#7", "2d#14"}
    assert rows["2d#5"].collective_matmul == "auto"


def test_flint_predict_no_collective_matmul_flag():
    """README: `flint predict --collective-matmul off`; a GPU run refuses it in one line."""
    from conftest import run_cli

    code, stdout, stderr = run_cli(["predict", "--model", "tiny", "--seq-len", "64",
                                    "--devices", "2", "--framework", "xla",
                                    "--collective-matmul", "off"])
    assert code == 2 and not stdout and len(stderr.strip().splitlines()) == 1
    assert "collective_matmul: off sets libtpu's windowed-einsum threshold" in stderr


def test_a_zoo_step_is_captured_with_the_requests_compile_options():
    from flint.frontends.request import ExtractRequest
    from flint.frontends.steps import captured_step

    options = ((WINDOWED_EINSUM_THRESHOLD, COLLECTIVE_MATMUL_OFF_MIB),)
    req = ExtractRequest(model="tiny", devices=2, seq_len=64, compiler_options=options)
    req.check()
    step, *_ = captured_step(req)
    assert step.cfg.compiler_options == options


# An FSDP MLP's gradient on 8 v6e chips large enough that libtpu 0.0.42 makes its
# gathered dots windowed einsums (collective-permute loops) as it ships
_TPU_CHECK = """
import json
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from flint.frontends.targets import collective_matmul_options, devices_for, resolve_target
mesh = Mesh(np.array(devices_for(resolve_target("tpu-v6e"), 8, 8)), ("fsdp",))
rows = NamedSharding(mesh, P("fsdp", None))
loss = lambda w1, w2, x: jnp.sum(jnp.tanh(x @ w1) @ w2)
args = [jax.ShapeDtypeStruct(s, jnp.bfloat16, sharding=rows)
        for s in ((4096, 14336), (14336, 4096), (24576, 4096))]
low = jax.jit(jax.grad(loss, argnums=(0, 1)), out_shardings=(rows, rows)).lower(*args)
print(json.dumps({mode: low.compile(collective_matmul_options(mode) or None).as_text()
                  .count("collective-permute-start") for mode in ("auto", "off")}))
"""


def test_libtpu_takes_the_option_and_drops_the_windowed_einsums():
    """The option's name is libtpu's: off drops the collective-permute loops that auto
    makes of this program (45 here; 3 permutes of another kind stay); a renamed flag would
    fail the compile or change nothing."""
    import json

    from conftest import run_libtpu_process

    pytest.importorskip("libtpu")
    r = run_libtpu_process(["-c", _TPU_CHECK], timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    counts = json.loads(r.stdout.strip().splitlines()[-1])
    assert counts["auto"] >= 10 * max(counts["off"], 1), counts
