"""Re-target a workload graph to another cluster size without re-extracting it (an
imported Chakra trace, a graph whose training script is gone).

    graph = Rescale(devices=2048).run(graph)                  # the data axis absorbs it
    graph = Rescale(devices=2048, mesh="fsdp=256,model=8").run(graph)

Rescaling assumes weak scaling along data-parallel axes, as `flint extract` does for the
built-in models: each replica keeps its batch, so per-device activations, GEMMs and the
model flops per device stay as they are, and only what is split across the data axis
changes: communicator groups, the shards of FSDP-sharded parameters and optimizer state,
and the collectives that gather or scatter them.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, replace
from typing import ClassVar
from fractions import Fraction

from flint.cluster import parse_mesh
from flint.errors import FlintError
from flint.graph import Node, WorkloadGraph
from flint.passes.rescale_comms import Mesh, rebuild
from flint.passes.rescale_shards import ShardFamilies, nbytes, reshard

# Axis names as flint.models.train gives them meaning (repeated here so that rescaling a
# graph does not import JAX): a data-parallel axis may be resized, a tensor-parallel not.
DATA_PARALLEL = ("fsdp", "zero", "data", "dp", "batch", "replica")
TENSOR_PARALLEL = ("model", "tensor", "tp")


@dataclass(frozen=True)
class Rescale:
    """Contract: returns a new graph (the input is not modified) for a cluster of `devices`
    devices, same hardware and hosts' size. By default the data-parallel axis (fsdp or
    data, or the only axis of a one-axis mesh such as an imported Chakra trace; `axis`
    names another) absorbs the change and the other axes keep their sizes; `mesh` (e.g.
    "fsdp=128,model=8") gives the target mesh, with the graph's axis names in its order.

    - Communicators: every one is rebuilt on the new mesh from the sub-mesh its groups
      span (passes.rescale_comms; the outermost factor of a resized axis absorbs the
      change), written in XLA's iota replica-group syntax; source-target pairs when they
      stay inside unchanged axes, shift along one axis or transpose the mesh.
    - Collectives whose group goes from g to g' ranks: an all-gather of floating-point
      data (a parameter shard) keeps its output, the full tensor, and its per-rank input
      becomes output/g'; a reduce-scatter (of gradients) keeps its input and its output
      becomes input/g'; integer data (token ids: each rank's piece of the batch) keeps
      the per-rank side instead. All-reduce, all-to-all (each rank re-shards its own
      fixed-size batch slice: the per-peer chunks shrink, the buffer does not),
      collective-permute and send/recv keep their bytes. Without shapes (an imported
      trace) the parameter rule applies.
    - Shards (passes.rescale_shards): operand shapes that those all-gathers gather and
      reduce-scatters scatter, found again anywhere in the graph (optimizer updates,
      casts, slices of the layer stack), get the new shard extent, with the nodes' bytes
      and flops scaled to match; per-device argument bytes of those sizes (parameters,
      optimizer state) and the step's output bytes follow.
    - Not rescaled: GEMMs and activations (weak scaling), device-id tables, compiler
      decisions that change with size (XLA may pick other collectives at the new size:
      scripts/compare_rescale.py measures the error against real re-extraction).
      meta["xla_memory"] is dropped (the compiler never saw this program);
      meta["rescaled_from"] records the source devices and mesh, and
      meta["sharded_arguments"] the arguments found to be shards (see _argument_sizes).

    Impossible targets are a FlintError: fewer than 1 device, a count the fixed axes do
    not divide, a mesh of another product or other axis names, resizing a tensor-parallel
    axis, a shard dim the new axis size does not divide, an MPMD (pipelined) graph, or
    communicators that are not regular sub-meshes of the graph's mesh."""

    devices: int = 0
    mesh: str = ""
    axis: str = ""
    name: ClassVar[str] = "rescale"

    def run(self, graph: WorkloadGraph) -> WorkloadGraph:
        if any(n.device is not None for n in graph.nodes) or graph.meta.get("mpmd_devices"):
            raise FlintError("cannot rescale an MPMD graph (pipeline stages on separate "
                             "devices); rescale the SPMD graph before the pipeline pass")
        old = graph.cluster.mesh
        new = target_mesh(old, self.devices, self.mesh, self.axis)
        comms = [rebuild(c, old, new) for c in graph.communicators]
        resized = {c.id: (c.size, c2.size) for c, c2 in zip(graph.communicators, comms)
                   if c.kind == "groups" and c.size != c2.size}
        families = ShardFamilies(graph, resized)
        nodes = []
        for n in graph.nodes:
            node = copy.copy(n)
            if n.collective is None:
                families.rescale_node(node)
            else:
                node.collective = replace(n.collective)
                _rescale_collective(node, resized.get(n.collective.communicator), families)
            nodes.append(node)
        cluster = replace(graph.cluster, devices=math.prod(s for _, s in new), mesh=new)
        out = WorkloadGraph(cluster, nodes, comms, list(graph.loops),
                            _meta(graph, nodes, families, old))
        out.check()
        return out


