"""A whole model's step from a few extracted layers: one node per layer and phase.

The largest models (a 1T-parameter GPT has 128 layers) take minutes to compile unrolled,
and their pipelined graphs hold m x layers x ops nodes. Their layers are identical, so
Flint extracts a few (the template: embedding, k >= 2 layers, head, loss, optimizer, on
one pipeline stage's data x tensor-parallel mesh), prices them once, and builds the
model's step at layer granularity for `PipelineParallel`:

- per layer, a forward and a backward node whose time is the template layer's share of the
  one-microbatch timeline (its ops, and the compute-stream waits on its own tensor-parallel
  collectives); the embedding and the head (with the loss) likewise;
- the activation and gradient a layer hands to the next as the node's output (what a
  stage boundary sends; with full recomputation, also what each layer keeps);
- per layer, the once-per-step gradient reduction (the template's R collectives, scaled
  by the layer's share of the parameters) and the parameter casts and optimizer update;
- the arguments (parameters, optimizer state) of every layer, so that memory per stage
  is the model's, and the model flops (for MFU) scaled by the layers' share of the
  template's flops.

The nodes carry times, not flops: HFU and flops per device read 0 on such a graph.

Times come from the cost model of `hardware` and are stored on the nodes (meta
`recorded_s`): the graph is priced for that hardware, which `meta["priced_for"]` says.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

from flint.errors import FlintError
from flint.graph import Node, NodeKind, WorkloadGraph
from flint.passes.expand_loops import ExpandLoops
from flint.passes.pipeline_stages import arguments_by_layer, layer_index, task_of

FIRST, LAST = "embed", "head"


@dataclass(frozen=True)
class LayerTemplate:
    """Contract: input a per-device training-step graph of one microbatch with k >= 2
    identical unrolled layers (labelled `layer_<i>`); output a loop-free graph of the
    same step with `layers` layers, one forward and one backward node per layer (plus
    embedding and head), per-layer R collectives and pre/post work, whose node times are
    the template's on `hardware`. Raises FlintError when the template has no layers."""

    layers: int = 0             # the whole model's layer count (0: the template's own)
    hardware: str = ""
    name: ClassVar[str] = "layer-template"

    def run(self, graph: WorkloadGraph) -> WorkloadGraph:
        from flint.hardware_models.estimate import node_durations
        from flint.hardware_models.schedule import simulate

        flat = ExpandLoops().run(graph)
        tasks = task_of(flat)
        blocks = _blocks(flat, tasks)
        indices = sorted({k[1] for k in blocks if k and isinstance(k[1], int)})
        if len(indices) < 2:
            raise FlintError("a layer template needs at least 2 unrolled layers labelled "
                             "layer_<i> (extract with --unroll and --layers >= 2)")
        if self.layers < 0:
            raise FlintError(f"layer-template: layers must be >= 0, not {self.layers}")
        layers = self.layers or indices[-1] + 1
        flat, durations, model = node_durations(flat, self.hardware or None)
        # The once-per-step reduction runs in its own nodes: leave it out of layer times.
        quiet = [0.0 if t == "R" else d for t, d in zip(tasks, durations)]
        tl = simulate(flat, quiet)
        spent: dict = {}
        last = 0.0
        order = sorted((i for i, s in enumerate(tl.stream) if s == "compute"),
                       key=lambda i: (tl.start[i], i))
        for i in order:
            if tasks[i] in "FB":
                key = blocks[i]
                spent[key] = spent.get(key, 0.0) + quiet[i] + max(tl.start[i] - last, 0.0)
            last = max(last, tl.finish[i])
        once = {t: sum(d for d, tt in zip(durations, tasks) if tt == t) for t in ("pre", "post")}
        layer_f = sum(spent.get(("F", i), 0.0) for i in indices) / len(indices)
        layer_b = sum(spent.get(("B", i), 0.0) for i in indices) / len(indices)
        # Model flops grow with the layers; the embedding's and head's do not.
        work: dict = {}
        for n, key in zip(flat.nodes, blocks):
            if key is not None:
                work[key[1]] = work.get(key[1], 0.0) + n.flops * n.repeat
        per_layer_flops = sum(work.get(i, 0.0) for i in indices) / len(indices)
        total = sum(work.values())
        flops_ratio = ((total + (layers - len(indices)) * per_layer_flops) / total
                       if total else 1.0)
        owned, rest = arguments_by_layer(flat)
        per_layer = sum(owned.values()) / max(len(owned), 1)
        template_params = sum(owned.values()) + rest
        out = _Writer(flat, tasks, blocks, layers, indices).write(
            layer_f, layer_b, spent, once, per_layer / template_params,
            rest / template_params, model.spec.name)
        if "model_flops_per_device" in out.meta:
            out.meta["model_flops_per_device"] *= flops_ratio
        return out


def _blocks(graph: WorkloadGraph, tasks: list[str]) -> list:
    """(F|B, layer index | 'embed' | 'head') per F/B node: labelled nodes by their label,
    unlabelled ones with the block that ran just before them (the backward starts in the
    head, the forward in the embedding)."""
    out: list = [None] * len(graph.nodes)
    current = {"F": FIRST, "B": LAST}
    for n in graph.nodes:
        t = tasks[n.id]
        if t not in "FB":
            continue
        label = n.meta.get("layer")
        li = layer_index(label)
        if li is not None:
            current[t] = li
        elif label in (FIRST, LAST):
            current[t] = label
        out[n.id] = (t, current[t])
    return out


