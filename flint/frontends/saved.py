"""Graphs already extracted: a saved workload graph JSON, a Chakra .et file, or a directory
of Chakra ETs (what every command taking GRAPH_FILE reads)."""
from __future__ import annotations

from pathlib import Path


def load_graph(path, rank: int | None = None, comm_groups: str | None = None,
               check: bool = False):
    """A saved graph JSON, a Chakra .et file, or a directory of them (`rank`: which rank's
    file of a directory; `check`: all of its ranks must run to completion in ASTRA-sim)."""
    p = Path(path)
    if p.is_dir() or p.suffix == ".et":
        from flint.frontends.chakra import import_chakra

        if check and p.is_dir():
            from flint.frontends.chakra_ranks import check_directory

            check_directory(p, comm_groups)
        return import_chakra(p, rank, comm_groups)
    from flint.graph import WorkloadGraph

    return WorkloadGraph.load(p)
