"""Chrome trace-event JSON (plain or gzipped), as written by Kineto and the JAX profiler,
and the schemas of the events Flint reads from it.

Reading is bounded: the file is decompressed as a stream and refused past MAX_TRACE_BYTES
of JSON (a 2 MB gzip bomb stops there instead of filling memory). The events a reader uses
are checked once, here, with pydantic: a JAX op event needs numeric `ts`/`dur` and a string
`hlo_op`; a GPU kernel numeric `ts`/`dur`; an NCCL kernel integer message sizes.
"""
from __future__ import annotations

import gzip
import json
import os
import zlib
from pathlib import Path
from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from flint.errors import FlintError
from flint.schema import Int, NonNegInt, NonNegNumber, Number, Str, describe

# Decompressed trace JSON Flint reads into memory (FLINT_MAX_TRACE_MB overrides it).
MAX_TRACE_BYTES = int(os.environ.get("FLINT_MAX_TRACE_MB", "256")) * 2**20
_CHUNK = 1 << 20


def read_trace_events(path, what: str = "trace") -> list[dict]:
    """The `traceEvents` list; an unreadable file is one FlintError naming `what` it is not."""
    return read_trace_document(path, what)["traceEvents"]


def read_trace_document(path, what: str = "trace") -> dict:
    """The whole document (`traceEvents` and, in Kineto traces, `deviceProperties`)."""
    path = Path(path)
    if not path.is_file():
        raise FlintError(f"file not found: {path}")
    try:
        raw = _read_capped(path)
        data = json.loads(raw)
    except FlintError:
        raise
    except (OSError, EOFError, ValueError, zlib.error, RecursionError) as e:
        raise FlintError(f"{path} is not a readable {what}: {type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else 'truncated'}") from None
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise FlintError(f"{path} has no traceEvents: not a {what}")
    for i, e in enumerate(events):
        if not isinstance(e, dict):
            raise FlintError(f"{path}: trace event {i} is not an object: {str(e)[:40]!r}")
    return data if isinstance(data, dict) else {"traceEvents": events}


def _read_capped(path: Path) -> bytearray:
    with open(path, "rb") as f:
        compressed = f.read(2) == b"\x1f\x8b"
    out = bytearray()
    with (gzip.open(path, "rb") if compressed else open(path, "rb")) as f:
        while chunk := f.read(_CHUNK):
            out += chunk
            if len(out) > MAX_TRACE_BYTES:
                raise FlintError(f"{path} holds more than {MAX_TRACE_BYTES / 2**20:.0f} MiB of "
                                 f"trace JSON{' once decompressed' if compressed else ''} (the "
                                 f"limit; FLINT_MAX_TRACE_MB raises it)")
    return out


# --- the events readers use ----------------------------------------------------------
class _Event(BaseModel):
    model_config = ConfigDict(extra="ignore")


class JaxOpArgs(_Event):
    hlo_op: Str
    hlo_module: Str = ""
    run_id: Optional[Union[Int, Str]] = None
    group_id: Optional[Union[Int, Str]] = None
    device_ordinal: Optional[Union[Int, Str]] = None


class JaxOpEvent(_Event):
    """An XLA op execution in a JAX profile."""

    ph: Literal["X"]
    ts: Number
    dur: NonNegNumber
    pid: Optional[Union[Int, Str]] = None
    args: JaxOpArgs


class KernelEvent(_Event):
    """A GPU activity (kernel, memcpy, memset) or a step span in a Kineto trace."""

    name: Str = ""
    ts: Number
    dur: NonNegNumber
    args: Optional[dict] = None


class NcclArgs(_Event):
    collective: Str
    in_nelems: NonNegInt
    out_nelems: NonNegInt
    group_size: Optional[NonNegInt] = 1

    @classmethod
    def of(cls, args: dict) -> dict:
        return {"collective": args.get("Collective name"), "in_nelems": args.get("In msg nelems"),
                "out_nelems": args.get("Out msg nelems"), "group_size": args.get("Group size", 1)}


_NCCL_KEYS = {"collective": "Collective name", "in_nelems": "In msg nelems",
              "out_nelems": "Out msg nelems", "group_size": "Group size"}


def checked(model, events: list[dict], path, what: str) -> list[dict]:
    """`events` unchanged when each is a valid `model`; else one FlintError line naming the
    event's position among those checked and the field."""
    try:
        TypeAdapter(list[model]).validate_python(events)
    except ValidationError as e:
        text = describe(e, model)
        for ours, theirs in _NCCL_KEYS.items():
            text = text.replace(f"].{ours}", f"].args[{theirs!r}]")
        raise FlintError(f"{path}: {what} {text}") from None
    return events


def checked_nccl_args(events: list[dict], path) -> None:
    checked(NcclArgs, [NcclArgs.of(e.get("args") or {}) for e in events], path, "NCCL kernel")
