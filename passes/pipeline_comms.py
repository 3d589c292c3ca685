"""The communicators a pipeline's transfers use: each stage boundary's rank pairs, and the
tensor-parallel group that gathers a boundary sent as slices."""
from __future__ import annotations

from flint.cluster import Cluster
from flint.errors import FlintError
from flint.graph import Communicator

PIPE_AXIS = "pipe"


def stage_pairs(comm: int, cluster: Cluster, src: int, dst: int, stages: int) -> Communicator:
    """Rank l of stage `src` sends to rank l of stage `dst` (the pipe axis is outermost,
    as in Megatron-LM's rank order). Whether a pair crosses a host depends on l only
    through l mod devices_per_host, so that many pairs tell the network model which link
    (NVLink inside a node, the NIC across nodes) every pair of the boundary uses."""
    base = cluster.devices
    offsets = range(min(base, cluster.devices_per_host))
    spec = "{" + ",".join(f"{{{src * base + k},{dst * base + k}}}" for k in offsets) + "}"
    return Communicator(comm, "pairs", spec, base * stages, 2, len(offsets), (PIPE_AXIS,))


def tensor_parallel(comms: list[Communicator], slices: int) -> int | None:
    """The tensor-parallel communicator that gathers a boundary sent in `slices` slices
    (None for one slice)."""
    if slices == 1:
        return None
    for c in comms:
        if c.kind == "groups" and tuple(c.mesh_axes) == ("model",) and c.size == slices:
            return c.id
    raise FlintError(f"pipeline: scatter_gather {slices} needs the stage's tensor-parallel "
                     f"communicator of {slices} ranks, and its program has none")
