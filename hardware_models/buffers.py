"""Buffers of a graph's nodes: their sizes and how long they live (shared by Flint's
liveness in memory.py and the PyTorch caching-allocator replay in torch_allocator.py)."""
from __future__ import annotations

from flint.graph import WorkloadGraph
from flint.hlo.shapes import parse_shape


def leaf_bytes(outputs: list[str]) -> list[int]:
    return [parse_shape(s).nbytes for s in outputs]


def last_uses(graph: WorkloadGraph) -> list[int]:
    """Per node, the index of the last node that needs its outputs (loop-carried values:
    the end of their loop's body)."""
    last = list(range(len(graph.nodes)))
    for i, users in enumerate(graph.users):
        if users:
            last[i] = max(users)
    for loop in graph.loops:   # carried values survive to the end of the body
        for _, producers, _ in loop.carried:
            for p in producers:
                last[p] = max(last[p], loop.last)
    return last


def reuses_operand_buffer(node) -> bool:
    """Whether a node may write its output into an operand that dies at it. XLA's buffer
    assignment does so for any output of an operand's size (elementwise updates,
    dynamic-update-slice). PyTorch only in its in-place kernels, named with a trailing
    underscore (add_, mul_, copy_, _foreach_add_; the ATen naming convention): an
    out-of-place kernel's output is allocated while its inputs are still held, so both
    count at once (log_softmax's backward beside the gradient it reads)."""
    aten = node.meta.get("aten")
    if aten is None:
        return True
    return str(aten).rsplit("::", 1)[-1].endswith("_")
