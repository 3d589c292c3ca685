"""Record the CPU profile tests/test_live_cpu.py pins its accuracy check to.

    python scripts/record_cpu_profile.py [OUT_DIR]      # default tests/data/live_cpu

Runs the live check's step (gpt2-small shaped, 2 layers, 64 tokens per device, FSDP over
8 host CPU devices) five times under jax.profiler, as flint.validate.live does, and keeps
what `flint validate` / `flint calibrate` read: the XLA op events (module, op, run id,
device) and the process names of the trace, gzipped, beside the graph Flint extracted for
the same executable. Record on a quiet machine: the check compares the calibrated
prediction with steps timed after the ones it was fitted on, so load that changes between
them is what it would measure.
"""
from __future__ import annotations

import gzip
import json
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
KEPT_ARGS = ("hlo_module", "hlo_op", "run_id", "device_ordinal")


def trimmed(events: list[dict]) -> list[dict]:
    """The op events and process names (the rest is host-side Python and runtime
    bookkeeping no reader uses)."""
    out = []
    for e in events:
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        if e.get("ph") == "M" and e.get("name") == "process_name":
            out.append(e)
        elif e.get("ph") == "X" and "hlo_op" in args:
            out.append({**{k: e[k] for k in ("ph", "pid", "ts", "dur")},
                        "args": {k: args[k] for k in KEPT_ARGS if k in args}})
    return out


def main(out_dir: Path) -> None:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    jax.config.update("jax_num_cpu_devices", 8)
    from flint.validate.jax_profiler import find_profile_file, load_trace_events
    from flint.validate.live import profile_zoo_step

    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        graph, log_dir = profile_zoo_step("gpt2-small", 8, "fsdp=8", Path(tmp), steps=5,
                                          layers=2, seq_len=64)
        events = trimmed(load_trace_events(find_profile_file(log_dir)))
    with gzip.open(out_dir / "gpt2-small.trace.json.gz", "wt", compresslevel=9) as f:
        json.dump({"traceEvents": events}, f, separators=(",", ":"))
    with gzip.open(out_dir / "gpt2-small.graph.json.gz", "wt", compresslevel=9) as f:
        json.dump(graph.to_json(), f, separators=(",", ":"))
    print(f"wrote {out_dir} ({len(events)} events)")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "tests" / "data" / "live_cpu")
