"""Zoo models. What the package itself defines needs no JAX (importers may run before JAX
is configured for compile-only devices)."""

# Activation recompute policies of the zoo decoders (flint.models.decoder applies them).
REMAT_POLICIES = ("none", "full", "dots", "selective")
