"""Which of a GPU's links a collective's bytes cross: its scale-up domain (NVLink, NVSwitch)
or the scale-out network (its NIC), or both.

Two collectives in flight on one GPU slow each other only where they share a link. A
tensor-parallel all-reduce inside an NVLink domain and a data-parallel reduce-scatter over
one GPU per node (which leaves through the NIC; NCCL runs the two on different
communicators, each with its own CTAs) move their bytes over disjoint links and run at
once; an FSDP all-gather and a reduce-scatter over the same ranks share both. The
schedule (schedule.py) queues collectives per device and link class accordingly.

A communicator's first group says which: ranks in one scale-up domain (Placement
per_domain > 1) use its links; ranks in several domains (domains > 1) use the network,
and that bounds their time. Their hops inside a domain carry the same bytes at the
network's pace, which is a small share of a scale-up link: per GPU and direction, DGX
A100 has a 200 Gb/s HDR NIC (25 GB/s) beside 300 GB/s of NVLink 3, DGX H100 a 400 Gb/s
NDR NIC (50 GB/s) beside 450 GB/s of NVLink 4 (NVIDIA DGX A100 / DGX H100 user guides):
8% and 11%. A collective inside the domain then still gets nearly all of it, so a
group that spans domains queues only on the network; it queues on the scale-up link as
well where that share is half or more (a PCIe "scale-up" no faster than the NIC).
Before, it queued on both, and a seconds-long data-parallel reduction over two GPUs per
node held every tensor-parallel all-reduce of the pipeline's last backward.
CPUs and cost models without a placement keep one queue for everything (BOTH).

A TPU's links are its torus's: two per dimension (to the chip before and the one after),
each full duplex (Cloud TPU system architecture: 4 ICI links per v5e chip in a 2D torus, 6
per v4/v5p chip in a 3D torus), and the DCN between slices. A collective uses the links
its transfers cross, named per chip and direction (torus_links): a collective-permute
those of its route (one of the two halves of XLA's bidirectional windowed einsum sends
forward, the other back, each on its own links), a ring collective both directions of
the links to its neighbours in every dimension its group spans. Collectives that share no
link run at once (schedule.py: a TPU's async collectives are DMAs, not one stream's queue).
"""
from __future__ import annotations

import numpy as np

from flint.graph import Node, WorkloadGraph

SCALE_UP = "scale-up"
SCALE_OUT = "scale-out"
BOTH = frozenset((SCALE_UP, SCALE_OUT))


def collective_links(graph: WorkloadGraph, model) -> list[frozenset] | None:
    """Per node of `graph`, the link classes of its collective (BOTH for other nodes and
    where the model cannot say); None when no node would differ from BOTH."""
    return node_links(graph, links_of(graph, model))


def node_links(graph: WorkloadGraph, of) -> list[frozenset] | None:
    """Per node of `graph`, `of(collective node)` and BOTH for the others; None when `of`
    is None or no node would differ from BOTH."""
    if of is None:
        return None
    out = [of(n) if n.collective is not None else BOTH for n in graph.nodes]
    return out if any(x != BOTH for x in out) else None


DCN = "dcn"


