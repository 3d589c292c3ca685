"""Every rank file of a directory of Chakra ETs, checked together: one lane per rank for
exporters.chakra_check's simulation of ASTRA-sim's issue rule (`flint import` runs it
on a directory, `flint export DIR --check` too).

    check_directory("et/")        # number of ranks, or a DeadlockError naming who waits

Compute nodes are contracted away as files are read (a communication node keeps the
nearest communication nodes it depends on through them): they never block, and a rank's
lane then holds only its communication, which is what the simulation needs.
"""
from __future__ import annotations

from pathlib import Path

from flint.errors import FlintError
from flint.exporters import chakra_format as cf
from flint.exporters.chakra_check import simulate
from flint.exporters.chakra_nodes import dimension_group
from flint.frontends.chakra import (_checked_order, _graph_record, _rank_files,
                                    _read_comm_groups)


def lanes_from_files(files: dict, groups: dict, dims: list[int] | None = None) -> dict:
    """One lane per rank from ET files ({rank: path}) and the communicator-group JSON
    ({pg: [ranks]}). Compute nodes are contracted away (a communication node keeps the
    nearest communication nodes it depends on through them): they never block."""
    lanes = {}
    everyone = tuple(sorted(files))
    for rank, path in sorted(files.items()):
        _, nodes = cf.read_et(path)
        by_id = {n.id: n for n in nodes}
        frontier: dict[int, frozenset] = {}
        lane = []
        for n in _topological(nodes, path):
            reach = set()
            for d in set(n.data_deps) | set(n.ctrl_deps):
                if d not in by_id:
                    raise FlintError(f"{path}: node {n.id} depends on node {d}, which is "
                                     f"not in the file")
                reach |= {d} if by_id[d].type in (cf.COLL, cf.SEND, cf.RECV) else frontier[d]
            if n.type not in (cf.COLL, cf.SEND, cf.RECV):
                frontier[n.id] = frozenset(reach)
                continue
            a = cf.attrs(n)
            text = f"{n.name!r}"
            if n.type == cf.COLL:
                key, members = _group_of(rank, a, groups, dims, everyone, path, n)
                sig = (a.get("comm_type"), a.get("comm_size"))
                lane.append(("coll", n.id, sorted(reach), (key, members, sig, text)))
            elif n.type == cf.SEND:
                lane.append(("send", n.id, sorted(reach),
                             ((int(a.get("comm_dst", 0)),), a.get("comm_tag", 0), text)))
            else:
                lane.append(("recv", n.id, sorted(reach),
                             ((int(a.get("comm_src", 0)),), a.get("comm_tag", 0), text)))
        lanes[rank] = lane
    return lanes


def _group_of(rank, a, groups, dims, everyone, path, n):
    pg = a.get("pg_name")
    if pg not in (None, ""):
        if str(pg) not in groups:
            raise FlintError(f"{path}: node {n.id} names process group {pg!r}, which the "
                             f"communicator-group JSON does not define")
        return ("pg", str(pg)), tuple(groups[str(pg)])
    involved = a.get("involved_dim")
    if involved and dims and len(involved) == len(dims):
        members = tuple(dimension_group(rank, dims, involved))
        return ("dims", tuple(involved), members[0]), members
    return ("all",), everyone


def _topological(nodes, path):
    """Nodes in a dependency order (ids ascending where free)."""
    pos = {n.id: i for i, n in enumerate(nodes)}
    if all(pos.get(d, len(nodes)) < i for i, n in enumerate(nodes)
           for d in list(n.data_deps) + list(n.ctrl_deps)):
        return nodes
    return [nodes[i] for i in _checked_order(nodes, path)]


def check_directory(directory, comm_groups=None) -> int:
    """Check every rank file of a directory of ETs; returns the number of ranks."""
    directory = Path(directory)
    files = _rank_files(directory)
    path = comm_groups or (directory / "comm_groups.json")
    groups = _read_comm_groups(path) if Path(path).is_file() else {}
    meta, _ = cf.read_et(files[min(files)])
    header = cf.attrs(meta)
    info = _graph_record(header["flint_graph"], files[min(files)]) if "flint_graph" in header else {}
    simulate(lanes_from_files(files, groups, info.get("dims")))
    return len(files)
