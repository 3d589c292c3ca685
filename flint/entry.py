"""The `flint` console script: Ctrl-C while the CLI's modules load is one line and exit 130
too (flint.cli.main handles every moment after that)."""
import sys


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def main() -> None:
    import signal

    signal.signal(signal.SIGTERM, _interrupt)   # like Ctrl-C from the first moment
    try:
        from flint.cli import main as cli_main
    except KeyboardInterrupt:
        sys.stderr.write("flint: interrupted\n")
        sys.exit(130)
    cli_main()
