"""`python -m flint`: the `flint` command."""
from flint.entry import main

main()
