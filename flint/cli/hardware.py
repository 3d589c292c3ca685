"""`flint hardware`: the compile targets Flint knows, with their aliases."""
from __future__ import annotations


def hardware():
    """List the compile targets Flint knows."""
    from flint.frontends.targets import ALIASES, known_hardware

    for name in known_hardware():
        aliases = [a for a, t in ALIASES.items() if t == name]
        print(name + (f"  (also: {', '.join(aliases)})" if aliases else ""))
