"""Name the kernels of XLA command buffers by the graph's nodes.

Inside a command buffer (a CUDA graph) a JAX profile tags every kernel with the command
buffer, not its HLO op (flint.validate.jax_profiler). The kernels still run in the order
of the buffer's instructions, which is the module's schedule, the graph's node order:
- a kernel XLA emitted carries its fusion's name ('.' -> '_'), or the name of the first of
  several identical fusions that share one kernel (`deduplicated_name`, node meta
  `kernel_name`): it is the first node so named at or after the current position;
- a library kernel (cuBLAS, cuDNN) carries the library's name: it is the next library
  call of its kind (GEMM, attention) after the current position. A run of cuDNN kernels
  is one attention call (its backward is several kernels), and cuBLAS's split-K reduction
  belongs to the GEMM before it;
- copies and memsets the command buffer records (a loop's carried buffers) have no node.
Within a loop body the position wraps to the body's first node when the body ends, as the
next iteration starts there. Kernels that find no node keep their own name and are
reported as not joined.
"""
from __future__ import annotations

import bisect

from flint.graph import WorkloadGraph
from flint.validate.measured import MeasuredTrace

LIBRARY_KINDS = (("attention", ("cudnn", "fmha", "sdpa", "flash")),
                 ("gemm", ("nvjet", "gemm", "xmma", "cutlass", "cublas", "splitk")))


def library_kind(kernel: str) -> str | None:
    low = kernel.lower()
    for kind, marks in LIBRARY_KINDS:
        if any(m in low for m in marks):
            return kind
    return None


def _kernel_names(node) -> set[str]:
    names = {node.name, node.meta.get("wrapped_name", node.name),
             node.meta.get("kernel_name", node.name)}
    return {n.replace(".", "_").replace("-", "_") for n in names}


def _library_node_kind(node) -> str | None:
    if node.op != "custom-call" and not node.meta.get("wrapped_name", "").startswith(
            ("custom-call", "cublas", "__cudnn")):
        return None
    return "attention" if node.op_class == "attention" else (
        "gemm" if node.op_class == "gemm" else None)


class _Cursor:
    """Candidates are searched from the position after the last joined node; inside a
    loop body the search wraps to the body's first node."""

    def __init__(self, graph: WorkloadGraph):
        self.n = len(graph.nodes)
        self.body = {}
        for loop in graph.loops:              # innermost loop wins: later loops nest deeper
            for i in range(loop.first, loop.last + 1):
                self.body[i] = (loop.first, loop.last)
        self.pos = -1

    def find(self, candidates: list[int]) -> int | None:
        """The first of `candidates` (sorted node indices) in search order."""
        start = self.pos + 1
        spans = [(start, self.n - 1)]
        if self.pos >= 0 and self.pos in self.body:
            lo, hi = self.body[self.pos]
            spans = [(start, hi), (lo, self.pos), (hi + 1, self.n - 1)]
        for a, b in spans:
            j = bisect.bisect_left(candidates, a)
            if j < len(candidates) and candidates[j] <= b:
                self.pos = candidates[j]
                return self.pos
        return None


def name_command_buffer_kernels(trace: MeasuredTrace, graph: WorkloadGraph) -> None:
    """Fill each step's per-op times from its command-buffer kernels (in place)."""
    named: dict[str, set[int]] = {}
    for i, node in enumerate(graph.nodes):
        for key in _kernel_names(node):
            named.setdefault(key, set()).add(i)
    by_name = {key: sorted(ids) for key, ids in named.items()}
    by_kind = {kind: [i for i, n in enumerate(graph.nodes) if _library_node_kind(n) == kind]
               for kind, _ in LIBRARY_KINDS}
    for step in trace.steps:
        for device, seq in step.kernels.items():
            ops = step.ops.setdefault(device, {})
            cursor, last = _Cursor(graph), None     # last: (node index, library kind)
            for kernel, seconds in seq:
                ids = by_name.get(kernel.replace(".", "_"))
                kind = None if ids else library_kind(kernel)
                if ids:
                    i = cursor.find(ids)
                elif kind and last and last[1] == kind and (
                        kind == "attention" or "reduce" in kernel.lower()):
                    i = last[0]
                elif kind:
                    i = cursor.find(by_kind[kind])
                else:
                    i = None
                if i is None:
                    ops[kernel] = ops.get(kernel, 0.0) + seconds
                    last = None
                    continue
                name = graph.nodes[i].name
                ops[name] = ops.get(name, 0.0) + seconds
                last = (i, kind) if kind else None
