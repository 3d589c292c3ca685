"""Which ExtractRequest options a step can honour, checked before anything compiles.

The zoo options (model dims, layers, sequence length, batch, remat, GEMM precision,
sequence parallelism, scan) shape a model Flint builds. A user's own step
(SCRIPT.py:FUNCTION, StableHLO, an XLA dump) is what its code says, so an option given
for it would be silently ignored: each is refused by name instead. The torch twin of a
zoo model honours all of them except those it has no equivalent for (FP8 GEMMs, lax.scan,
the `dots` recompute policy).

A Hugging Face config.json states the longest sequence the model accepts
(`max_position_embeddings`: 131072 for Llama-3.2-1B), not the one it trains at, so a
config.json without a sequence length is refused with the flag that sets it.
"""
from __future__ import annotations

from flint.errors import FlintError
from flint.models import OFFLOADED_NAMES, TORCH_GEMM_PRECISIONS, ZOO_ATTENTION


def given_zoo_options(request) -> list[str]:
    """The zoo options the request sets (as `flint extract` spells them)."""
    flags = [("--layers", request.layers is not None),
             ("--seq-len", request.seq_len is not None),
             ("--batch-per-replica", request.batch_per_replica != 1),
             ("--remat", request.remat is not None),
             ("--gemm-precision", request.gemm_precision is not None),
             ("--attention", request.attention is not None
              and not names_sdpa_kernel(request)),
             ("--attention-dropout", bool(request.attention_dropout)),
             ("--sequence-parallel", bool(request.sequence_parallel)),
             ("--lora-rank", bool(request.lora)),
             ("--scan/--unroll", request.scan is not None)]
    dims = [f"--{_DIM_FLAGS.get(k, k)}" for k in sorted(request.dims or {})]
    return [name for name, given in flags if given] + dims


def names_sdpa_kernel(request) -> bool:
    """`--attention flash2 | cudnn` on a torch step names the kernel SDPA runs (the
    program is the same): any torch step, the twin or the user's own, honours it."""
    from flint.hardware_models.attention_kernels import SDPA_KERNELS

    return request.framework == "torch" and request.attention in SDPA_KERNELS


# dims keys -> their `flint extract` flag
_DIM_FLAGS = {"layers": "n-layers", "kv_heads": "kv-heads", "seq": "seq-len"}


def check_options(request) -> None:
    """One line naming an option the step cannot honour, or a sequence length only a
    config's maximum gives."""
    if request.target is not None:
        given = given_zoo_options(request)
        if given:
            what = ("an XLA dump" if request.is_hlo_dump else
                    "a StableHLO program" if request.is_stablehlo else
                    f"a {request.framework} step of your own")
            raise FlintError(f"{', '.join(given)} shape{'s' if len(given) == 1 else ''} "
                             f"the built-in --model; {request.target} is {what}, which runs "
                             f"as its code says (drop the option, or set it in the code)")
        return
    if (request.attention is not None and request.attention not in ZOO_ATTENTION
            and not names_sdpa_kernel(request)):
        kernels = " | flash2 | cudnn (the kernel SDPA runs)" if request.framework == "torch" \
            else ""
        raise FlintError(f"--attention {request.attention!r}: use "
                         f"{' | '.join(ZOO_ATTENTION)}{kernels}")
    if not 0 <= request.attention_dropout < 1:
        raise FlintError(f"--attention-dropout {request.attention_dropout}: a probability, "
                         f"at least 0 and below 1")
    if request.attention_dropout and (request.framework, request.attention) != ("torch",
                                                                                "unfused"):
        raise FlintError("--attention-dropout: dropout on the attention probabilities is "
                         "priced for the torch twin's unfused attention (--framework torch "
                         "--attention unfused); fused kernels are priced without their "
                         "in-kernel dropout")
    if request.framework == "torch":
        if request.attention == "unfused-half":
            raise FlintError("--attention unfused-half: the torch twin's unfused attention "
                             "keeps its scores in the compute dtype already (--attention "
                             "unfused)")
        precision = request.gemm_precision
        if precision is not None and precision not in TORCH_GEMM_PRECISIONS:
            raise FlintError(f"--gemm-precision {precision}: the torch twin runs "
                             f"{' | '.join(TORCH_GEMM_PRECISIONS)} GEMMs (fp8: torchao's "
                             f"tensorwise dynamic scaling); other FP8 recipes are in the JAX "
                             f"zoo (--framework jax)")
        if request.lora:
            raise FlintError("--lora-rank: LoRA adapters are in the JAX twin (--framework "
                             "jax); the torch twin trains every weight")
        if request.scan:
            raise FlintError("--scan: the torch twin's layers are Python modules, traced "
                             "unrolled (torch has no lax.scan); drop --scan")
        if request.remat == "dots" or request.remat in OFFLOADED_NAMES:
            raise FlintError(f"--remat {request.remat}: the torch twin runs none | full | "
                             "selective (selective: torchtitan's op-level selective "
                             "activation checkpointing); the others are the JAX twin's "
                             "policies (--framework jax)")
    check_sequence_length(request.model, request.seq_len, request.dims)


def check_sequence_length(model, seq_len, dims=None) -> None:
    """A Hugging Face config.json trains at no stated sequence length: require one."""
    from flint.frontends.program_checks import config_max_sequence

    longest = config_max_sequence(model, seq_len, dims)
    if longest is not None:
        raise FlintError(f"{model}: a Hugging Face config gives only the longest sequence "
                         f"the model accepts (max_position_embeddings {longest}), not the "
                         f"one it trains at; pass --seq-len (e.g. --seq-len 4096)")
