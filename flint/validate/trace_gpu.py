"""The GPU a trace says it ran on, against the `--hardware` spec it is compared with.

nsys-jax archives keep XLA's gpu_target_config (`device_description_str`, the driver's
name, and `device_memory_size`); Kineto traces keep `deviceProperties` (`name`,
`totalGlobalMem`). A spec of another GPU still predicts, but for that GPU: the user is told
in one line, naming both.
"""
from __future__ import annotations

import re

from flint.hardware_models.spec import HardwareSpec

# GPU product tokens as drivers and spec models write them: A100, H100, H200, GH200, B200,
# V100, L4, L40S, MI300X (not board codes like PG509, which follow the product).
_PRODUCT = re.compile(r"\b((?:MI|GH|GB|[ABHLTV])\d{1,3}[A-Z]?)(?![\w])")
# Drivers report memory a little above the marketed size (an 80 GB H100 shows 79.1 GiB =
# 85.0e9 B, a 40 GB A100 42.3e9 B); a ratio outside this band is another memory variant.
_MEMORY_BAND = (0.9, 1.15)


def gpu_of_kineto(doc: dict) -> tuple[str, float]:
    """(name, memory in bytes) of the first device in a Kineto trace's deviceProperties."""
    props = doc.get("deviceProperties")
    if not isinstance(props, list) or not props or not isinstance(props[0], dict):
        return "", 0.0
    name = props[0].get("name")
    memory = props[0].get("totalGlobalMem")
    return (name if isinstance(name, str) else "",
            float(memory) if isinstance(memory, (int, float)) else 0.0)


def product(name: str) -> str | None:
    m = _PRODUCT.search(name.upper())
    return m.group(1) if m else None


def gpu_mismatch(trace_gpu: str, trace_memory: float, spec: HardwareSpec) -> str | None:
    """One line naming both when the trace's GPU is not the spec's, else None."""
    if not trace_gpu:
        return None
    traced = f"{trace_gpu}" + (f" ({trace_memory / 2**30:.0f} GiB)" if trace_memory else "")
    wanted = f"--hardware {spec.name} is {spec.model or spec.kind}"
    reason = None
    if spec.kind != "gpu":
        reason = f"a {spec.kind}"
    else:
        ours, theirs = product(spec.model), product(trace_gpu)
        if ours and theirs and ours != theirs:
            reason = "another GPU"
        elif trace_memory and spec.hbm_capacity:
            ratio = trace_memory / spec.hbm_capacity
            if not _MEMORY_BAND[0] <= ratio <= _MEMORY_BAND[1]:
                reason = f"another memory size ({spec.hbm_capacity / 1e9:.0f} GB)"
    if reason is None:
        return None
    return (f"warning: the trace ran on {traced}, but {wanted}, {reason}: the prediction "
            f"is for the spec's hardware, not the traced one")


def warn_if_other_gpu(trace, spec: HardwareSpec) -> None:
    """One line on stderr when the trace's recorded GPU is not the spec's."""
    import sys

    line = gpu_mismatch(trace.hardware, trace.hardware_memory_bytes, spec)
    if line:
        print(f"{line} ({trace.path})", file=sys.stderr, flush=True)
