"""File I/O that never leaves half-written outputs behind."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from flint.errors import FlintError
from flint.guard import raise_if_interrupted

# Largest JSON / YAML / text input read whole (graph JSON, specs, sweep spaces, names maps):
# parsed JSON takes several times its text in memory, so this bounds memory too.
MAX_INPUT_BYTES = int(os.environ.get("FLINT_MAX_INPUT_MB", "512")) * 2**20


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
        raise_if_interrupted()
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
    text = read_text(path)
    try:
        return json.loads(text)
    except ValueError as e:
        raise FlintError(f"{path} is not valid JSON: {e}") from None
    except RecursionError:
        raise FlintError(f"{path}: JSON nested too deeply") from None


def read_text(path, limit: int | None = None) -> str:
    """A whole text input, refused past `limit` bytes (MAX_INPUT_BYTES)."""
    path = Path(path)
    if not path.is_file():
        raise FlintError(f"file not found: {path}")
    limit = MAX_INPUT_BYTES if limit is None else limit
    if path.stat().st_size > limit:
        raise FlintError(f"{path} is larger than {limit / 2**20:.0f} MiB, the input limit "
                         f"(FLINT_MAX_INPUT_MB raises it)")
    try:
        return path.read_text()
    except UnicodeDecodeError as e:
        raise FlintError(f"{path} is not text: {e}") from None
