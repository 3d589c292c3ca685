"""Anonymize a workload graph for sharing: strip what names the model, keep what it costs.

Names go: node names become `<op>#<id>` (no HLO, FX or trace name has a `#`, so none
can survive by coincidence), loop names `loop<k>`; an `op` that is not an HLO
opcode (a Chakra node's free-text name; aten op names are kept, being a public vocabulary)
becomes the node's `op_class`. Structure stays: kinds, op classes, shapes, flops, bytes,
repeat counts, dependencies, collectives, communicators, loops, the cluster.

Meta is allow-listed (a key not listed is dropped, so a new front end's keys cannot leak).
Node meta kept, each only with a value of the expected type:
  phase (forward|backward|optimizer|unknown), task (pre|F|B|R|post|p2p), device, chunk,
  microbatch, template, async, recorded_s, stream (fsdp-all-gather), fusion_kind,
  kernel_source, kernels, update_element_bytes, aten (an aten op name: a public vocabulary);
  layer, rewritten: `layer_<i>` keeps the layer index (a second label with the same index
  becomes `layer_<i>/<k>`), `optimizer` stays, any other label becomes `scope<k>`; one new
  label per distinct old one, so the groups the pipeline and placement passes form survive;
  iteration, rewritten with the new loop names.
Graph meta kept: model_flops_per_device (MFU), mpmd_devices and pipeline (the schedule and
its report), and the memory analysis' arguments (each renamed to its category,
`parameters` | `optimizer_state` | `inputs` | `other_arguments`, plus `/layer_<i>` when the
old name had a layer index), aliased_arguments, output_bytes, device_arguments,
xla_memory. Gone: op_name, scope, source file:line, wrapped and fused names, custom-call
targets, model, function, module, file, versions, compiler notes, and everything unknown.

Shape perturbation (`perturb` = p > 0): one map of dimension sizes to new sizes, so dims
that were equal stay equal and size 1 stays 1. A collective whose operand and result
differ by its group size g in one dimension (all-gather, reduce-scatter, all-to-all)
links those two sizes; linked sizes form a component with gcd L, and every member s
becomes s / L x c with c = round(L x r), r drawn in [1 - p, 1 + p] from `seed` and the
component, c clamped to L x [1 - p, 1 + p] and moved to the nearest size with L's factors
of two (all of them below 256, at least 256 from there on: a dim keeps its 16-byte
alignment and whole GEMM tiles, which GEMM prices depend on; L itself where no such size
is in range). Each size moves by the same factor c / L as
the sizes linked to it, so gathered sizes stay g times the shard and collective bytes stay
consistent; every dim moves by at most p (not at all where L x p < 1). Then
bytes_read, bytes_in scale by the operands' byte ratio and bytes_written, bytes_out by the
outputs' (set to the new tensor bytes where they were exactly the tensor bytes; a node
listing no operand shapes, a pipeline send, is sized by its inputs' outputs); flops and
transcendentals scale by the work ratio: the product of the dims' ratios over the union
of the node's tensors' dims (each size counted as often as it occurs in the one tensor
where it occurs most). For a dot [b,M,K] x [b,K,N] -> [b,M,N] that union is {b,M,K,N},
exactly its work; for elementwise ops the output, for reductions the input. (It undercounts
only when M = N = K.) Graph-level byte figures (arguments, outputs, xla_memory) scale by
the step's output-byte ratio, model_flops_per_device by its flop ratio.

Estimate bound: the roofline and network times are affine in work and bytes with
non-negative intercepts, and the step time is a max-plus function of node times, so the
step time moves by a factor within [min(1, lo), max(1, hi)], lo and hi the smallest and
largest work, byte and collective-size ratio of any node; a priori within
[(1-p)^k, (1+p)^k] for nodes of at most k perturbed dims. Without perturbation the
estimate is unchanged, to the bit.
"""
from __future__ import annotations

import math
import random
import re
from collections import Counter
from dataclasses import dataclass, replace
from typing import ClassVar