class _Writer:
    def __init__(self, flat, tasks, blocks, layers: int, indices):
        self.g, self.tasks, self.blocks, self.layers = flat, tasks, blocks, layers
        self.a, self.b = indices[0], indices[1]
        self.nodes: list[Node] = []

    def add(self, name, phase, label, seconds, inputs, outputs=(), kind=NodeKind.COMPUTE,
            collective=None) -> int:
        meta = {"layer": label} if phase is None else {"phase": phase, "layer": label}
        if collective is None:
            meta["recorded_s"] = seconds
        self.nodes.append(Node(len(self.nodes), name, kind, "layer" if collective is None
                               else collective.type, "layer" if collective is None
                               else "collective", list(inputs), outputs=list(outputs),
                               collective=collective, meta=meta))
        return len(self.nodes) - 1

    def crossing(self, src_block, dst_block) -> list[str]:
        """Shapes of values block `src_block` makes and `dst_block` reads."""
        out = []
        for n in self.g.nodes:
            if self.blocks[n.id] == dst_block:
                for i in n.inputs:
                    if self.blocks[i] == src_block:
                        out.extend(self.g.nodes[i].outputs)
        return sorted(set(out)) or ["u8[0]"]

    def reductions(self, share: float, inputs: list[int], label: str) -> list[int]:
        """The template's R collectives, scaled to `share` of its parameters."""
        ids = []
        for n in self.g.nodes:
            if self.tasks[n.id] == "R" and n.collective is not None:
                c = n.collective
                scaled = type(c)(c.type, c.communicator, int(c.bytes_in * share),
                                 int(c.bytes_out * share), c.dtype, c.reduction, c.is_async)
                ids.append(self.add(f"{n.name}.{label}", "backward", label, 0.0, inputs,
                                    kind=n.kind, collective=scaled))
        return ids

    def write(self, layer_f, layer_b, spent, once, layer_share, rest_share,
              hardware) -> WorkloadGraph:
        L = self.layers
        act = self.crossing(("F", self.a), ("F", self.b))
        grad = self.crossing(("B", self.b), ("B", self.a))
        # A stage boundary carries the residual stream forward and its gradient backward,
        # tensors of one shape (Megatron's send_forward/send_backward): the shapes both
        # crossings share. Other values one layer reads from the previous (rotary tables,
        # a weight gradient on its way to a reduce-scatter) do not cross stages.
        both = sorted(set(act) & set(grad))
        if both:
            act = grad = both
        names = [f"layer_{j}" for j in range(L)]
        pre = [self.add(f"pre.{n}", None, n, once["pre"] * layer_share, []) for n in names]
        pre_rest = self.add("pre.rest", None, "", once["pre"] * rest_share, [])
        f_embed = self.add("fwd.embed", "forward", FIRST, spent.get(("F", FIRST), 0.0),
                           [pre_rest], act)
        fwd, prev = [], f_embed
        for j, n in enumerate(names):
            prev = self.add(f"fwd.{n}", "forward", n, layer_f, [prev, pre[j]], act)
            fwd.append(prev)
        f_head = self.add("fwd.head", "forward", LAST, spent.get(("F", LAST), 0.0),
                          [prev, pre_rest], ["f32[]"])
        g = self.add("bwd.head", "backward", LAST, spent.get(("B", LAST), 0.0),
                     [f_head], grad)
        reduced = {}
        for j in reversed(range(L)):
            g = self.add(f"bwd.{names[j]}", "backward", names[j], layer_b, [g, fwd[j]], grad)
            reduced[j] = self.reductions(layer_share, [g], names[j]) or [g]
        b_embed = self.add("bwd.embed", "backward", FIRST, spent.get(("B", FIRST), 0.0),
                           [g, f_embed])
        reduced_rest = self.reductions(rest_share, [b_embed], FIRST) or [b_embed]
        for j, n in enumerate(names):
            self.add(f"post.{n}", "optimizer", n, once["post"] * layer_share, reduced[j])
        self.add("post.rest", "optimizer", "", once["post"] * rest_share, reduced_rest)
        meta = dict(self.g.meta, priced_for=hardware,
                    layer_template={"layers": L, "template_layers": self.b + 1})
        meta.update(_arguments(self.g, L, self.a))
        return WorkloadGraph(self.g.cluster, self.nodes, list(self.g.communicators), [], meta)


def _arguments(graph: WorkloadGraph, layers: int, template: int) -> dict:
    """The template's arguments with layer `template`'s repeated for every layer."""
    aliased = set(graph.meta.get("aliased_arguments", ()))
    out, alias = [], []
    for k, (name, nbytes) in enumerate(graph.meta.get("arguments", ())):
        li = layer_index(name)
        if li is None:
            copies = [name]
        elif li == template:
            pattern = re.compile(rf"(?<![0-9]){template}(?![0-9])")
            copies = [pattern.sub(str(j), name, count=1) for j in range(layers)]
        else:
            copies = []
        for c in copies:
            if k in aliased:
                alias.append(len(out))
            out.append([c, nbytes])
    return {"arguments": out, "aliased_arguments": alias}
