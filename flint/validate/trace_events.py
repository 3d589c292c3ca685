"""Chrome trace-event JSON (plain or gzipped), as written by Kineto and the JAX profiler."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

from flint.errors import FlintError


def read_trace_events(path, what: str = "trace") -> list[dict]:
    """The `traceEvents` list; an unreadable file is one FlintError naming `what` it is not."""
    return read_trace_document(path, what)["traceEvents"]


def read_trace_document(path, what: str = "trace") -> dict:
    """The whole document (`traceEvents` and, in Kineto traces, `deviceProperties`)."""
    path = Path(path)
    if not path.is_file():
        raise FlintError(f"file not found: {path}")
    try:
        raw = path.read_bytes()
        data = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    except (OSError, EOFError, ValueError) as e:
        raise FlintError(f"{path} is not a readable {what}: {type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else 'truncated'}") from None
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise FlintError(f"{path} has no traceEvents: not a {what}")
    return data if isinstance(data, dict) else {"traceEvents": events}
