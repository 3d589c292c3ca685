"""An NVFP4 program's tensors at the size and tensor rate the GPU runs them at.

The JAX twin of an NVFP4 run (flint.models.nvfp4) holds every E2M1 tensor in an f8e4m3fn
container, because XLA's compile-only GPU targets emit no block-scaled FP4 GEMM; nothing
else in such a program is f8e4m3fn. This pass says what the containers stand for:

- every f8e4m3fn output and operand becomes f4e2m1fn (half a byte per element), and the
  node's bytes written and read shrink by what the re-typed tensors no longer take; a
  GEMM on them reads its dtype as FP4 and runs at the FP4 tensor rate
  (hardware_models.spec.HardwareSpec.peak);
- a cast's block scales: XLA computes them in a kernel of their own that reads the tensor
  being cast (the block amax) and writes f32 per block; Transformer Engine's cast kernel
  takes the block amax in registers and writes one E4M3 byte per block beside the
  elements (NVFP4BlockScaling's quantize kernels). So a node whose every user is a cast
  and whose output has 1/16 or 1/256 of a user's elements (1 x 16 and 16 x 16 blocks)
  reads nothing the cast also reads, and writes one byte per block; the cast reads one
  byte per block of it.

Contract: the graph of a program whose only f8e4m3fn values are E2M1 containers (the
engine runs this pass for runs with precision nvfp4 only); ids, edges, flops and every
other node are unchanged.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import ClassVar

from flint.graph import TENSOR_CLASSES, Node, WorkloadGraph
from flint.hlo.shapes import parse_shape

CONTAINER = "f8e4m3fn"
E2M1 = "f4e2m1fn"
BLOCKS = (16, 256)      # elements per block scale: 1 x 16 and 16 x 16
_CONTAINER_ARRAY = re.compile(rf"\b{CONTAINER}\[")


@dataclass(frozen=True)
class Nvfp4Storage:
    name: ClassVar[str] = "nvfp4-storage"

    def run(self, graph: WorkloadGraph) -> WorkloadGraph:
        casts = {n.id for n in graph.nodes if any(_holds_container(o) for o in n.outputs)}
        nodes = [_retyped(n) for n in graph.nodes]
        users = graph.users
        for n in graph.nodes:
            if (n.id in casts or n.op_class in TENSOR_CLASSES or n.collective is not None
                    or not users[n.id] or not all(u in casts for u in users[n.id])):
                continue
            blocks = _elements(n.outputs)
            if not blocks or not all(_elements(nodes[u].outputs) in
                                     {blocks * b for b in BLOCKS} for u in users[n.id]):
                continue
            cast_reads = {o for u in users[n.id] for o in nodes[u].operands}
            shared = sum(parse_shape(o).nbytes for o in n.operands if o in cast_reads)
            out_bytes = sum(parse_shape(o).nbytes for o in n.outputs)
            nodes[n.id] = replace(nodes[n.id], bytes_read=max(0.0, n.bytes_read - shared),
                                  bytes_written=float(blocks),
                                  meta={**n.meta, "nvfp4": "block scales"})
            for u in users[n.id]:       # one byte per block instead of the f32 written
                per_block = out_bytes - blocks
                nodes[u] = replace(nodes[u], bytes_read=max(0.0, nodes[u].bytes_read
                                                            - per_block))
        return replace(graph, nodes=nodes)


def _holds_container(shape: str) -> bool:
    return any(leaf.dtype == CONTAINER for leaf in parse_shape(shape).leaves())


def _retyped(n: Node) -> Node:
    outputs, saved_out = _swap(n.outputs)
    operands, saved_in = _swap(n.operands)
    if not saved_out and not saved_in:
        return n
    return replace(n, outputs=outputs, operands=operands,
                   bytes_written=max(0.0, n.bytes_written - saved_out),
                   bytes_read=max(0.0, n.bytes_read - saved_in))


def _swap(shapes: list[str]) -> tuple[list[str], float]:
    """The shapes with every container leaf re-typed, and the bytes that saves."""
    out, saved = [], 0.0
    for text in shapes:
        if CONTAINER not in text:
            out.append(text)
            continue
        for leaf in parse_shape(text).leaves():
            if leaf.dtype == CONTAINER:
                saved += leaf.num_elements / 2
        out.append(_CONTAINER_ARRAY.sub(f"{E2M1}[", text))
    return out, saved


def _elements(shapes: list[str]) -> int:
    return sum(leaf.num_elements for s in shapes for leaf in parse_shape(s).leaves())
