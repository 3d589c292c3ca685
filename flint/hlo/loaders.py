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
from flint.hlo.proto_ids import MalformedProto, compact_instruction_ids, hlo_module_of


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
    return module_from_proto(data, str(path))


def module_from_proto(data: bytes, where: str = "proto") -> HloModule:
    """The module of a serialized HloModuleProto or HloProto, with what the HloProto's
    buffer assignment says about in-place updates (buffer_assignment.py)."""
    from flint.hlo.buffer_assignment import copied_updates

    inner = hlo_module_of(data)          # None: an HloModuleProto (no buffer assignment)
    module = parse_module(_module_text(inner or data, where))
    if inner is not None:
        module.copied_updates = copied_updates(data, module)
    return module


def copied_updates_beside(path, module: HloModule) -> frozenset:
    """The in-place updates the HloProto at `path` (a dump's proto of the same module as
    `module`, read from its text) says XLA did not run in place."""
    from flint.hlo.buffer_assignment import copied_updates

    path = Path(path)
    data = _decompress(path.read_bytes(), path)
    return copied_updates(data, module) if hlo_module_of(data) is not None else frozenset()


def hlo_text_from_proto(data: bytes, where: str = "proto") -> str:
    """HLO text of a serialized HloModuleProto, or of the module inside an HloProto."""
    return _module_text(hlo_module_of(data) or data, where)


def _module_text(module_proto: bytes, where: str) -> str:
    from jaxlib import _hlo

    invalid = f"{where} is neither HLO text nor a valid HloModuleProto/HloProto"
    blob = module_proto
    try:
        blob = compact_instruction_ids(module_proto)
        module = _hlo.HloModule.from_serialized_hlo_module_proto(blob)
        return module.to_string() + _wrapped_names_comment(module)
    except MalformedProto as e:
        raise FlintError(f"{invalid} (not protobuf: {e})") from None
    except MemoryError:
        raise FlintError(f"{where}: out of memory loading the HLO module "
                         f"({len(blob) / 1e6:.1f} MB proto)") from None
    except Exception as e:  # noqa: BLE001 - the private loader raises bare runtime errors
        raise FlintError(f"{invalid} (XLA: {_first_line(e)})") from None


def _first_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200]}" if text else type(e).__name__


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


def _decompress(data: bytes, path: Path) -> bytes:
    try:
        if data[:6] == b"\xfd7zXZ\x00":
            return lzma.decompress(data)
        if data[:2] == b"\x1f\x8b":
            return gzip.decompress(data)
    except (lzma.LZMAError, OSError, EOFError) as e:
        raise FlintError(f"{path} is corrupt or truncated: {e}") from None
    return data
