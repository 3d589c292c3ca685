"""MaxText's host-offload remat policies (flint.models.OFFLOADED_NAMES) and the TPU v6e
target the tpu-recipes rows that use them run on."""
from __future__ import annotations

import jax
import pytest

from flint.errors import FlintError
from flint.models import OFFLOADED_NAMES, REMAT_POLICIES
from flint.run import TrainingRun


def _step_flops(remat: str) -> float:
    """Executed FLOPs of the tiny zoo decoder's step on one host device under `remat`."""
    import numpy as np
    from jax.sharding import NamedSharding

    from flint.models.train import build

    w = build("tiny", (("data", 1),), 2, 64, True, remat)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
    shard = lambda specs: jax.tree_util.tree_map(  # noqa: E731
        lambda s: NamedSharding(mesh, s), specs)
    with jax.set_mesh(mesh):
        step = jax.jit(w.step, in_shardings=shard(w.in_specs),
                       out_shardings=shard(w.out_specs))
        return step.lower(*w.args).compile().cost_analysis()["flops"]


def test_offload_policies_recompute_only_what_they_do_not_send_to_host():
    """offload-qkvo keeps the four attention projections' outputs (on host), so its
    backward re-runs the attention core and the MLP only; offload-qkv re-runs the output
    projection too; full re-runs every projection: FLOPs strictly in that order, all above
    no recompute."""
    none, qkvo, qkv, full = (_step_flops(r) for r in
                             ("none", "offload-qkvo", "offload-qkv", "full"))
    assert none < qkvo < qkv < full


def test_offload_policies_name_what_maxtext_offloads_and_belong_to_xla_runs():
    assert set(OFFLOADED_NAMES) <= set(REMAT_POLICIES)
    assert OFFLOADED_NAMES["offload-qkvo"] == ("decoder_layer_input", "query_proj",
                                               "key_proj", "value_proj", "out_proj")
    for framework in ("megatron", "torch-eager"):
        with pytest.raises(FlintError, match="offload-qkv is MaxText's host offload"):
            TrainingRun(model="llama3-8b", seq_len=2048, devices=8, framework=framework,
                        remat="offload-qkv")


def test_tpu_recipes_remat_columns_map_to_the_offload_policies():
    import sys

    from conftest import REPO

    sys.path.insert(0, str(REPO / "scripts"))
    from published_maxtext import maxtext_offload

    assert maxtext_offload("custom (offload decoder_input,q,k,v,out proj)") == \
        "offload-qkvo"
    assert maxtext_offload("custom (offload decoder_input,q,k,v)") == "offload-qkv"
    assert maxtext_offload("qkv_proj_offloaded") == "offload-qkv"
    # a policy that offloads other tensors is not one of these: the row keeps its own
    assert maxtext_offload("custom (offload context, mlpwo)") == ""
    assert maxtext_offload("full") == ""


def test_v6e_spec_is_a_compile_target_with_its_256_wide_matrix_units():
    from flint.frontends.targets import TPU_TARGETS
    from flint.hardware_models.spec import load_spec

    spec = load_spec("tpu-v6e")
    assert (spec.compile_target, spec.matrix_unit, spec.cores) == ("tpu-v6e", 256, 1)
    # 4 x 200 Gb/s NICs per 8-chip host: 100 Gb/s of data-center network per chip
    assert spec.nic_bandwidth == pytest.approx(100e9 / 8)
    assert TPU_TARGETS["tpu-v6e"] == ("v6e", 2, 1, 256)
