"""A whole model's step from a few extracted layers: one node per layer and phase.

The largest models (a 1T-parameter GPT has 128 layers) take minutes to compile unrolled,
and their pipelined graphs hold m x layers x ops nodes. Their layers are identical, so
Flint extracts a few (the template: embedding, k >= 2 layers, head, loss, optimizer, on
one pipeline stage's data x tensor-parallel mesh) and builds the model's step at layer
granularity for `PipelineParallel`:

- per layer, a forward and a backward node standing for the template layer's block (its
  ops, and the compute-stream waits on its own tensor-parallel collectives); the
  embedding and the head (with the loss) likewise;
- the activation and gradient a layer hands to the next as the node's output (what a
  stage boundary sends: `boundary`, or the shapes both crossings of the template share);
- per layer, the once-per-step gradient reduction (the template's R collectives, scaled
  by the layer's share of the parameters) and the parameter casts and optimizer update;
- the arguments (parameters, optimizer state) of every layer, so that memory per stage
  is the model's, the activations each layer's forward keeps for its backward (meta
  `saved_bytes`) and the workspace a block needs while it runs (meta `transient_bytes`),
  both read off the template's buffer liveness; the model flops (for MFU) scaled by the
  layers' share of the template's flops.

The layer nodes hold work, not prices: each is a composite node (meta `composite`: the
template block and a scale) and the template travels in `meta["layer_template"]`, so any
cost model (another spec, what-ifs, a third-party model) prices the blocks afresh
(`hardware_models.composite`). Their flops are in `meta["composite"]["flops"]`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import ClassVar

from flint.errors import FlintError
from flint.graph import Node, NodeKind, WorkloadGraph
from flint.hardware_models.composite import LAYER, interior
from flint.hlo.shapes import shapes_bytes
from flint.passes.expand_loops import ExpandLoops
from flint.passes.layer_blocks import (FIRST, LAST, block_memory, node_blocks,
                                       reductions_by_layer, tagged_template)
from flint.passes.layer_buckets import GradientBuckets
from flint.passes.layer_gathers import (emit_gathers, gather_owners, microbatch_reach,
                                        parameter_gathers, weight_casts)
from flint.passes.pipeline_stages import arguments_by_layer, layer_index, task_of


@dataclass(frozen=True)
class LayerTemplate:
    """Contract: input a per-device training-step graph of one microbatch with k >= 2
    identical unrolled layers (labelled `layer_<i>`); output a loop-free graph of the
    same step with `layers` layers, one composite forward and backward node per layer
    (plus embedding and head), per-layer R collectives and pre/post work; the template
    (its nodes tagged with their block) is kept in meta["layer_template"]["template"].
    `boundary` (a shape, e.g. "bf16[1,4096,8192]"): what a layer hands the next.
    `bucket_bytes`: gradient reductions of consecutive blocks merge into buckets of up to
    that many bytes, each issued when the next block's backward starts. Raises
    FlintError when the template has no layers."""

    layers: int = 0             # the whole model's layer count (0: the template's own)
    boundary: str = ""
    # gradient buckets: consecutive blocks' reductions merge while their bytes stay within
    # this (XLA's combiner threshold, Megatron's or DDP's bucket size); 0: one per block
    bucket_bytes: int = field(default=0, metadata={"unit": "bytes"})
    # False: every bucket is reduced after the whole backward (Megatron-LM 2021's local
    # DDP, DeepSpeed's pipeline engine) instead of while the next blocks' backward runs
    overlap_reduction: bool = True
    # True: the work on a reduced gradient (its cast and scaling) runs with the optimizer
    # step, not in the backward where the reduction ends: Megatron averages gradients in
    # the collective and its optimizer reads them; DDP and FSDP2 finish their buckets at
    # the end of the backward. False (XLA): where the program's schedule put it, on the
    # in-order compute stream, waiting there for the reduction
    defer_reduced_work: bool = False
    # True: FSDP's parameter all-gathers run once per step, each layer's before its first
    # forward and held until the last backward, as FSDP under a pipeline schedule runs
    # (passes.layer_gathers); False: where the program put them, in every micro-batch
    gather_once: bool = False
    # True: a weight's FP8 cast (and the pieces of its scale) runs once per step, with the
    # once-per-step work before the first forward, not in every micro-batch's forward:
    # Transformer Engine casts and transposes a weight in a step's first micro-batch and
    # reuses the copy (its modules' is_first_microbatch, which Megatron-Core's schedules
    # set for micro-batch 0 only: pipeline_parallel/schedules.py forward_step). XLA puts
    # such a cast where its schedule does, before the layers or inside them, so without
    # this the same run pays it once or per micro-batch by accident of the compiler.
    # Known limit: the cast copies' memory is not held for the step (TE keeps them in
    # per-module workspaces); holding a copy per parameter byte put published FP8 runs
    # that ran without recompute (NeMo 24.07 GPT3-20B, 64 H100) over their memory
    cast_once: bool = False
    # True: values a forward computes from parameters alone (FSDP2's gathered weights and
    # their per-parameter copies) are freed after the forward and made again for the
    # backward (reshard_after_forward), not kept: they are no activation of the layer's
    resharded: bool = False
    name: ClassVar[str] = "layer-template"

    def run(self, graph: WorkloadGraph) -> WorkloadGraph:
        flat = ExpandLoops().run(graph)
        tasks = task_of(flat)
        gathers = parameter_gathers(flat, tasks) if self.gather_once else []
        blocks = node_blocks(flat, tasks)
        held = gather_owners(flat, gathers, blocks)
        # once-per-step work: no block waits on the held gathers (the layered graph holds
        # them), and the weight casts are priced with the rest of "pre"
        moved = gathers + (weight_casts(flat, tasks) if self.cast_once else [])
        if moved:
            for i in moved:
                tasks[i] = "pre"
            blocks = node_blocks(flat, tasks)
        indices = sorted({k[1] for k in blocks if k and isinstance(k[1], int)})
        if len(indices) < 2:
            raise FlintError("a layer template needs at least 2 unrolled layers labelled "
                             "layer_<i> (extract with --unroll and --layers >= 2)")
        if self.layers < 0:
            raise FlintError(f"layer-template: layers must be >= 0, not {self.layers}")
        if self.boundary:
            shapes_bytes([self.boundary])       # a bad shape fails here
        layers = self.layers or indices[-1] + 1
        template = tagged_template(flat, tasks, blocks, indices, set(gathers))
        # Model flops grow with the layers; the embedding's and head's do not.
        work: dict = {}
        for n, key in zip(flat.nodes, blocks):
            if key is not None:
                work[key] = work.get(key, 0.0) + n.flops * n.repeat
        total = sum(work.values())
        middle = interior(indices)
        per_layer = {p: sum(work.get((p, i), 0.0) for i in middle) / len(middle) for p in "FB"}
        grown = total + (layers - len(indices)) * (per_layer["F"] + per_layer["B"])
        flops_ratio = grown / total if total else 1.0
        owned, rest = arguments_by_layer(flat)
        template_params = sum(owned.values()) + rest
        layer_share = sum(owned.values()) / max(len(owned), 1) / template_params
        memory = block_memory(flat, tasks, blocks, indices,
                              microbatch_reach(flat) if self.resharded else None)
        out = _Writer(flat, tasks, blocks, layers, indices, template, work, memory,
                      self.boundary, self.bucket_bytes, self.overlap_reduction,
                      self.defer_reduced_work, held).write(layer_share, rest / template_params)
        if "model_flops_per_device" in out.meta:
            out.meta["model_flops_per_device"] *= flops_ratio
        out.check()
        return out


class _Writer:
    def __init__(self, flat, tasks, blocks, layers: int, indices, template, work, memory,
                 boundary: str, bucket_bytes: int, overlap: bool = True,
                 defer_reduced_work: bool = False, held: dict | None = None):
        self.g, self.tasks, self.blocks, self.layers = flat, tasks, blocks, layers
        self.a, self.b = indices[0], indices[1]
        self.indices = indices
        self.template, self.work, self.memory = template, work, memory
        self.boundary, self.bucket_bytes, self.overlap = boundary, bucket_bytes, overlap
        self.defer_reduced_work = defer_reduced_work
        self.held = held or {}          # owner -> the template's gathers held for the step
        self.owned_reductions = reductions_by_layer(flat, tasks, blocks)
        # R blocks with compute of their own (the template's blocks carry their names)
        self.r_blocks = {n.meta["block"] for n in template.nodes
                         if n.meta["block"].startswith("R:") and n.collective is None}
        self.nodes: list[Node] = []

    def owner(self, j: int):
        """The template layer model layer j is: the first and last are the template's
        first and last, the others its interior (LAYER: their mean)."""
        if j == 0:
            return self.indices[0]
        if j == self.layers - 1:
            return self.indices[-1]
        return LAYER

    def gather_owner(self, j: int):
        owner = self.owner(j)
        return interior(self.indices)[0] if owner == LAYER else owner

    def gathers(self, owner, label: str) -> list[int]:
        """The held parameter gathers of template block `owner`, as nodes of the layered
        graph labelled `label` (none unless gather_once)."""
        return emit_gathers(self.nodes, self.held.get(owner, []), label)

    def layer_block(self, phase: str, j: int) -> str:
        return f"{phase}:{self.owner(j)}"

    def flops(self, block: str) -> float:
        phase, _, label = block.partition(":")
        if label == LAYER:
            middle = interior(self.indices)
            return sum(self.work.get((phase, i), 0.0) for i in middle) / len(middle)
        return self.work.get((phase, int(label) if label.isdigit() else label), 0.0)

    def add(self, name, phase, label, block, scale, inputs, outputs=()) -> int:
        meta = {"layer": label} if phase is None else {"phase": phase, "layer": label}
        composite = {"block": block, "scale": scale}
        flops = self.flops(block) * scale if block[:2] in ("F:", "B:") else 0.0
        if flops:
            composite["flops"] = flops
        meta["composite"] = composite
        saved, transient = self.memory.get(block, (0.0, 0.0))
        if saved:
            meta["saved_bytes"] = saved
        if transient:
            meta["transient_bytes"] = transient
        self.nodes.append(Node(len(self.nodes), name, NodeKind.COMPUTE, "layer", "layer",
                               list(inputs), outputs=list(outputs), meta=meta))
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

    def write(self, layer_share, rest_share) -> WorkloadGraph:
        L = self.layers
        if self.boundary:
            act = grad = [self.boundary]
        else:
            act = self.crossing(("F", self.a), ("F", self.b))
            grad = self.crossing(("B", self.b), ("B", self.a))
            # A stage boundary carries the residual stream forward and its gradient
            # backward, tensors of one shape (Megatron's send_forward/send_backward): the
            # shapes both crossings share. Other values one layer reads from the previous
            # (rotary tables, a weight gradient on its way to a reduce-scatter) do not
            # cross stages.
            both = sorted(set(act) & set(grad))
            if both:
                act = grad = both
        names = [f"layer_{j}" for j in range(L)]
        pre = [self.add(f"pre.{n}", None, n, "pre", layer_share, []) for n in names]
        pre_rest = self.add("pre.rest", None, "", "pre", rest_share, [])
        # held gathers come before the first forward: once-per-step work (pre)
        rest = self.gathers(None, "rest")
        g_embed, g_head = rest + self.gathers(FIRST, FIRST), self.gathers(LAST, LAST)
        g_layer = [self.gathers(self.gather_owner(j), n) for j, n in enumerate(names)]
        f_embed = self.add("fwd.embed", "forward", FIRST, f"F:{FIRST}", 1.0,
                           [pre_rest] + g_embed, act)
        fwd, prev = [], f_embed
        for j, n in enumerate(names):
            prev = self.add(f"fwd.{n}", "forward", n, self.layer_block("F", j), 1.0,
                            [prev, pre[j]] + g_layer[j], act)
            fwd.append(prev)
        f_head = self.add("fwd.head", "forward", LAST, f"F:{LAST}", 1.0,
                          [prev, pre_rest] + g_head, ["f32[]"])
        g = self.add("bwd.head", "backward", LAST, f"B:{LAST}", 1.0, [f_head] + g_head, grad)
        buckets = GradientBuckets(self, self.bucket_bytes)
        buckets.add("rest", LAST, g, LAST)
        for j in reversed(range(L)):
            g = self.add(f"bwd.{names[j]}", "backward", names[j], self.layer_block("B", j),
                         1.0, [g, fwd[j]] + g_layer[j], grad)
            buckets.issue()
            owner = self.owner(j)
            buckets.add(j, interior(self.indices)[0] if owner == LAYER else owner, g, names[j])
        b_embed = self.add("bwd.embed", "backward", FIRST, f"B:{FIRST}", 1.0,
                           [g, f_embed] + g_embed)
        if not self.overlap:        # every bucket waits for the end of the backward
            buckets.after = [b_embed]
        buckets.issue()
        buckets.add("rest", FIRST, b_embed, FIRST)
        buckets.add("rest", None, b_embed, "rest")
        buckets.close()
        buckets.issue()
        for j, n in enumerate(names):
            self.add(f"post.{n}", "optimizer", n, "post", layer_share, buckets.done[j])
        self.add("post.rest", "optimizer", "", "post", rest_share, buckets.done["rest"])
        meta = {k: v for k, v in self.g.meta.items() if k not in ("priced_for", "xla_memory")}
        meta["layer_template"] = {"layers": L, "template_layers": self.b + 1,
                                  "template": self.template.to_json()}
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