from flint.errors import FlintError
from flint.graph import Collective, Loop, Node, WorkloadGraph
from flint.hardware_models.memory import argument_category
from flint.hlo.shapes import parse_shape, shapes_bytes
from flint.passes.attention import FUSED_ATTENTION_OP
from flint.passes.hlo_cost import is_known
from flint.passes.pipeline_stages import layer_index


def _vocab(*words):
    return lambda v: isinstance(v, str) and v in words


def _int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


NODE_META = {"phase": _vocab("forward", "backward", "optimizer", "unknown"),
             "task": _vocab("pre", "F", "B", "R", "post", "p2p"),
             "device": _int, "chunk": _int, "microbatch": _int, "template": _int,
             "async": lambda v: isinstance(v, bool), "recorded_s": _number,
             "stream": _vocab("fsdp-all-gather"),
             # how the kernel is made (hardware_models/populations.py prices by them)
             "fusion_kind": _vocab("kLoop", "kInput", "kOutput", "kCustom"),
             "kernel_source": _vocab("library", "generated", "eager", "inductor"),
             "kernels": _int, "update_element_bytes": _int,
             "aten": lambda v: isinstance(v, str) and v.startswith("aten::")
             and v[6:].replace("_", "").replace(".", "").isalnum(),
             # a fused attention call's shapes (numbers and flags only): the cost model
             # prices it by them
             "attention": lambda v: isinstance(v, dict) and all(
                 isinstance(x, (int, float, bool)) or x in ("bf16", "f16", "f32", "fp8",
                                                            "flash2", "flash3", "cudnn",
                                                            "native", "unfused")
                 for x in v.values())}


# Op names Flint's own passes give (a public vocabulary, like HLO's and ATen's).
FLINT_OPS = (FUSED_ATTENTION_OP,)


@dataclass(frozen=True)
class Anonymize:
    """Contract: returns a new graph (the input is not modified) with the same nodes,
    dependencies, communicators, loops and cluster, neutral names and allow-listed meta
    (module docstring); with perturb = 0 shapes, flops and bytes are unchanged and so is
    the estimate; with perturb = p every dim moves by at most p, equal dims stay equal,
    and the output is a function of (graph, perturb, seed)."""

    perturb: float = 0.0
    seed: int = 0
    name: ClassVar[str] = "anonymize"

    def __post_init__(self):
        if not 0.0 <= self.perturb < 0.5:   # also rejects NaN
            raise FlintError(f"anonymize: perturb must be a fraction in [0, 0.5), "
                             f"not {self.perturb}")

    def run(self, graph: WorkloadGraph) -> WorkloadGraph:
        loops = {lp.name: f"loop{i}" for i, lp in enumerate(graph.loops)}
        labels = _Labels()
        sizes = _Sizes(graph, self.perturb, self.seed) if self.perturb else None
        nodes = [_node(n, graph, loops, labels, sizes) for n in graph.nodes]
        out = WorkloadGraph(graph.cluster, nodes, list(graph.communicators),
                            [_loop(lp, loops) for lp in graph.loops])
        out.meta = _graph_meta(graph, out)
        return out


def _loop(lp: Loop, loops: dict) -> Loop:
    return replace(lp, name=loops[lp.name],
                   carried=[(list(i), list(p), list(c)) for i, p, c in lp.carried])


def _node(n: Node, graph: WorkloadGraph, loops: dict, labels: "_Labels",
          sizes: "_Sizes | None") -> Node:
    op = (n.op if is_known(n.op) or n.op in FLINT_OPS or n.meta.get("aten") == f"aten::{n.op}"
          else n.op_class)
    meta = {k: v for k, v in n.meta.items() if k in NODE_META and NODE_META[k](v)}
    if n.meta.get("layer"):
        meta["layer"] = labels(str(n.meta["layer"]))
    iteration = _iteration(n.meta.get("iteration"), loops)
    if iteration:
        meta["iteration"] = iteration
    c = n.collective
    new = Node(n.id, f"{op}#{n.id}", n.kind, op, n.op_class, list(n.inputs), list(n.control),
               n.flops, n.transcendentals, n.bytes_read, n.bytes_written, list(n.outputs),
               list(n.operands), n.repeat, replace(c) if c is not None else None, meta)
    if sizes is not None:
        sizes.apply(n, new, graph)
    return new


