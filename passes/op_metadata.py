"""Read JAX op_name metadata: scope path, layer and training phase of an HLO op.

`jit(step)/transpose(jvp(Transformer))/decoder/layers_3/mlp/dot_general[...]` says the op
belongs to the backward pass (`transpose(...)` is JAX's reverse-mode), in scope
`Transformer/decoder/layers_3/mlp`.
"""
from __future__ import annotations

import re
from functools import lru_cache

_WRAPPED = re.compile(r"^([\w\-]+)\((.*)\)$")
_PARAMS = re.compile(r"\[.*\]$")
_MERGED = re.compile(r"^(|.*?/)\((.*)\)$")
# Scope components that JAX's control flow and remat insert: not part of the user's model path.
_PLUMBING = frozenset({"while", "body", "cond", "closed_call", "checkpoint", "remat",
                       "rematted_computation", "core_call", "custom_jvp_call", "custom_vjp_call",
                       "pjit", "scan", "shard_map", "main", ""})
_LAYER = re.compile(r"(layer|block|blocks|layers|h)(_?\d+)?$", re.IGNORECASE)
OPTIMIZER_SCOPES = frozenset({"optimizer", "adamw", "adam", "opt_update", "apply_updates", "sgd"})


@lru_cache(maxsize=65536)
def parse_op_name(op_name: str) -> tuple[str, str, str]:
    """Return (scope, layer, phase) for a JAX op_name; phase is forward|backward|optimizer."""
    # XLA joins the names of ops it merged: `a/reshape;b/reshape` or `(a/sub:b/mul)`
    op_name = op_name.split(";", 1)[0]
    merged = _MERGED.match(op_name)
    if merged:
        op_name = merged.group(1) + merged.group(2).split(":", 1)[0]
    if not op_name or "/" not in op_name:  # compiler-made ops carry only their own name
        return "", "", "unknown"
    phase = "backward" if "transpose(" in op_name else "forward"
    parts: list[str] = []
    components = op_name.split("/")
    for comp in components[:-1]:
        comp = _PARAMS.sub("", comp)
        while True:
            m = _WRAPPED.match(comp)
            if not m:
                break
            fn, inner = m.groups()
            comp = "" if fn in ("jit", "pjit") else inner
        # einsum specs (`BTNH,BSNH->BNTS`) name an operation, not a part of the model
        if comp not in _PLUMBING and "->" not in comp:
            parts.append(comp)
    if any(p.lower() in OPTIMIZER_SCOPES for p in parts):
        phase = "optimizer"
    scope = "/".join(parts)
    layer = ""
    for i, p in enumerate(parts):
        if _LAYER.match(p):
            layer = "/".join(parts[: i + 1])
            break
    if not layer and parts:
        layer = parts[0]
    return scope, layer, phase
