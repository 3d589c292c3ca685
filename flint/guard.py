"""The error policy every command runs under: one line, exit 2, nothing left behind.

`run_command(fn)` runs a command's body and turns whatever escapes it into one plain line on
stderr (no rich markup, no traceback) and an exit code: a FlintError or an OSError on a path
exits 2, an interrupt (Ctrl-C, SIGTERM) exits 130, an unexpected exception exits 2 naming its
type. SIGTERM is turned into the same interrupt as Ctrl-C, so the `finally` blocks and
temporary-file cleanups of every writer run (flint.io.write_atomic, the Chakra exporter's
`.partial` directory) before the process ends.

`check_output_file` / `check_output_dir` look at an output path before long work starts:
a file must not be a directory, its directory must exist and take a new file (probed by
creating one, which also catches read-only file systems and root-squash mounts).
"""
from __future__ import annotations

import os
import signal
import sys
import tempfile
import threading

from flint.errors import FlintError

INTERRUPTED_EXIT = 130


def one_line(text: str) -> str:
    """A message as one line: newlines (from a file name, say) are shown escaped."""
    return " ".join(str(text).replace("\r", "\\r").split("\n")).strip()


def error_line(message: str) -> None:
    sys.stderr.write(f"flint: error: {one_line(message)}\n")
    sys.stderr.flush()


def os_error_message(e: OSError) -> str:
    what = e.strerror or type(e).__name__
    if e.filename is not None:
        return f"{e.filename}: {what}"
    return what


def _dup_stderr():
    try:
        return os.dup(2)
    except OSError:
        return None


_ORIGINAL_STDERR = _dup_stderr()


_interrupt_seen = False
_interrupt_reported = False


def interrupt_reported() -> bool:
    return _interrupt_reported


def _raise_interrupt(signum, frame):
    global _interrupt_seen
    _interrupt_seen = True
    raise KeyboardInterrupt


def raise_if_interrupted() -> None:
    """An interrupt some library swallowed (a bare `except:` during an import, say) is
    raised again here: writers call this before an output is renamed into place."""
    if _interrupt_seen:
        raise KeyboardInterrupt


def install_signal_handlers() -> dict:
    """SIGTERM (and SIGINT, whoever changed it) -> KeyboardInterrupt in the main thread;
    returns the handlers it replaced."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {s: signal.signal(s, _raise_interrupt) for s in (signal.SIGINT, signal.SIGTERM)}


class HeldSignals:
    """Inside `with HeldSignals() as held:` SIGINT and SIGTERM are recorded, not acted on;
    `held.check()` (and leaving the block) runs the handler a held signal would have run,
    which raises KeyboardInterrupt. Why: CPython runs a signal handler between any two
    bytecodes of the main thread, including between a lock's acquire and the `with` that
    releases it (bpo-29988). A KeyboardInterrupt raised there leaves the lock held, and
    threads waiting on it wait for ever: an interrupted Chakra export once hung on
    ThreadPoolExecutor's idle-semaphore lock. Code that shares locks with worker threads
    runs inside this block and takes the interrupt at the points it chooses.
    Outside the main thread (where Python delivers no signals) it holds nothing."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self._displaced: dict = {}
        self._pending: list[int] = []

    def __enter__(self) -> "HeldSignals":
        if threading.current_thread() is threading.main_thread():
            for s in self.SIGNALS:
                self._displaced[s] = signal.signal(s, self._record)
        return self

    def _record(self, signum, frame) -> None:
        self._pending.append(signum)

    def check(self) -> None:
        """Act on a held signal now: run the handler it displaced (KeyboardInterrupt for
        Python's SIGINT handler and Flint's)."""
        if not self._pending:
            return
        signum = self._pending.pop(0)
        handler = self._displaced.get(signum)
        if callable(handler):
            handler(signum, None)
        elif handler == signal.SIG_DFL:
            raise KeyboardInterrupt   # the default would end the process: unwind instead

    def __exit__(self, kind, value, tb) -> None:
        for s, handler in self._displaced.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        if kind is None:
            self.check()


