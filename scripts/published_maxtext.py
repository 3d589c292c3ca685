"""How the MaxText rows of the published tables (sections 2a and 2d) state their runs: the
late-2023 configs' decoder and mesh, the tpu-recipes' remat columns and XLA flags. The
row-reading half of scripts/published_rows.py for MaxText; `row` is its Row."""
from __future__ import annotations

import re

from table_columns import first_number


def maxtext_2023(row, r: dict, spec_name: str) -> None:
    """MaxText's late-2023 configs (published.md 2a): the `global_parameter_scale` decoder
    of that base.yml (RMSNorm, RoPE, multi-head attention of head_dim 256, one non-gated
    ReLU MLP, vocab 32768, logits through the tied embedding), FSDP over each ICI slice
    (`ici_fsdp_parallelism=-1`, tensor parallelism as the row's `tp=`) and pure data
    parallelism over DCN between slices (`dcn_data_parallelism`), each slice the row's
    `1x v5p-128`: a most-cubic torus of chips / slices. Remat `minimal` is MaxText's
    policy of that time, jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims: the
    projections' outputs are kept, the rest recomputed; with the fused attention kernel
    (attention=flash) no batched dot is left, so the zoo's `dots` policy is the same
    (published_rows reads it with every table's recompute column).
    `spec_name`: the hardware spec of the row's system (its torus, for a slice)."""
    from flint.hardware_models.spec import load_spec
    from flint.hardware_models.topology import most_cubic_slice

    dims = {key: int(first_number(r[col])) for key, col in (
        ("layers", "layers"), ("hidden", "emb"), ("heads", "heads"), ("head_dim", "head_dim"),
        ("ffn", "mlp"))}
    row.model = tuple(sorted({**dims, "kv_heads": dims["heads"], "vocab": 32768,
                              "norm": "rms", "activation": "relu", "positional": "rope",
                              "tie_embeddings": True, "seq": row.seq}.items()))
    sharding = str(r.get("sharding", ""))
    row.tp, row.zero, row.fsdp = mesh_option(sharding, "tp"), 3, True
    # per_device_batch_size counts sequences per chip: a tensor-parallel group of tp chips
    # runs tp x that many as one batch, and MaxText takes the step without gradient
    # accumulation (its default), so each data-parallel rank has one micro-batch
    row.mbs = row.gbs * row.tp // row.gpus
    slices = mesh_option(sharding, "dcn_dp")
    if slices > 1:
        per_slice = row.gpus // slices
        row.hsdp = per_slice // row.tp      # FSDP within a slice, replicas across
        spec = load_spec(spec_name)
        row.what_if = (f"torus={most_cubic_slice(spec, per_slice)}",)


# MaxText configs whose xla_flags add DISABLE_COLLECTIVE_MATMUL (benchmarks/
# maxtext_trillium_model_configs.py at the rows' tags, as each tpu-recipes README quotes
# the config): the *_no_collective_matmul ones, and mistral_7b (tpu-recipes-v0.1.2) though
# its name does not say so. The others (llama3_1_8b_8192, llama3_1_70b_8192*,
# llama2_70b_4096_sc, gpt_3_175b_bf16) leave libtpu's own choice.
NO_COLLECTIVE_MATMUL_CONFIGS = ("mistral_7b",)


def no_collective_matmul(config: str) -> bool:
    return config.endswith("_no_collective_matmul") or config in NO_COLLECTIVE_MATMUL_CONFIGS


def maxtext_offload(stated: str) -> str:
    """The offload remat policy (flint.models.OFFLOADED_NAMES) a tpu-recipes row's remat
    column names: "custom (offload decoder_input,q,k,v,out proj)" sends the layer input
    and the four projections' outputs to host; "custom (offload decoder_input,q,k,v)" and
    MaxText's `qkv_proj_offloaded` the query, key and value projections' (the latter keeps
    the layer input on device: a memory difference of one [batch, seq, hidden] tensor per
    layer, no time difference). "" for any other policy."""
    if "qkv_proj_offloaded" in stated:
        return "offload-qkv"
    m = re.search(r"offload ([a-z_, ]+)", stated)
    if not m:
        return ""
    names = {n.strip() for n in m.group(1).split(",")}
    if names == {"decoder_input", "q", "k", "v", "out proj"}:
        return "offload-qkvo"
    return "offload-qkv" if names == {"decoder_input", "q", "k", "v"} else ""


def mesh_option(text: str, key: str) -> int:
    """`tp=4` in a sharding column like "fsdp=auto tp=4 dcn_dp=2" (1 when absent)."""
    m = re.search(rf"(?<![a-z_]){key}=(\d+)", text)
    return int(m.group(1)) if m else 1
