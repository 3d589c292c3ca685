"""`python -m flint.cli` (scripts and tests run the CLI in a subprocess this way)."""
from flint.cli.app import main

main()
