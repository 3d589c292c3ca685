"""File I/O that never leaves half-written outputs behind."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from flint.errors import FlintError


def write_atomic(path, data: str | bytes, mode: int = 0o666) -> None:
    """Write to a temporary file beside `path`, then rename it into place with `mode` less
    the umask (0o777 for a program)."""
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise FlintError(f"output directory {str(parent)!r} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.chmod(tmp, mode & ~current_umask())  # mkstemp makes 0600; outputs are ordinary files
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def read_json(path):
    path = Path(path)
    if not path.is_file():
        raise FlintError(f"file not found: {path}")
    try:
        return json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise FlintError(f"{path} is not valid JSON: {e}") from None


def read_text(path) -> str:
    path = Path(path)
    if not path.is_file():
        raise FlintError(f"file not found: {path}")
    try:
        return path.read_text()
    except UnicodeDecodeError as e:
        raise FlintError(f"{path} is not text: {e}") from None
