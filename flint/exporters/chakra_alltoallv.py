"""An all-to-all in a Chakra export: per-peer COMM_SEND / COMM_RECV nodes, each rank with
its own sizes, along the path Flint's network model prices.

Why not one ALL_TO_ALL node:
- NCCL has no all-to-all primitive: PyTorch's ProcessGroupNCCL and XLA's GPU backend run
  one as grouped ncclSend/ncclRecv, one per peer; that is what this writes.
- Under MoE routing skew an all-to-all is an all-to-all-v: in a dispatch every rank sends
  rank j a share proportional to j's load (its experts' tokens), in a combine the reverse
  (the routing pass's record, meta `moe_all_to_all`, passes/moe_routing.py). ASTRA-sim
  runs a collective with one `comm_size` per rank split evenly over the peers; members
  that give different sizes never match each other's chunks and the simulation stops
  (tried on both analytical backends).
- ASTRA-sim's collective all-to-all over two network dimensions took about twice Flint's
  time (scripts/compare_astra_sim.py, graph moe-ep, before this module).

Two routes (`route`), the one Flint's network model prices the node with:
- direct: rank p sends every peer its share, to positions p+1, ..., p+e-1 (mod e) one
  after another (ASTRA-sim keeps one send per rank in flight; an NCCL rank's sends share
  its egress link anyway) and receives from every peer;
- hierarchical (DeepEP, hardware_models/network.py `_hierarchical_all_to_all`), for an
  EP group over several scale-up domains: a dispatch sends each remote domain's tokens
  once over the network to the rank of the same local index there (deduplicated over
  top-k as the model prices it), which forwards them over NVLink to their ranks; tokens
  for the rank's own domain go over NVLink directly. A combine runs the reverse: NVLink
  to the rank of the destination's local index, which sends the domain's results over
  the network once. Each network transfer then joins ranks that differ in the network
  dimension only and each NVLink transfer ranks of one domain, which is how ASTRA-sim
  charges a transfer (on the innermost dimension its ends differ in).

Every rank writes the same parts in the same order (peers and sizes differ), so one lane
per pipeline stage still stands for all of its ranks in chakra_check. Sends are chained;
a forwarding send also waits for the receives it forwards; receives are posted at once
(they wait aside in ASTRA-sim); the last part, a receive, takes the node's own id (2i+1)
after every other part, so whatever depends on the all-to-all depends on all of its
traffic. The other parts take ids above every Flint node's (2n + 2 onward), marked
`flint_part` so that `flint import` rebuilds the one node from the annotated record.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from flint.exporters import chakra_format as cf
from flint.exporters.chakra_nodes import FLINT_NODE, FLINT_PART, comm_size, describe, p2p_node
from flint.graph import Communicator, Node
from flint.hardware_models.network import remote_share

ALL_TO_ALL = ("all-to-all", "ragged-all-to-all")


def per_peer(node: Node, comm: Communicator | None) -> dict | None:
    """How an all-to-all's bytes split over peers: the routing pass's record when it fits
    the communicator, else even chunks; None for anything else (and for groups of one)."""
    c = node.collective
    if c is None or c.type not in ALL_TO_ALL or comm is None or comm.kind != "groups" \
            or comm.size < 2:
        return None
    info = node.meta.get("moe_all_to_all")
    if isinstance(info, dict) and len(info.get("rank_load") or []) == comm.size:
        return info
    return {"balanced_bytes": comm_size(c, comm), "into_experts": True,
            "rank_load": [1.0] * comm.size}


def pair_bytes(info: dict, src: int, dst: int) -> float:
    """Bytes EP position `src` sends position `dst` (unrounded)."""
    load = info["rank_load"]
    return float(info["balanced_bytes"]) / len(load) * load[dst if info["into_experts"]
                                                            else src]


@dataclass(frozen=True)
class Part:
    """One send or receive of a rank; `after`: indices of earlier parts it waits for."""
    kind: int          # cf.SEND or cf.RECV
    peer: int          # global rank
    tag: int
    size: float
    after: tuple = ()
    what: str = ""


@dataclass
class AllToAllvSlot:
    node: Node
    base: "cf.Node"           # the node's template proto (id 2i+1, its deps)
    comm: Communicator
    info: dict
    first_id: int             # the first extra id
    tag: int                  # the first tag
    stage: int
    per_stage: int
    domain_size: int = 0      # ranks per scale-up domain; > 0: the hierarchical route
    top_k: int = 0

    def __post_init__(self):
        offset = self.stage * self.per_stage
        groups = [[int(r) + offset for r in g] for g in self.comm.groups()]
        self.size = len(groups[0])
        self.where = {r: (row, pos) for row, g in enumerate(groups) for pos, r in enumerate(g)}
        self.groups = groups
        self.deps = sorted(set(self.base.data_deps) | set(self.base.ctrl_deps))
        if self.domain_size and not all(self._domains(g) for g in groups):
            self.domain_size = 0              # members not alike in every domain: direct
        self.sample = self.parts(groups[0][0])      # every member's parts look alike
        self.count = len(self.sample)
        self.tags = 1 + max(p.tag for p in self.sample) - self.tag

    @property
    def extra_ids(self) -> int:
        return self.count - 1

    # --- the parts of one rank ----------------------------------------------------
    def parts(self, rank: int) -> list[Part]:
        row, p = self.where[rank]
        group = self.groups[row]
        if self.domain_size:
            return self._hierarchical(group, p)
        e, out = self.size, []
        for k in range(1, e):
            q = (p + k) % e
            out.append(Part(cf.SEND, group[q], self.tag + k, pair_bytes(self.info, p, q),
                            (len(out) - 1,) if k > 1 else (), f"send {k}"))
        for k in range(1, e):
            q = (p - k) % e
            out.append(Part(cf.RECV, group[q], self.tag + k, pair_bytes(self.info, q, p),
                            (), f"receive {k}"))
        return out

    def _domains(self, group: list[int]):
        """{domain: {local index: position}} when every domain of the group holds the same
        local indices (else None; one domain or one rank per domain: None too)."""
        by: dict[int, dict[int, int]] = {}
        for pos, r in enumerate(group):
            by.setdefault(r // self.domain_size, {})[r % self.domain_size] = pos
        locs = {tuple(sorted(v)) for v in by.values()}
        if len(by) < 2 or len(locs) != 1 or len(next(iter(locs))) < 2:
            return None
        return by

    def _hierarchical(self, group: list[int], p: int) -> list[Part]:
        by = self._domains(group)
        doms, locs = sorted(by), sorted(next(iter(by.values())))
        k, m = len(doms), len(locs)
        me = group[p]
        d, li = doms.index(me // self.domain_size), locs.index(me % self.domain_size)
        pos = lambda di, lj: by[doms[di % k]][locs[lj % m]]          # noqa: E731
        pair = lambda a, b: pair_bytes(self.info, a, b)               # noqa: E731
        share = remote_share(self.top_k, k)
        t_net, t_direct, t_fwd = self.tag, self.tag + k, self.tag + k + m
        dispatch = self.info["into_experts"]
        net_send, net_recv, direct_send, direct_recv, fwd_send, fwd_recv = [], [], [], [], [], []
        for o in range(1, k):
            to, frm = (d + o) % k, (d - o) % k
            if dispatch:   # this rank's tokens for domain `to`, once, to its twin there
                out = share * sum(pair(p, pos(to, j)) for j in range(m))
                into = share * sum(pair(pos(frm, li), pos(d, j)) for j in range(m))
            else:          # its domain's results for its twin in `to`, reduced here
                out = share * sum(pair(pos(d, j), pos(to, li)) for j in range(m))
                into = share * sum(pair(pos(frm, j), p) for j in range(m))
            net_send.append((group[pos(to, li)], t_net + o, out, f"network send {o}"))
            net_recv.append((group[pos(frm, li)], t_net + o, into, f"network receive {o}"))
        for j in range(1, m):
            to, frm = (li + j) % m, (li - j) % m
            direct_send.append((group[pos(d, to)], t_direct + j, pair(p, pos(d, to)),
                                f"NVLink send {j}"))
            direct_recv.append((group[pos(d, frm)], t_direct + j, pair(pos(d, frm), p),
                                f"NVLink receive {j}"))
            remote = [x for x in range(k) if x != d]
            if dispatch:   # forward what the twins sent here for rank `to`
                out = sum(pair(pos(x, li), pos(d, to)) for x in remote)
                into = sum(pair(pos(x, frm), p) for x in remote)
            else:          # hand the rank of local index `to` its remote destinations' share
                out = sum(pair(p, pos(x, to)) for x in remote)
                into = sum(pair(pos(d, frm), pos(x, li)) for x in remote)
            fwd_send.append((group[pos(d, to)], t_fwd + j, out, f"NVLink forward {j}"))
            fwd_recv.append((group[pos(d, frm)], t_fwd + j, into, f"NVLink forwarded {j}"))
        # dispatch: network, NVLink direct, forward (after the network receives);
        # combine: to the relays, NVLink direct, network (after the relays' receives)
        first, later, wait_for, rest = ((net_send, fwd_send, net_recv, fwd_recv) if dispatch
                                        else (fwd_send, net_send, fwd_recv, net_recv))
        # the receives the forwarding sends wait for come first: the last part (the
        # node's own id) waits for every other part, so it must not be one of them
        sends, recvs = first + direct_send + later, wait_for + direct_recv + rest
        waited = tuple(range(len(sends), len(sends) + len(wait_for)))
        out: list[Part] = []
        for i, (peer, tag, size, what) in enumerate(sends):
            after = ((i - 1,) if i else ()) + (waited if i == len(first) + m - 1 else ())
            out.append(Part(cf.SEND, peer, tag, size, after, what))
        out.extend(Part(cf.RECV, peer, tag, size, (), what) for peer, tag, size, what in recvs)
        return out

    # --- encoding -----------------------------------------------------------------
    def _ids(self) -> list[int]:
        return [self.first_id + i for i in range(self.count - 1)] + [self.base.id]

    def lane(self) -> list[tuple]:
        """The parts as chakra_check sees them: the stage's ranks are one lane (they all
        write these parts), so a peer of the stage is the lane itself."""
        ids, me = self._ids(), [self.stage]
        parts = self.sample
        out = []
        for i, part in enumerate(parts):
            deps = self._deps(i, part, ids, len(parts))
            kind = "send" if part.kind == cf.SEND else "recv"
            out.append((kind, ids[i], deps, (me, part.tag, f"{describe(self.node)} "
                                                           f"{part.what}")))
        return out

    def _deps(self, i: int, part: Part, ids: list[int], n: int) -> list[int]:
        if i == n - 1:                                # the node's own id: after everything
            return sorted(set(self.deps) | set(ids[:-1]))
        if part.after:
            return sorted(ids[a] for a in part.after)
        return list(self.deps)

    def rank_nodes(self, rank: int) -> list[bytes]:
        if rank not in self.where:                    # outside every group: a no-op
            return [cf.frame(p2p_node(self.base, cf.COMP, rank, rank, self.tag, 0))]
        ids, parts = self._ids(), self.parts(rank)
        out = []
        for i, part in enumerate(parts):
            src, dst = (rank, part.peer) if part.kind == cf.SEND else (part.peer, rank)
            # at least 1 byte: ASTRA-sim never delivers an empty message (NCCL still
            # exchanges a zero-count peer's handshake)
            q = p2p_node(self.base, part.kind, src, dst, part.tag,
                         max(1, int(round(part.size))))
            q.id = ids[i]
            if i < len(parts) - 1:
                keep = [a for a in q.attr if a.name != FLINT_NODE]
                del q.attr[:]
                q.attr.extend(keep)
                q.attr.append(cf.Attr(name=FLINT_PART, string_val=f"all-to-all {part.what}"))
            if part.after or i == len(parts) - 1:
                deps = self._deps(i, part, ids, len(parts))
                data = set(q.data_deps) if i == len(parts) - 1 else set()
                q.data_deps[:] = sorted(data)
                q.ctrl_deps[:] = sorted(set(deps) - data)
            out.append(cf.frame(q))
        return out


# --- expert work per rank ---------------------------------------------------------------
def expert_work_by_rank(flat, durations: list[float], model) -> tuple[dict, dict]:
    """({node id: seconds per EP position}, {rank: EP position}) for the expert nodes of a
    graph routed with skew (passes/moe_routing.py prices every rank as the straggler; a
    rank's file runs its own experts' tokens): each node's time scaled by what the cost
    model gives its variant at that position over what it gives the straggler's, so the
    schedule's overlap slowdown carries over. Empty for other graphs."""
    from flint.passes.moe_routing import at_rank

    report = flat.meta.get("moe_routing")
    if not isinstance(report, dict) or not report.get("dropless") \
            or "expert_shares" not in report:
        return {}, {}
    a2a = next((n for n in flat.nodes if n.collective is not None
                and "moe_all_to_all" in n.meta), None)
    ep = int(report.get("ep") or 1)
    if a2a is None or ep < 2:
        return {}, {}
    groups = flat.communicator(a2a).groups()
    if len(groups[0]) != ep:
        return {}, {}
    position = {int(r): i for g in groups for i, r in enumerate(g)}
    work, ratios = {}, {}
    for node, seconds in zip(flat.nodes, durations):
        if "moe_expert" not in node.meta:
            continue
        key = node.meta.get("template", ("node", node.id))
        if key not in ratios:
            mine = model.node_time(node, flat)
            ratios[key] = [model.node_time(at_rank(node, report, r), flat) / mine if mine
                           else 1.0 for r in range(ep)]
        work[node.id] = [seconds * x for x in ratios[key]]
    return work, position


@dataclass
class RankWorkSlot:
    """A compute node whose time depends on the rank's EP position."""
    base: "cf.Node"
    seconds: list             # per EP position, one execution
    repeat: int
    position: dict            # stage-local rank -> EP position
    per_stage: int
    _frames: dict = field(default_factory=dict)

    def rank_nodes(self, rank: int) -> list[bytes]:
        pos = self.position.get(rank % self.per_stage)
        if pos is None:
            return [cf.frame(self.base)]
        if pos not in self._frames:
            q = cf.Node()
            q.CopyFrom(self.base)
            q.duration_micros = max(1, round(self.seconds[pos] * self.repeat * 1e6))
            self._frames[pos] = cf.frame(q)
        return [self._frames[pos]]
