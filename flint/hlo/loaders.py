"""Load HLO from files: text, HloModuleProto or HloProto (optionally .xz / .gz compressed).

jaxlib has no public HLO API; `jaxlib._hlo.HloModule.from_serialized_hlo_module_proto` is
private, so it is used here and nowhere else.
"""
from __future__ import annotations

import gzip
import lzma
from pathlib import Path

from flint.errors import FlintError
from flint.hlo.module import HloModule, parse_module


def load_hlo(path) -> HloModule:
    """Read an HLO module from a text or binary-proto file."""
    path = Path(path)
    if not path.is_file():
        raise FlintError(f"file not found: {path}")
    data = _decompress(path.read_bytes(), path)
    if data.lstrip().startswith(b"HloModule"):
        try:
            return parse_module(data.decode())
        except UnicodeDecodeError:
            raise FlintError(f"{path} is not UTF-8 HLO text") from None
    return parse_module(hlo_text_from_proto(data, str(path)))


def hlo_text_from_proto(data: bytes, where: str = "proto") -> str:
    """HLO text of a serialized HloModuleProto, or of the module inside an HloProto."""
    from jaxlib import _hlo

    candidates = [data]
    inner = _hlo_proto_module_field(data)
    if inner is not None:
        candidates.insert(0, inner)
    for blob in candidates:
        try:
            module = _hlo.HloModule.from_serialized_hlo_module_proto(blob)
        except Exception:  # noqa: BLE001 - the private loader raises bare runtime errors
            continue
        return module.to_string() + _wrapped_names_comment(module)
    raise FlintError(f"{where} is neither HLO text nor a valid HloModuleProto/HloProto")


WRAPPED_NAMES_MARK = "// flint-async-wrapped:"


def _wrapped_names_comment(module) -> str:
    """Async starts print under their own name, but profilers name the op they wrap
    (`reduce-scatter.61` for `reduce-scatter-start.3`); keep that name as a trailer."""
    pairs = []
    for comp in module.computations():
        for ins in comp.instructions():
            try:
                root = ins.async_wrapped_root()
            except Exception:  # noqa: BLE001 - only async instructions have one
                continue
            if root is not None and root.name != ins.name:
                pairs.append(f"{ins.name}={root.name}")
    return f"\n{WRAPPED_NAMES_MARK} {' '.join(sorted(pairs))}\n" if pairs else ""


def _hlo_proto_module_field(data: bytes) -> bytes | None:
    """Field 1 (hlo_module) of an HloProto, read from the protobuf wire format."""
    try:
        i = 0
        while i < len(data):
            tag, i = _varint(data, i)
            field, wire = tag >> 3, tag & 7
            if wire == 2:
                n, i = _varint(data, i)
                if field == 1:
                    return data[i:i + n] if i + n <= len(data) else None
                i += n
            elif wire == 0:
                _, i = _varint(data, i)
            elif wire == 1:
                i += 8
            elif wire == 5:
                i += 4
            else:
                return None
    except IndexError:
        return None
    return None


def _varint(b: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = b[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, i


def _decompress(data: bytes, path: Path) -> bytes:
    try:
        if data[:6] == b"\xfd7zXZ\x00":
            return lzma.decompress(data)
        if data[:2] == b"\x1f\x8b":
            return gzip.decompress(data)
    except (lzma.LZMAError, OSError, EOFError) as e:
        raise FlintError(f"{path} is corrupt or truncated: {e}") from None
    return data
