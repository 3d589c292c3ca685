"""XLA's memory figure for a dumped module, from the buffer assignment it wrote beside it.

XLA dumps `<module>.<target>_after_optimizations-buffer-assignment.txt` with the HLO (with
`--xla_dump_hlo_as_text`). Each `allocation N: size S, ...` line is one device buffer the
executable allocates: entry parameters (`parameter P`), outputs (`maybe-live-out`),
constants, and the temporaries (one `preallocated-temp` block, or several on older XLA).
Their sum is what the run holds on the device while the step runs: on an H200 a jax 0.11
scanned Llama step's dump said 46.04 GiB and the device's peak_bytes_in_use read 46.07
GiB (scripts/capture_gpu.py). The same figures a direct compile's memory_analysis() gives,
in the shape `graph.meta["xla_memory"]` holds them.
"""
from __future__ import annotations

import re
from pathlib import Path

_ALLOCATION = re.compile(r"^allocation \d+: size (\d+)(.*)$")


def xla_memory_from_text(text: str) -> dict | None:
    """{argument_bytes, output_bytes, alias_bytes, temp_bytes} of a buffer-assignment dump
    (None when it lists no allocation). A parameter that is also live-out (a donated
    argument) counts once, as an argument; thread-local allocations hold no device memory."""
    args = outputs = temps = 0
    seen = False
    for line in text.splitlines():
        m = _ALLOCATION.match(line)
        if not m:
            continue
        seen = True
        size, flags = int(m.group(1)), m.group(2).split(" shape ", 1)[0]
        if "thread-local" in flags:
            continue
        if re.search(r"\bparameter \d+", flags):
            args += size
        elif "maybe-live-out" in flags:
            outputs += size
        else:
            temps += size
    if not seen:
        return None
    return {"argument_bytes": args, "output_bytes": outputs, "alias_bytes": 0,
            "temp_bytes": temps}


def xla_memory_beside(module_file: Path) -> dict | None:
    """The figures of the buffer-assignment file XLA wrote beside an optimized module."""
    stem = re.sub(r"\.(txt|hlo\.pb)$", "", module_file.name)
    path = module_file.with_name(f"{stem}-buffer-assignment.txt")
    if not path.is_file():
        return None
    return xla_memory_from_text(path.read_text(errors="replace"))
