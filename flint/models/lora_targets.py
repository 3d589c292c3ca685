"""LoRA's targets by name (flint.models.lora): the Megatron linears a run names and the zoo
weights they are. No JAX here: a TrainingRun reads these before JAX is configured."""
from __future__ import annotations

from flint.errors import FlintError

# Megatron's linear names -> the zoo decoder's weights
TARGETS = {"qkv": ("wq", "wk", "wv"), "proj": ("wo",), "fc1": ("w_up", "w_gate"),
           "fc2": ("w_down",)}
GROUPS = {"attention": ("qkv", "proj"), "mlp": ("fc1", "fc2"), "all": tuple(TARGETS)}
DEFAULT_TARGETS = "qkv,proj,fc1,fc2"      # Megatron-Bridge's LoRA.target_modules


def parse_targets(text: str) -> tuple[str, ...]:
    """The Megatron linears a `lora_targets` string names, in canonical order."""
    names: set[str] = set()
    for word in (w.strip().lower() for w in str(text).split(",")):
        if word in TARGETS:
            names.add(word)
        elif word in GROUPS:
            names.update(GROUPS[word])
        else:
            known = ", ".join((*TARGETS, *GROUPS))
            raise FlintError(f"lora_targets: unknown linear {word!r} (use a comma list of "
                             f"{known})")
    return tuple(t for t in TARGETS if t in names)


def canonical(text: str) -> str:
    return ",".join(parse_targets(text))


def adapted_weights(targets) -> tuple[str, ...]:
    """The zoo weights the targets adapt."""
    return tuple(w for t in targets for w in TARGETS[t])