def torus_links(topology):
    """`f(communicator) -> frozenset` of the physical link directions a TPU collective's
    transfers use at the template's rank (rank 0, or the first rank of a communicator that
    leaves it out) on `topology`, named `ici<dim><+|->@<chip>` for the link that leaves
    that chip of the slice that way, and `dcn` for the network between slices.

    Every rank runs the same program, so one rank's links stand for all: a ring collective
    uses both directions of the links between it and its group's neighbours in each
    dimension the group spans, out and in; a collective-permute the links its send and its
    receive cross, routed one dimension after another (x first, the short way round a
    wrapping dimension). Naming the links themselves rather than their dimension and sign
    keeps apart what is apart on the chips: the two rings of a bidirectional windowed
    einsum over a model axis of 16 on an 8x2 plane each cross a y link only on their wrap
    hop, and not the same one."""
    shape, chips = tuple(topology.torus), topology.scale_up_domain
    wraps = tuple(topology.wraps) or (True,) * len(shape)

    def coords(rank: int) -> list[int]:
        return [int(c) for c in topology.coords(rank)]

    def chip(c) -> int:
        return int(np.ravel_multi_index(tuple(c[::-1]), shape[::-1]))

    def step(c, d: int, sign: int):
        n = list(c)
        n[d] = (n[d] + sign) % shape[d]
        return n

    def name(c, d: int, sign: int) -> str:
        return f"ici{d}{'+' if sign > 0 else '-'}@{chip(c)}"

    def route(src: int, dst: int) -> set[str]:
        if src // chips != dst // chips:
            return {DCN}
        at, to, used = coords(src), coords(dst), set()
        for d, size in enumerate(shape):
            delta = (to[d] - at[d]) % size
            if not delta:
                continue
            forward = delta <= size // 2 if wraps[d] else to[d] > at[d]
            sign = 1 if forward else -1
            for _ in range(delta if forward else size - delta):
                used.add(name(at, d, sign))
                at = step(at, d, sign)
        return used

    def around(rank: int, d: int, members=None) -> set[str]:
        """Both directions of `rank`'s links in dimension d to its neighbours among
        `members` (a ring's next and previous rank), out and in; of both its links where
        no neighbour is a member (a group scattered over the dimension)."""
        c, used = coords(rank), set()
        for sign in (1, -1):
            n = step(c, d, sign)
            if members is None or chip(n) in members:
                used |= {name(c, d, sign), name(n, d, -sign)}
        return used or around(rank, d)

    def of(comm) -> frozenset:
        groups = comm.groups()
        if groups.size == 0:
            return frozenset({DCN}.union(*(around(0, d) for d in range(len(shape)))))
        if comm.kind == "pairs":
            me = 0 if (groups == 0).any() else int(groups[0, 0])
            used: set[str] = set()
            for src, dst in groups[(groups[:, 0] == me) | (groups[:, 1] == me)]:
                used |= route(int(src), int(dst))
            return frozenset(used)
        hit = np.nonzero((groups == 0).any(axis=1))[0]
        members = [int(r) for r in groups[hit[0] if len(hit) else 0]]
        me = 0 if len(hit) else members[0]
        used = set()
        if len({r // chips for r in members}) > 1:
            used.add(DCN)
        local = [r for r in members if r // chips == me // chips]
        spread, on_chips = np.array([coords(r) for r in local]), {r % chips for r in local}
        for d in range(len(shape)):
            if len(np.unique(spread[:, d])) > 1:
                used |= around(me, d, on_chips)
        return frozenset(used)

    return of


def links_of(graph: WorkloadGraph, model):
    """`f(node) -> frozenset` of link classes for `graph`'s collectives under `model`, or
    None where the model has no placement of groups on a GPU or TPU topology."""
    network = getattr(model, "network", None)
    place = getattr(network, "placement", None)
    topology = getattr(network, "topology", None)
    spec = getattr(model, "spec", None)
    if getattr(topology, "torus", ()) and spec is not None and spec.kind == "tpu":
        return _per_communicator(graph, torus_links(topology), frozenset())
    if place is None or spec is None or spec.kind != "gpu" or getattr(topology, "torus", ()):
        return None

    def gpu_links(comm) -> frozenset:
        pl = place(comm)
        if pl.domains > 1:
            used = {SCALE_OUT}
            if pl.per_domain > 1 and 2 * spec.nic_bandwidth >= spec.scale_up_bandwidth:
                used.add(SCALE_UP)
        else:
            used = {SCALE_UP} if pl.per_domain > 1 else set()
        return frozenset(used) or BOTH

    return _per_communicator(graph, gpu_links, BOTH)


def _per_communicator(graph: WorkloadGraph, classes_of, default: frozenset):
    """`f(node)`: `classes_of(its communicator)`, once per communicator; `default` for a
    node without a collective."""
    known: dict[int, frozenset] = {}

    def of(node: Node) -> frozenset:
        c = node.collective
        if c is None:
            return default
        if c.communicator not in known:
            known[c.communicator] = classes_of(graph.communicator(node))
        return known[c.communicator]

    return of
