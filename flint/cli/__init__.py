"""The `flint` command line: one module per command, registered in flint.cli.app;
flint.cli._common holds what they share. `python -m flint` and `python -m flint.cli` run it."""


def main(argv: list[str] | None = None) -> None:
    """Run `flint` with `argv` (default: sys.argv); see flint.cli.app.main."""
    from flint.cli.app import main as run_app

    run_app(argv)
