"""Zoo models. What the package itself defines needs no JAX (importers may run before JAX
is configured for compile-only devices)."""

# Activation recompute policies of the zoo decoders (flint.models.decoder applies them).
# The offload-* policies are MaxText's host-offload remat (tpu-recipes' `remat_policy:
# custom` with tensors set to `offload`): the named tensors go to host memory in the
# forward and come back for the backward, everything else is recomputed.
REMAT_POLICIES = ("none", "full", "dots", "selective", "offload-qkvo", "offload-qkv")
# GEMM operands the torch twin runs: bf16 under autocast, or FP8 as torchao's Float8Linear
# runs them (tensorwise dynamic scaling: flint.models.torch_float8)
TORCH_GEMM_PRECISIONS = ("bf16", "fp8")
# the checkpoint names (MaxText's) each offload policy sends to host memory
OFFLOADED_NAMES = {
    "offload-qkvo": ("decoder_layer_input", "query_proj", "key_proj", "value_proj",
                     "out_proj"),
    "offload-qkv": ("decoder_layer_input", "query_proj", "key_proj", "value_proj")}
# ... and one more the engine compiles for frameworks whose checkpoint function re-runs a
# layer whole (flint.models.recompute); a run says `full` and its framework
REMAT_RERUN = "full-rerun"
ZOO_REMAT_POLICIES = REMAT_POLICIES + (REMAT_RERUN,)


def compiled_remat(remat: str, framework: str) -> str:
    """The policy a run's stage is compiled under: `full` re-runs each layer whole where
    the framework's checkpoint function does (`megatron`'s library kernels stand for
    Megatron-LM/Core, DeepSpeed and InternEvo, whose reentrant checkpoint functions all
    do); XLA recomputes only what the backward reads, and the torch twin runs PyTorch's
    non-reentrant checkpoint, which stops once the backward has what it reads."""
    return REMAT_RERUN if remat == "full" and framework == "megatron" else remat


def compiled_attention(attention: str, framework: str) -> str | None:
    """The zoo attention core a run's stage is compiled with (None: the flash program;
    flash1 is that program with an older kernel): unfused under `megatron` keeps its
    S x S scores in the compute dtype, as its baddbmm and fused softmax do."""
    if attention != "unfused":
        return None
    return "unfused-half" if framework == "megatron" else "unfused"


# Attention cores of the zoo decoders by request name: flash (one fused kernel), unfused
# (S x S scores through memory in fp32, as a JAX program usually writes them) and
# unfused-half (the same in the compute dtype, as Megatron's baddbmm and fused softmax keep
# them): the decoder's `attention` values
ZOO_ATTENTION = {"flash": "flash", "unfused": "xla", "unfused-half": "xla-half"}
