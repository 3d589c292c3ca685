"""Zoo models. What the package itself defines needs no JAX (importers may run before JAX
is configured for compile-only devices)."""

# Activation recompute policies of the zoo decoders (flint.models.decoder applies them).
REMAT_POLICIES = ("none", "full", "dots", "selective")
# ... and one more the engine compiles for frameworks whose checkpoint function re-runs a
# layer whole (flint.models.decoder.rerun_checkpoint); a run says `full` and its framework
REMAT_RERUN = "full-rerun"
ZOO_REMAT_POLICIES = REMAT_POLICIES + (REMAT_RERUN,)

# Attention cores of the zoo decoders by request name: flash (one fused kernel), unfused
# (S x S scores through memory in fp32, as a JAX program usually writes them) and
# unfused-half (the same in the compute dtype, as Megatron's baddbmm and fused softmax keep
# them): the decoder's `attention` values
ZOO_ATTENTION = {"flash": "flash", "unfused": "xla", "unfused-half": "xla-half"}