def target_mesh(old: Mesh, devices: int, mesh: str = "", axis: str = "") -> Mesh:
    """The mesh a rescale to `devices` devices gives (see Rescale)."""
    if devices < 1:
        raise FlintError(f"cannot rescale to {devices} devices: need at least 1")
    names = tuple(n for n, _ in old)
    if mesh and axis:
        raise FlintError("give the target mesh or the axis that absorbs the change, not both")
    if mesh:
        new = parse_mesh(mesh, devices)
        if tuple(n for n, _ in new) != names:
            raise FlintError(f"target mesh axes ({', '.join(n for n, _ in new)}) differ "
                             f"from the graph's ({', '.join(names)})")
    else:
        axis = axis or _data_axis(old)
        if axis not in names:
            raise FlintError(f"the graph's mesh has no axis {axis!r} ({', '.join(names)})")
        rest = math.prod(s for n, s in old if n != axis)
        if devices % rest:
            fixed = ",".join(f"{n}={s}" for n, s in old if n != axis)
            raise FlintError(f"cannot rescale to {devices} devices: the axes that keep "
                             f"their size ({fixed}) need a multiple of {rest}")
        new = tuple((n, devices // rest if n == axis else s) for n, s in old)
    for (n, s), (_, s2) in zip(old, new):
        if s != s2 and (n in TENSOR_PARALLEL or
                        (len(old) > 1 and n not in DATA_PARALLEL and n != axis)):
            raise FlintError(f"cannot resize mesh axis {n!r} ({s} -> {s2}): rescale changes "
                             f"data-parallel axes only (per-device work stays); re-extract "
                             f"for another {n} size")
    return new


def _data_axis(mesh: Mesh) -> str:
    if len(mesh) == 1:
        return mesh[0][0]
    found = [n for n, _ in mesh if n in DATA_PARALLEL]
    if len(found) != 1:
        shown = ",".join(f"{n}={s}" for n, s in mesh)
        raise FlintError(f"mesh {shown} has {'no' if not found else 'more than one'} "
                         f"data-parallel axis ({'/'.join(DATA_PARALLEL)}): give the "
                         f"target --mesh")
    return found[0]


def _rescale_collective(node: Node, sizes: tuple[int, int] | None,
                        families: ShardFamilies) -> None:
    c = node.collective
    old_in, old_out = c.bytes_in, c.bytes_out
    if sizes is None or c.type not in ("all-gather", "reduce-scatter"):
        # Bytes independent of the group size; the tensors may still be shards of an
        # axis this communicator does not span (an all-reduce across the model axis).
        ratios = families.rescale_node(node)
        if ratios is not None:
            c.bytes_in, c.bytes_out = round(old_in * ratios[0]), round(old_out * ratios[1])
        return
    g, g2 = sizes
    gather = c.type == "all-gather"
    shards, fulls = (node.operands, node.outputs) if gather else (node.outputs, node.operands)
    done = [reshard(node, s, f, g, g2) for s, f in zip(shards, fulls)]
    if not any(done):   # no shapes to go by (an imported trace): the parameter rule
        if gather:
            c.bytes_in = c.bytes_out // g2
        else:
            c.bytes_out = c.bytes_in // g2
    else:
        new_shards = [x[0] if x else s for x, s in zip(done, shards)] + shards[len(done):]
        new_fulls = [x[1] if x else f for x, f in zip(done, fulls)] + fulls[len(done):]
        grow_shard = sum(map(nbytes, new_shards)) - sum(map(nbytes, shards))
        grow_full = sum(map(nbytes, new_fulls)) - sum(map(nbytes, fulls))
        if gather:
            node.operands, node.outputs = new_shards, new_fulls
            c.bytes_in, c.bytes_out = old_in + grow_shard, old_out + grow_full
        else:
            node.outputs, node.operands = new_shards, new_fulls
            c.bytes_in, c.bytes_out = old_in + grow_full, old_out + grow_shard
    node.bytes_read *= c.bytes_in / old_in if old_in else 1.0
    node.bytes_written *= c.bytes_out / old_out if old_out else 1.0


def _meta(graph: WorkloadGraph, nodes: list[Node], families: ShardFamilies,
          old: Mesh) -> dict:
    meta = copy.deepcopy(graph.meta)
    args = meta.get("arguments")
    if args:
        sizes, sharded = _argument_sizes(graph, nodes, families)
        aliased = set(meta.get("aliased_arguments", ()))
        # A donated argument's result lives in its buffer: the outputs move with it.
        moved = sum(new - int(a[1]) for i, (a, new) in enumerate(zip(args, sizes))
                    if i in aliased)
        for arg, new in zip(args, sizes):
            arg[1] = new
        if "output_bytes" in meta:
            meta["output_bytes"] = max(int(meta["output_bytes"]) + moved, 0)
        if sharded is not None:
            meta["sharded_arguments"] = sharded
    # XLA's own memory figure was for the program it compiled, not this one.
    meta.pop("xla_memory", None)
    meta["rescaled_from"] = {"devices": graph.cluster.devices, "mesh": dict(old)}
    return meta


def _argument_sizes(graph: WorkloadGraph, nodes: list[Node], families: ShardFamilies):
    """(new per-device bytes of each argument, indices of the sharded ones to record, or
    None). Arguments have names and sizes, no shapes: an argument moves with the tensors
    of its size when they all moved alike; a donated one is matched against the step's
    results first (the updated parameters and optimizer state have its shape), so an
    activation that happens to have its size does not decide. The sharded ones found the
    first time are recorded (meta["sharded_arguments"]) and trusted by later rescales: at
    some sizes a shard has the bytes of a replicated parameter and could not be told."""
    args = graph.meta["arguments"]
    ratios = {Fraction(new, old) for old, new in families.families.values()}
    known = graph.meta.get("sharded_arguments")
    if known is not None and len(ratios) == 1:
        ratio = next(iter(ratios))
        return [int(a[1] * ratio) if i in known else int(a[1])
                for i, a in enumerate(args)], None
    results: dict[int, set[int]] = {}
    for n, users in zip(graph.nodes, graph.users):
        if not users:
            for a, b in zip(n.outputs, nodes[n.id].outputs):
                results.setdefault(nbytes(a), set()).add(nbytes(b))
    aliased = set(graph.meta.get("aliased_arguments", ()))
    sizes = []
    for i, (_, size) in enumerate(args):
        seen = results if i in aliased and size in results else families.sizes
        sizes.append(next(iter(seen[size])) if len(seen.get(size, ())) == 1 else int(size))
    sharded = [i for i, (a, new) in enumerate(zip(args, sizes)) if new != a[1]]
    return sizes, (sharded if ratios and known is None else None)
