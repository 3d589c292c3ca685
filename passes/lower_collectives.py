"""Collective and send/recv instructions -> Collective records and shared Communicators.

Each distinct replica-group (or source-target-pair) spec becomes one Communicator, whatever
number of instructions use it; its groups are expanded once, to check them against the
cluster and to name the mesh axes they span.
"""
from __future__ import annotations

import re

import numpy as np

from flint.cluster import Cluster
from flint.errors import FlintError
from flint.graph import Collective, Communicator, NodeKind
from flint.hlo.module import HloComputation, HloInstruction, HloModule
from flint.hlo.replica_groups import (mesh_axes_spanned, parse_replica_groups,
                                      parse_source_target_pairs)
from flint.hlo.shapes import Shape
from flint.passes.hlo_cost import COLLECTIVES

P2P = {"send": NodeKind.SEND, "recv": NodeKind.RECV}
_SEND_RECV_PAIRS = re.compile(r'_xla_send_recv_source_target_pairs="?(\{[\d{},\s]*\})')


def fused_collective(module: HloModule, ins: HloInstruction):
    """(fused computation, its collective) when a fusion wraps exactly one collective."""
    called = ins.called("calls")
    body = module.computations.get(called[0]) if called else None
    if body is None:
        return None
    inner = [i for i in body.instructions if i.opcode in COLLECTIVES]
    return (body, inner[0]) if len(inner) == 1 else None


class CommunicatorTable:
    """One Communicator per distinct (kind, spec), numbered in order of first use. Every
    front end (HLO, aten graphs, Chakra traces) builds its communicators here."""

    def __init__(self, cluster: Cluster, per_slice: int = 0):
        self.cluster = cluster
        # a Multislice program's groups name one slice's chips (passes.tpu_megascale):
        # every slice runs them alike, so each group stands for its copy in every slice
        self.per_slice = per_slice if 0 < per_slice < cluster.devices else 0
        self.comms: dict[tuple[str, str], Communicator] = {}

    def all(self) -> list[Communicator]:
        return sorted(self.comms.values(), key=lambda c: c.id)

    def get(self, kind: str, spec: str, across_slices: bool = False) -> Communicator:
        """`kind` "groups" (replica groups in any XLA syntax) or "pairs" (source-target
        pairs); a group naming a device outside the cluster (or, in a Multislice program,
        outside one slice unless `across_slices`) is a FlintError."""
        key = (kind, spec)
        comm = self.comms.get(key)
        if comm is not None:
            return comm
        n = self.cluster.devices
        sliced = self.per_slice and not across_slices
        named = self.per_slice if sliced else n
        groups = (parse_source_target_pairs(spec) if kind == "pairs"
                  else parse_replica_groups(spec, named))
        if groups.size and int(groups.max()) >= named:
            raise FlintError(f"a collective names device {int(groups.max())} but the "
                             f"{'slice' if sliced else 'cluster'} has {named} devices")
        if sliced:
            groups = np.concatenate([groups + s * named for s in range(n // named)])
            spec = "{" + ",".join("{" + ",".join(map(str, g)) + "}" for g in groups.tolist()) + "}"
        size = 2 if kind == "pairs" else int(groups.shape[1])
        comm = Communicator(len(self.comms), kind, spec, n, size, int(groups.shape[0]),
                            mesh_axes_spanned(groups, list(self.cluster.mesh)))
        self.comms[key] = comm
        return comm


class CollectiveBuilder:
    def __init__(self, module: HloModule, cluster: Cluster, per_slice: int = 0):
        self.module = module
        self.cluster = cluster
        self.table = CommunicatorTable(cluster, per_slice)

    def communicators(self) -> list[Communicator]:
        return self.table.all()

    def of(self, ins: HloInstruction, comp: HloComputation, opcode: str) -> Collective:
        operand_shapes = [comp.by_name[o].shape for o in ins.operands if o in comp.by_name]
        # Tokens order side effects and u32[] scalars are async contexts: neither is data.
        data = [s for s in operand_shapes
                if s.dtype != "token" and not (s.dtype == "u32" and not s.dims)]
        if opcode == "collective-permute":
            comm = self.table.get("pairs", ins.attr("source_target_pairs") or "{}")
        elif opcode in P2P:
            m = _SEND_RECV_PAIRS.search(ins.attr("frontend_attributes") or "")
            comm = self.table.get("pairs", m.group(1) if m else "{}")
            data = operand_shapes[:1] if opcode == "send" else []
        else:
            comm = self.table.get("groups", ins.replica_groups() or "{}")
        reducer = ins.called("to_apply")
        reduction = self.module.computations[reducer[0]].root.opcode if reducer else None
        leaves = [leaf for s in data for leaf in s.leaves()]
        out = ins.shape if opcode != "recv" else (ins.shape.elements[0] if ins.shape.is_tuple else ins.shape)
        dtype = (leaves or out.leaves() or [Shape("f32")])[0].dtype
        return Collective(type=opcode, communicator=comm.id, bytes_in=sum(s.nbytes for s in data),
                          bytes_out=out.nbytes, dtype=dtype, reduction=reduction)

    def fused(self, ins: HloInstruction, inner) -> Collective:
        """A TPU fusion wrapping a collective (`kind=kCustom, calls=%all-reduce-scatter.N`):
        an all-reduce whose result each rank slices down to its shard is a reduce-scatter."""
        body, coll = inner
        c = self.of(coll, body, coll.opcode)
        if coll.opcode == "all-reduce" and ins.shape.nbytes * 2 <= coll.shape.nbytes:
            c.type = "reduce-scatter"
        c.bytes_out = ins.shape.nbytes
        return c
