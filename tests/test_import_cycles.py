"""Data flows one way: no import cycle inside the installed package (flint/, passes/ as
flint.passes, hardware_models/ as flint.hardware_models), counting imports at the top of a
module and inside functions alike, and no layer importing the one above it."""
import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"flint": ROOT / "flint", "flint.passes": ROOT / "passes",
            "flint.hardware_models": ROOT / "hardware_models"}


def modules() -> dict[str, Path]:
    found = {}
    for package, root in PACKAGES.items():
        for path in root.rglob("*.py"):
            parts = [p for p in path.relative_to(root).with_suffix("").parts if p != "__init__"]
            found[".".join([package, *parts])] = path
    return found


@functools.lru_cache(maxsize=1)
def import_graph() -> dict[str, set[str]]:
    """module -> the package modules it imports (a name imported from a module counts as
    that module; `from a.b import c` counts a.b.c when c is a module, else a.b)."""
    mods = modules()

    def owner(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    edges = {m: set() for m in mods}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package
                    for _ in range(node.level - 1):
                        anchor = anchor.rpartition(".")[0]
                    base = f"{anchor}.{base}" if base else anchor
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for target in targets:
                found = owner(target)
                if found and found != mod:
                    edges[mod].add(found)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (iterative Tarjan)."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.append(w)
                        if w == v:
                            break
                    if len(component) > 1:
                        out.append(sorted(component))
    return out


def test_cycle_finder_finds_a_planted_cycle():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(edges) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    found = cycles(import_graph())
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


# (importer prefix, imported prefix): lower layers never import the layers above them
FORBIDDEN = [
    ("flint.passes", "flint.cli"), ("flint.passes", "flint.render"),
    ("flint.hardware_models", "flint.cli"), ("flint.hardware_models", "flint.render"),
    ("flint.frontends", "flint.cli"), ("flint.exporters", "flint.cli"),
    ("flint.validate", "flint.cli"), ("flint.models", "flint.cli"),
    ("flint.frontends.jax", "flint.torch"),
]


@pytest.mark.parametrize("importer,imported", FORBIDDEN)
def test_layers_import_downwards_only(importer, imported):
    edges = import_graph()
    bad = sorted(f"{m} -> {t}" for m, targets in edges.items()
                 if m == importer or m.startswith(importer + ".")
                 for t in targets if t == imported or t.startswith(imported + "."))
    assert not bad, bad
