"""User-facing errors: the CLI prints their message on one line and exits with code 2."""


class FlintError(Exception):
    """Bad input or an impossible request, explained in one line for the user."""

    exit_code = 2