def _iteration(tag, loops: dict) -> str | None:
    """`while.96:3/while.12:0` -> `loop0:3/loop1:0` (names seen first get numbers first)."""
    if not isinstance(tag, str):
        return None
    parts = []
    for part in tag.split("/"):
        name, sep, it = part.rpartition(":")
        if not sep or not it.isdigit():
            return None
        parts.append(f"{loops.setdefault(name, f'loop{len(loops)}')}:{it}")
    return "/".join(parts)


class _Labels:
    """Old layer label -> neutral label keeping the layer index and the optimizer."""

    def __init__(self):
        self.new: dict[str, str] = {}
        self.per_index: Counter = Counter()
        self.scopes = 0

    def __call__(self, label: str) -> str:
        if label == "optimizer":
            return label
        if label not in self.new:
            li = layer_index(label)
            if li is None:
                self.new[label] = f"scope{self.scopes}"
                self.scopes += 1
            else:
                k = self.per_index[li]
                self.new[label] = f"layer_{li}" + (f"/{k}" if k else "")
                self.per_index[li] += 1
        return self.new[label]


def _graph_meta(old: WorkloadGraph, new: WorkloadGraph) -> dict:
    m = old.meta
    ratio_bytes = _ratio(sum(shapes_bytes(n.outputs) * n.repeat for n in new.nodes),
                         sum(shapes_bytes(n.outputs) * n.repeat for n in old.nodes))
    out: dict = {}
    if _number(m.get("model_flops_per_device")):
        out["model_flops_per_device"] = m["model_flops_per_device"] * _ratio(
            new.total_flops(), old.total_flops())
    if _int(m.get("mpmd_devices")):
        out["mpmd_devices"] = m["mpmd_devices"]
    if isinstance(m.get("pipeline"), dict):   # Flint's own schedule report: numbers, words
        out["pipeline"] = {k: v for k, v in m["pipeline"].items() if _number(v) or
                           _vocab("gpipe", "1f1b", "interleaved", "layers", "time",
                                  "placement")(v)}
    if isinstance(m.get("arguments"), list):
        out["arguments"] = [[_argument(a[0]), _scale(a[1], ratio_bytes)]
                            for a in m["arguments"]
                            if isinstance(a, list) and len(a) == 2 and _number(a[1])]
    if isinstance(m.get("aliased_arguments"), list):
        out["aliased_arguments"] = [i for i in m["aliased_arguments"] if _int(i)]
    if _number(m.get("output_bytes")):
        out["output_bytes"] = _scale(m["output_bytes"], ratio_bytes)
    if isinstance(m.get("device_arguments"), list):
        out["device_arguments"] = [_scale(v, ratio_bytes) for v in m["device_arguments"]
                                   if _number(v)]
    if isinstance(m.get("xla_memory"), dict):
        out["xla_memory"] = {k: _scale(v, ratio_bytes) for k, v in m["xla_memory"].items()
                             if _number(v)}
    return out


def _argument(name) -> str:
    li = layer_index(name)
    return argument_category(str(name)) + (f"/layer_{li}" if li is not None else "")


def _ratio(new: float, old: float) -> float:
    return new / old if old else 1.0


def _scale(value, ratio: float):
    return value if ratio == 1.0 else type(value)(round(value * ratio))


_ARRAY = re.compile(r"([a-z][a-z0-9]*)\[([^\]]*)\]")


# A perturbed size keeps the factors of two of the size it replaces up to this one: its
# 16-byte alignment (a GEMM on a TMA GPU keeps its alignment share,
# hardware_models.kernels.alignment_share) and, for sizes in whole GEMM tiles (128 and 256
# rows, kernels.TILES), whole tiles, so the GEMM's price moves with its work.
KEPT_POWER_OF_TWO = 256


