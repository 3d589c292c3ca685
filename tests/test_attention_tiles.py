"""The twin's attention core over query tiles (flint.models.attention.tiled_scores): the
same values and gradients as the whole core, and one collapsed attention call per layer
with the same cost, so a program retried so (its scores too big for the target's memory)
is priced as the untiled one."""
from __future__ import annotations

import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flint.models.attention import _core, query_tiles, tiled_scores


def _loss(q, k, v):
    return jnp.sum(_core(q, k, v, causal=True).astype(jnp.float32) ** 2)


def test_query_tiles_halve_until_the_scores_fit_and_stop_at_a_full_tile():
    assert query_tiles(1, 4, 512, 512) == 1                 # no budget: the whole core
    with tiled_scores(4 * 4 * 128 * 512):                   # one 128-row tile's scores
        assert query_tiles(1, 4, 512, 512) == 4
    with tiled_scores(1):                                    # never below 128 rows
        assert query_tiles(1, 4, 512, 512) == 4
        assert query_tiles(1, 4, 384, 384) == 2              # 192 rows, not 96


def test_tiled_core_matches_the_whole_core_in_value_and_gradient():
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal((2, 512, 4, 32)), jnp.float32)
               for _ in range(3))
    k, v = k[:, :, :2], v[:, :, :2]                          # grouped keys/values
    whole = jax.value_and_grad(_loss, argnums=(0, 1, 2))(q, k, v)
    with tiled_scores(4 * 2 * 4 * 128 * 512):
        assert query_tiles(2, 4, 512, 512) == 4
        tiled = jax.value_and_grad(_loss, argnums=(0, 1, 2))(q, k, v)
    assert float(tiled[0]) == pytest.approx(float(whole[0]), rel=1e-5)
    for a, b in zip(tiled[1], whole[1]):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)


def test_a_program_refused_for_memory_compiles_again_with_tiled_scores(monkeypatch):
    """XLA's memory check on a compile target sees the twin's fp32 scores: the extraction
    traces the step again with the core over query tiles, says so, and the tiles collapse
    into the same attention calls with the same cost."""
    from flint.errors import FlintError
    from flint.frontends import jax as flint_jax
    from flint.frontends import request as flint_request
    from flint.frontends.request import ExtractRequest, extract

    req = ExtractRequest(devices=2, mesh="fsdp=2", hardware="cpu", model="llama3-8b",
                         layers=2, seq_len=1024, remat="full", scan=False,
                         dims={"hidden": 256, "heads": 4, "kv_heads": 2, "ffn": 512,
                               "vocab": 1024})
    plain, _ = extract(req)
    real, refused = flint_jax.FlintLowered.compile, []

    def refuse_once(self):
        if not refused:
            refused.append(self.name)
            raise FlintError("XLA could not compile train_step for 2 cpu devices: "
                             "RESOURCE_EXHAUSTED: Ran out of memory")
        return real(self)

    monkeypatch.setattr(flint_jax.FlintLowered, "compile", refuse_once)
    monkeypatch.setattr(flint_request, "SCORE_SHARE", 2 ** 40)    # a budget that tiles
    from flint.models import attention as core

    counted, tiles = [], core.query_tiles
    monkeypatch.setattr(core, "query_tiles", lambda *a: counted.append(tiles(*a)) or
                        counted[-1])
    tiled, _ = extract(req)
    assert refused == ["train_step"]
    assert max(counted) == 1024 // core.MIN_QUERY_TILE      # 8 tiles of 128 queries
    assert any("query tiles" in note for note in tiled.meta["compiler_notes"])

    # every call still collapses to one attention node per call where XLA keeps the ops'
    # metadata; the host CPU backend's XNNPACK GEMM fusions carry none, so here the
    # forward calls are compared (the TPU test below checks every call)
    def forward_calls(g):
        return sorted(n.flops for n in g.nodes if str(n.op_class) == "attention"
                      and not n.meta.get("attention", {}).get("backward"))

    assert set(forward_calls(tiled)) == set(forward_calls(plain))
    assert len(forward_calls(tiled)) >= 2                   # a call per layer at least


TPU_TILED_PROGRAM = """
import json
from flint.frontends.request import ExtractRequest, extract
from flint.models.attention import query_tiles, tiled_scores
req = ExtractRequest(devices=8, mesh="fsdp=8", hardware="tpu-v6e", model="llama3-8b",
                     layers=1, seq_len=8192, batch_per_replica=3, remat="offload-qkvo",
                     scan=False)
with tiled_scores(500 * 2 ** 20):
    tiles = query_tiles(3, 32, 8192, 8192)
    g, _ = extract(req)
print(json.dumps({"tiles": tiles, "calls": g.meta.get("attention_calls"),
                  "uncollapsed": g.meta.get("attention_uncollapsed", 0),
                  "flops": sorted(n.flops for n in g.nodes
                                  if str(n.op_class) == "attention")}))
"""


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                    reason="compile-only TPU targets need libtpu (the `tpu` extra)")
def test_tiled_scores_collapse_to_one_call_each_on_a_tpu_target():
    """Llama 3.1 8B's layer at seq 8192, 3 sequences per v6e chip, MaxText's offload remat:
    the tiled core's forward, its recompute and its backward collapse into one attention
    node each, priced as the untiled call (its scope's shapes). In its own process: libtpu
    takes a lock per process, and other tests compile for TPUs in theirs."""
    import json

    from conftest import run_libtpu_process
    from flint.passes.attention import attention_cost

    done = run_libtpu_process(["-c", TPU_TILED_PROGRAM], timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert (out["tiles"], out["calls"], out["uncollapsed"]) == (64, 3, 0)
    fwd = attention_cost(3, 32, 8, 8192, 8192, 128, True, False)[0]
    assert out["flops"] == pytest.approx([fwd, fwd, 2.5 * fwd])
