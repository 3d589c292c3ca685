"""`python -m flint` runs the CLI, whose --help lists every command once, in the order
flint/cli/app.py gives, each with a one-line summary."""
import os
import subprocess
import sys

from flint.cli.app import COMMANDS


def test_help_lists_commands_in_order_with_one_line_summaries():
    r = subprocess.run([sys.executable, "-m", "flint", "--help"], capture_output=True,
                       text=True, timeout=120, env=dict(os.environ, COLUMNS="100"))
    assert r.returncode == 0, r.stderr
    rows = [line.strip("│ ").split(None, 1) for line in r.stdout.splitlines()
            if line.startswith("│ ") and not line.startswith("│ --")]
    assert [row[0] for row in rows] == [name for name, _, _ in COMMANDS]
    for (name, _, summary), row in zip(COMMANDS, rows):
        assert row[1].strip() == summary and len(summary) <= 70, name