def _aligned_like(unit: int, want: int, lo: int, hi: int) -> int:
    """The size in [lo, hi] nearest `want` whose factors of two match `unit`'s (all of
    them below KEPT_POWER_OF_TWO, at least that many from there on), or `unit` itself when
    none is."""
    a = math.gcd(unit, KEPT_POWER_OF_TWO)

    def same_class(c: int) -> bool:
        return c % a == 0 and (a == KEPT_POWER_OF_TWO or (c // a) % 2 == 1)

    for c in sorted(range(lo, hi + 1), key=lambda c: (abs(c - want), c)):
        if same_class(c):
            return c
    return unit


class _Sizes:
    """The one map of dimension sizes to perturbed sizes (module docstring)."""

    def __init__(self, graph: WorkloadGraph, perturb: float, seed: int):
        parent: dict[int, int] = {}

        def find(x: int) -> int:
            while parent.setdefault(x, x) != x:
                x = parent[x]
            return x

        for n in graph.nodes:
            for s in n.outputs + n.operands:
                for leaf in parse_shape(s).leaves():
                    for d in leaf.dims:
                        if d > 1:
                            find(d)
        for n in graph.collectives():   # a gathered / scattered dim: shard x group size
            g = graph.communicator(n).size
            ins, outs = _leaves(n.operands), _leaves(n.outputs)
            for a, b in zip(ins, outs) if len(ins) == len(outs) and g > 1 else ():
                for x, y in zip(a.dims, b.dims) if len(a.dims) == len(b.dims) else ():
                    if min(x, y) > 1 and max(x, y) == g * min(x, y):
                        parent[find(x)] = find(y)
        members: dict[int, list[int]] = {}
        for d in parent:
            members.setdefault(find(d), []).append(d)
        self.new: dict[int, int] = {}
        for group in members.values():
            unit = math.gcd(*group)
            r = random.Random(f"{seed}:{min(group)}").uniform(1 - perturb, 1 + perturb)
            lo = math.ceil(unit * (1 - perturb) - 1e-9)
            hi = math.floor(unit * (1 + perturb) + 1e-9)
            c = _aligned_like(unit, min(max(round(unit * r), lo), hi), lo, hi)
            for d in group:
                self.new[d] = d // unit * c

    def shape(self, text: str) -> str:
        def dims(m):
            toks = [t.strip() for t in m.group(2).split(",")] if m.group(2) else []
            return f"{m.group(1)}[{','.join(self._dim(t) for t in toks)}]"

        return _ARRAY.sub(dims, text)

    def _dim(self, tok: str) -> str:
        number = tok.lstrip("<=?")   # a dynamic dim's bound, as parse_shape reads it
        return tok[: len(tok) - len(number)] + str(self.new.get(int(number), int(number)))

    def work_ratio(self, shapes: list[str]) -> float:
        most: Counter = Counter()
        for leaf in _leaves(shapes):
            for d, k in Counter(leaf.dims).items():
                most[d] = max(most[d], k)
        return math.prod((self.new.get(d, d) / d) ** k for d, k in most.items() if d > 1)

    def apply(self, old: Node, new: Node, graph: WorkloadGraph) -> None:
        new.outputs = [self.shape(s) for s in old.outputs]
        new.operands = [self.shape(s) for s in old.operands]
        ins = old.operands or [s for i in old.inputs for s in graph.nodes[i].outputs]
        new_ins = [self.shape(s) for s in ins]
        work = self.work_ratio(ins + old.outputs)
        new.flops, new.transcendentals = old.flops * work, old.transcendentals * work
        new.bytes_read = _resized(old.bytes_read, ins, new_ins)
        new.bytes_written = _resized(old.bytes_written, old.outputs, new.outputs)
        c: Collective | None = new.collective
        if c is not None:
            c.bytes_in = round(_resized(c.bytes_in, ins, new_ins))
            c.bytes_out = round(_resized(c.bytes_out, old.outputs, new.outputs))


def _leaves(shapes: list[str]):
    return [leaf for s in shapes for leaf in parse_shape(s).leaves()]


def _resized(value: float, old_shapes: list[str], new_shapes: list[str]) -> float:
    """The new tensor bytes where `value` was the old ones, else `value` scaled alike."""
    old = shapes_bytes(old_shapes)
    if not old:
        return value
    new = shapes_bytes(new_shapes)
    return float(new) if value == old else value * new / old