def run_command(fn) -> int:
    """Run `fn()`; return the exit code after printing at most one line for a failure."""
    global _interrupt_seen, _interrupt_reported
    previous = {}
    _interrupt_seen = _interrupt_reported = False
    try:
        previous = install_signal_handlers()
        fn()
        raise_if_interrupted()
        return 0
    except FlintError as e:
        error_line(str(e))
        return e.exit_code
    except KeyboardInterrupt:
        interrupted()
    except OSError as e:
        error_line(os_error_message(e))
        return 2
    except RecursionError:
        error_line("input nested too deeply to read")
        return 2
    except MemoryError:
        error_line("out of memory reading the input (see README: Limits)")
        return 2
    except Exception as e:  # noqa: BLE001 - the promise: one line, never a traceback
        first = str(e).splitlines()[0] if str(e) else ""
        error_line(f"unexpected {type(e).__name__}: {first} (a bug in Flint: please report "
                   f"it with the command line)")
        return 2
    finally:
        restore_signal_handlers(previous)
    return INTERRUPTED_EXIT


def restore_signal_handlers(previous: dict) -> None:
    """In-process callers (tests) get their own handlers back."""
    for signum, handler in previous.items():
        if handler is not None:
            signal.signal(signum, handler)


def interrupted() -> None:
    """One line and exit 130. Once a native runtime (jaxlib, torch) is loaded the process
    ends without interpreter teardown: unwinding it mid-initialisation can crash. The line
    goes to the stderr the process started with (fd 2 may be captured at that moment)."""
    global _interrupt_reported
    _interrupt_reported = True
    try:
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    if _ORIGINAL_STDERR is not None and sys.stderr is sys.__stderr__:
        os.write(_ORIGINAL_STDERR, b"flint: interrupted\n")
    else:
        sys.stderr.write("flint: interrupted\n")
        sys.stderr.flush()
    if any(m in sys.modules for m in ("jaxlib", "torch")):
        sys.stdout.flush()
        os._exit(INTERRUPTED_EXIT)


# --- outputs -------------------------------------------------------------------------
def _probe_writable(directory: str, what: str) -> None:
    try:
        fd, probe = tempfile.mkstemp(prefix=".flint-probe.", dir=directory)
    except OSError as e:
        raise FlintError(f"{what}: cannot write in {directory!r}: "
                         f"{e.strerror or type(e).__name__}") from None
    os.close(fd)
    os.unlink(probe)


def check_output_file(path, what: str = "--out") -> None:
    """`path` can be written as a file (replaced atomically if it exists)."""
    path = os.fspath(path)
    if not path or path.endswith(os.sep):
        raise FlintError(f"{what} {path!r} is not a file name")
    if os.path.isdir(path):
        raise FlintError(f"{what} {path!r} is a directory; give a file name")
    if os.path.lexists(path) and not os.path.isfile(path):
        raise FlintError(f"{what} {path!r} exists and is not a regular file")
    _check_parent(path, what)


def _check_parent(path: str, what: str) -> None:
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.exists(parent) and not os.path.isdir(parent):
        raise FlintError(f"{what} {path!r}: {parent!r} is a file, not a directory")
    if not os.path.isdir(parent):
        raise FlintError(f"output directory {parent!r} does not exist")
    _probe_writable(parent, what)


def check_output_dir(path, what: str = "--out") -> None:
    """`path` is (or can be created as) a directory Flint may write files into."""
    path = os.fspath(path)
    if not path:
        raise FlintError(f"{what} is empty")
    if os.path.lexists(path) and not os.path.isdir(path):
        raise FlintError(f"{what} {path!r} exists and is not a directory")
    if os.path.isdir(path):
        _probe_writable(path, what)
        return
    _check_parent(path, what)
