"""Gradient accumulation as the framework does it: the per-micro-batch pass that adds a
block's fresh weight gradients into the step's gradient buffer.

A step of m micro-batches sums m gradients. Where that sum is made decides what it costs:

- `in-gemm`: inside the weight-gradient GEMM, which accumulates into the buffer (cuBLAS
  beta = 1): Megatron's gradient-accumulation fusion (`--gradient-accumulation-fusion`,
  on by default in Megatron-Core: wgrad GEMMs write into the fp32 `main_grad`), and XLA,
  whose GemmRewriter folds `add(dot, accumulator)` into the GEMM's output. No kernel of
  its own: this pass adds nothing.
- `autograd`: PyTorch's AccumulateGrad adds each new gradient into `.grad` in place, in
  the gradient's dtype (`dtype`; bf16/fp16: read 2 + 2, write 2 bytes per parameter; f32,
  the weights of a torch.autocast step: 4 + 4, 4): DeepSpeed's fp16 engine, InternEvo,
  PyTorch DDP and FSDP2 (FSDP2 adds each reduce-scattered shard into the sharded `.grad`:
  the step's parameter arguments are already this rank's shard).
- `fp32-copy`: DeepSpeed's BF16_Optimizer (written for BLOOM, 2022) casts every bf16
  gradient to fp32 and adds it to an fp32 gradient after each micro-batch's backward
  (deepspeed/runtime/bf16_optimizer.py `update_hp_grads`: `hp.grad.add_(lp.grad.to(fp32))`,
  called per micro-batch by the pipeline engine's `_exec_backward_pass`; "we copy/accumulate
  to the high-precision grads now to prevent accumulating in the bf16 grads"): a cast
  (read 2, write 4 bytes) and an add (read 4 + 4, write 4) per parameter.

FSDP2 with its gradient sync off (`unsharded`: the micro-batches but the last under
torch.distributed.pipelining) adds into each parameter's unsharded gradient instead, in
its reduce dtype: bf16 gradients into an fp32 sum (read 2 + 4, write 4 bytes per element of
the whole, unsharded parameter; FSDPParam.accumulate_unsharded_grad_if_needed), a sum held
from the block's first backward to the last one's reduce-scatter: one argument per block
(`<block>.grad_accumulator`, flint.hardware_models.memory's "gradients").

The first micro-batch has nothing to add to (AccumulateGrad assigns its gradient, the
BF16_Optimizer casts it alone), so each micro-batch's copy of an add is priced at
(m - 1) / m of its bytes: the step's total is exact. A gradient buffer sharded over the
data-parallel ranks (ZeRO-2, reduced every micro-batch) accumulates only its shard.

Each block's accumulation is per-micro-batch backward work (the pipeline pass repeats it),
runs on the compute stream after the block's backward, and is what the block's gradient
reduction and the optimizer read. Its kernels are PyTorch eager ones (one per parameter
tensor), priced by their bytes like any other node.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from flint.errors import FlintError
from flint.graph import Node, NodeKind, WorkloadGraph
from flint.hardware_models.memory import argument_category
from flint.hlo.shapes import DTYPE_BITS, parse_shape
from flint.passes.pipeline_stages import layer_index

MODES = ("in-gemm", "autograd", "fp32-copy")
# bytes per parameter of each kernel a mode runs per micro-batch: (name, in dtype, out dtype)
_KERNELS = {"autograd": (("accumulate", "bf16", "bf16"),),
            "fp32-copy": (("to_fp32", "bf16", "f32"), ("accumulate", "f32", "f32"))}
_HEAD_NAMES = ("head", "unembed", "lm_head", "final_norm", "output")


@dataclass(frozen=True)
class GradAccumulation:
    """Contract: input a layer-templated step (passes.layer_template: one backward node
    per block, the template's argument shapes in meta `arguments_sharding`); output the
    same step with, after each block's backward, the kernels that add the block's
    gradients into the step's buffer (`mode`), read by whatever read the block's gradients
    (its reduction, the optimizer). `tied_copy`: the head's stage holds its own copy of a
    tied embedding and accumulates its gradient too (DeepSpeed's TiedLayerSpec with the
    embedding and the head on different pipeline stages). Raises FlintError on an unknown
    mode or a graph without a layer template."""

    mode: str = "in-gemm"
    microbatches: int = 1       # of the step (the pipeline's depth)
    tied_copy: bool = False
    shards: int = 1             # ranks a (ZeRO-2) gradient buffer is sharded over
    # FSDP2 without gradient sync: the FSDP degree the parameter arguments are sharded over,
    # the gradients it sums are whole (bf16 into an fp32 sum held for the step); 1: none
    unsharded: int = 1
    # autograd: the gradients' dtype, the parameters' own (AccumulateGrad adds in it):
    # bf16/fp16 weights under DeepSpeed's fp16 engine and InternEvo, f32 weights under
    # torch.autocast (the torch frameworks' twin)
    dtype: str = "bf16"
    name: ClassVar[str] = "grad-accumulation"

    def __post_init__(self):
        if self.mode not in MODES:
            raise FlintError(f"unknown gradient accumulation {self.mode!r}; use "
                             f"{' | '.join(MODES)}")
        if self.microbatches < 1 or self.shards < 1 or self.unsharded < 1:
            raise FlintError("grad-accumulation: microbatches, shards and unsharded must be "
                             ">= 1")
        if self.unsharded > 1 and (self.mode != "autograd" or self.shards > 1):
            raise FlintError("grad-accumulation: unsharded (FSDP2's sum of whole gradients) "
                             "is autograd accumulation of unsharded parameters")
        if self.dtype not in ("bf16", "f16", "f32"):
            raise FlintError(f"grad-accumulation: dtype {self.dtype!r} is not bf16, f16 or f32")

    def run(self, graph: WorkloadGraph) -> WorkloadGraph:
        steady = (self.microbatches - 1) / self.microbatches   # adds per micro-batch
        kernels = [(k, src, dst, steady if k == "accumulate" else 1.0)
                   for k, src, dst in _KERNELS.get(self.mode, ())]
        if self.unsharded > 1:      # FSDP2: the bf16 gradient into the fp32 unsharded sum
            kernels = [(k, "bf16", "f32", share) for k, _, _, share in kernels]
        elif self.mode == "autograd":           # AccumulateGrad adds in the gradients' dtype
            kernels = [(k, self.dtype, self.dtype, share) for k, _, _, share in kernels]
        kernels = [k for k in kernels if k[3] > 0]
        if not kernels:
            return graph
        if graph.meta.get("layer_template") is None:
            raise FlintError(f"gradient accumulation {self.mode!r} needs a layer-templated "
                             f"step (a model with more than one layer)")
        counts = _parameters_by_block(graph.meta.get("arguments_sharding") or ())
        if counts is None:      # a torch capture lists names and bytes: its weights' dtype
            counts = _parameters_by_block([(name, None, nbytes) for name, nbytes in
                                           graph.meta.get("arguments") or ()], self.dtype)
        if counts is None:
            raise FlintError("gradient accumulation needs the program's parameter "
                             "arguments (meta arguments_sharding or arguments), which this "
                             "graph lacks")
        per_layer, embed, head = counts
        if self.tied_copy:
            head = (head[0] + embed[0], head[1] + embed[1])
        nodes: list[Node] = []
        new_id: dict[int, int] = {}
        accumulated: dict[int, int] = {}      # a block's backward -> its last kernel
        sums: list = []                       # FSDP2's unsharded fp32 sums, per block
        for n in graph.nodes:
            copy = _copy(n, len(nodes), new_id, accumulated)
            nodes.append(copy)
            new_id[n.id] = copy.id
            label = n.meta.get("layer")
            if not _is_block_backward(n):
                continue
            elems, tensors = (embed if label == "embed" else head if label == "head"
                              else per_layer)
            elems = elems / self.shards * self.unsharded
            if elems <= 0:
                continue
            if self.unsharded > 1:
                sums.append([f"{label}.grad_accumulator", elems * _bytes("f32")])
            last = copy.id
            for kernel, src, dst, share in kernels:
                # an add reads the new gradient and the sum; a cast its input
                operands = [src, dst] if kernel == "accumulate" else [src]
                nodes.append(Node(len(nodes), f"grad_acc.{kernel}.{label}",
                                  NodeKind.COMPUTE, "add" if kernel == "accumulate"
                                  else "convert", "elementwise", [last],
                                  bytes_read=elems * share * sum(map(_bytes, operands)),
                                  bytes_written=elems * share * _bytes(dst),
                                  outputs=[f"{dst}[{int(elems)}]"],
                                  operands=[f"{d}[{int(elems)}]" for d in operands],
                                  meta={"phase": "backward", "layer": label,
                                        "kernel_source": "eager", "kernels": tensors,
                                        "grad_accumulation": self.mode}))
                last = len(nodes) - 1
            accumulated[new_id[n.id]] = last
        meta = dict(graph.meta, grad_accumulation=self.mode)
        if sums:
            meta["arguments"] = [list(a) for a in graph.meta.get("arguments") or ()] + sums
        out = WorkloadGraph(graph.cluster, nodes, list(graph.communicators),
                            list(graph.loops), meta)
        out.check()
        return out


def _is_block_backward(n: Node) -> bool:
    return (n.meta.get("phase") == "backward" and n.collective is None
            and n.name.startswith("bwd.") and "composite" in n.meta)


def _copy(n: Node, i: int, new_id: dict, accumulated: dict) -> Node:
    """Node n renumbered to i; a reader of a block's gradients other than the backward
    chain itself (a reduction, the optimizer) waits for them to be accumulated. A control
    edge, not a data edge: the buffer stays where it is (a reader on another pipeline
    stage, such as a tied embedding's reduction, is not sent the whole buffer)."""
    inputs = [new_id[j] for j in n.inputs]
    control = {new_id[j] for j in n.control}
    if not _is_block_backward(n):
        control |= {accumulated[k] for k in inputs if k in accumulated}
    return replace(n, id=i, inputs=inputs, control=sorted(control))


def _bytes(dtype: str) -> int:
    return DTYPE_BITS[dtype] // 8


def _parameters_by_block(sharding, dtype: str | None = None) -> tuple | None:
    """(elements, tensors) of one layer's parameters on this device, of the embedding's,
    of the head's, from the template's argument shapes (an entry without a shape holds
    `dtype` elements); None without parameter arguments."""
    layers: dict[int, list] = {}
    embed, head = [0, 0], [0, 0]
    seen = False
    for entry in sharding:
        name, shape, nbytes = entry[0], entry[1], entry[-1]
        if argument_category(str(name)) != "parameters":
            continue
        seen = True
        try:
            elems = nbytes * 8 / DTYPE_BITS[parse_shape(shape).dtype if shape else dtype]
        except Exception:  # noqa: BLE001 - an odd shape: count it at 4 bytes per element
            elems = nbytes / 4
        li = layer_index(name)
        if li is not None:
            acc = layers.setdefault(li, [0, 0])
        elif any(h in str(name).lower() for h in _HEAD_NAMES):
            acc = head
        else:
            acc = embed
        acc[0] += elems
        acc[1] += 1
    if not seen:
        return None
    if layers:
        one = max(layers.values())          # the template's layers are alike
        per_layer = (one[0], one[1])
    else:
        per_layer = (0, 0)
    return per_layer, tuple(embed), tuple(head)
