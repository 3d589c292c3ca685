"""Flops, transcendentals and memory bytes of one HLO instruction.

Flop conventions follow XLA's HloCostAnalysis (xla/service/hlo_cost_analysis.cc) so totals
agree with `compiled.cost_analysis()`: one flop per element of elementwise ops, converts,
compares and selects; transcendental ops counted apart; 2 flops per multiply-add in dots and
convolutions; reductions cost (inputs - outputs) applications of the reducer; fusions cost
the sum of what they fuse. Bytes model what a fused kernel really touches: a parameter that
is only sliced reads the slice, an in-place dynamic-update-slice writes only the update.
A dynamic-update-slice fusion is in place unless XLA cannot emit it so (its updated buffer
is computed inside the fusion) or its buffer assignment says otherwise (the module's
`copied_updates`, hlo/buffer_assignment.py); then it reads and writes the whole buffer.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from flint.graph import OpClass
from flint.hlo.buffer_assignment import update_roots, updated_parameters
from flint.hlo.module import HloComputation, HloInstruction, HloModule
from flint.hlo.shapes import Shape
from flint.passes.conv_flops import conv_flops_of

TRANSCENDENTAL = frozenset({
    "exponential", "exponential-minus-one", "log", "log-plus-one", "logistic", "power",
    "sqrt", "cbrt", "rsqrt", "tanh", "sine", "cosine", "tan", "atan2", "erf",
})
ELEMENTWISE = frozenset({
    "abs", "add", "and", "ceil", "clamp", "compare", "complex", "convert", "count-leading-zeros",
    "divide", "floor", "imag", "is-finite", "maximum", "minimum", "multiply", "negate", "not",
    "or", "popcnt", "real", "reduce-precision", "remainder", "round-nearest-afz",
    "round-nearest-even", "select", "shift-left", "shift-right-arithmetic",
    "shift-right-logical", "sign", "subtract", "xor", "stochastic-convert",
}) | TRANSCENDENTAL
DATA_MOVEMENT = frozenset({
    "broadcast", "concatenate", "copy", "dynamic-slice", "dynamic-update-slice", "gather",
    "iota", "pad", "reshape", "reverse", "slice", "transpose", "copy-start",
})
# Ops that only name or regroup values: they never become graph nodes.
ALIASES = frozenset({
    "bitcast", "get-tuple-element", "tuple", "parameter", "constant", "after-all",
    "add-dependency", "opt-barrier", "domain", "partition-id", "replica-id",
    "bitcast-convert", "get-dimension-size", "set-dimension-size", "copy-done",
    "async-update", "optimization-barrier",
})
COLLECTIVES = frozenset({
    "all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute",
    "collective-broadcast", "ragged-all-to-all",
})
OTHER_KNOWN = frozenset({
    "dot", "convolution", "reduce", "reduce-window", "scatter", "sort", "map", "fusion",
    "select-and-scatter", "custom-call", "rng", "rng-bit-generator", "rng-get-and-update-state",
    "triangular-solve", "cholesky", "fft", "batch-norm-training", "batch-norm-inference",
    "batch-norm-grad", "top-k", "dynamic-reshape", "infeed", "outfeed", "send", "recv",
    "cudnn-norm", "while", "call", "conditional", "async-start", "async-done",
})
GEMM_TARGETS = ("__cublas$gemm", "__cublas$lt$matmul", "__onednn$matmul", "__cublas$lt$matmul$f8")
ATTENTION_TARGETS = ("__cudnn$fmha", "__cudnn$fhma")
# Custom-calls that only reserve or annotate memory (TPU's compiler): no work, no traffic.
NO_WORK_TARGETS = ("AllocateBuffer", "AssumeGatherIndicesInBound")
CONV_TARGETS = ("__cudnn$conv",)


@dataclass
class Cost:
    flops: float = 0.0
    transcendentals: float = 0.0
    bytes_read: float = 0.0
    bytes_written: float = 0.0
    op_class: str = OpClass.ELEMENTWISE
    unknown: bool = False


def base_opcode(opcode: str) -> str:
    """`all-gather-start` -> `all-gather` (the async halves of a collective)."""
    return opcode[: -len("-start")] if opcode.endswith("-start") and opcode != "copy-start" else opcode


def is_known(opcode: str) -> bool:
    opcode = base_opcode(opcode)
    return (opcode in ELEMENTWISE or opcode in DATA_MOVEMENT or opcode in ALIASES
            or opcode in COLLECTIVES or opcode in OTHER_KNOWN)


class CostRules:
    """Per-instruction costs for one module (caches per-computation flop totals)."""

    def __init__(self, module: HloModule):
        self.module = module
        self._comp_flops: dict[tuple[str, bool], tuple[float, float, str]] = {}
        self._in_place: dict[str, bool] = {}    # by fusion name: flops, bytes, class ask

    def in_place(self, ins: HloInstruction) -> bool:
        """Whether a fusion rooted in dynamic-update-slices writes only its updates (True
        for every other instruction: nothing to decide)."""
        if ins.opcode != "fusion" or not ins.called("calls"):
            return True
        hit = self._in_place.get(ins.name)
        if hit is None:
            fused = self.module.computations.get(ins.called("calls")[0])
            hit = (fused is None or not update_roots(fused)
                   or (updated_parameters(fused) is not None
                       and ins.name not in self.module.copied_updates))
            self._in_place[ins.name] = hit
        return hit

    # --- flops ---------------------------------------------------------------------
    def flops(self, ins: HloInstruction, comp: HloComputation) -> tuple[float, float]:
        op = base_opcode(ins.opcode)
        out = _first_leaf(ins.shape)
        if op in ELEMENTWISE:
            n = out.num_elements
            return (0.0, float(n)) if op in TRANSCENDENTAL else (float(n), 0.0)
        if op == "dot":
            lhs = _shape_of(comp, ins.operands[0])
            k = math.prod(lhs.dims[d] for d in ins.int_list("lhs_contracting_dims"))
            return 2.0 * out.num_elements * k, 0.0
        if op == "convolution":
            return self._conv_flops(ins, comp), 0.0
        if op in ("reduce", "all-reduce", "scatter", "map", "reduce-window",
                  "select-and-scatter"):
            return self._apply_flops(ins, comp, op)
        if op == "fusion":
            f, t, _ = self.computation_flops(ins.called("calls")[0], self.in_place(ins))
            return f, t
        if op == "custom-call":
            return self._custom_call_flops(ins, comp), 0.0
        if op == "sort":
            n = _first_leaf(_shape_of(comp, ins.operands[0])).num_elements
            return float(n * math.ceil(math.log2(max(n, 1)))), 0.0
        if op in ("rng", "rng-bit-generator"):
            return 0.0, float(sum(s.num_elements for s in ins.shape.leaves()))
        if not is_known(op):
            return float(out.num_elements), 0.0
        return 0.0, 0.0

    def _apply_flops(self, ins, comp, op: str) -> tuple[float, float]:
        reducer = ins.called("to_apply")
        per, trans, _ = self.computation_flops(reducer[0]) if reducer else (1.0, 0.0, "")
        out = _first_leaf(ins.shape)
        if op == "reduce":
            n_in = _first_leaf(_shape_of(comp, ins.operands[0])).num_elements
            count = n_in - out.num_elements
        elif op == "reduce-window":
            window = _window_size(ins.attr("window"))
            count = out.num_elements * max(window - 1, 0)
        elif op == "scatter":
            count = _first_leaf(_shape_of(comp, ins.operands[-1])).num_elements
        elif op == "select-and-scatter":
            count = _first_leaf(_shape_of(comp, ins.operands[0])).num_elements
        else:  # all-reduce and map: one application per output element
            count = sum(s.num_elements for s in ins.shape.leaves())
        return float(count * per), float(count * trans)

    def _conv_flops(self, ins, comp) -> float:
        lhs = _first_leaf(_shape_of(comp, ins.operands[0]))
        return conv_flops_of(ins, lhs, _first_leaf(ins.shape))

    def _custom_call_flops(self, ins, comp) -> float:
        target = (ins.attr("custom_call_target") or "").strip('"')
        if target.startswith(GEMM_TARGETS):
            dims = ins.backend_config.get("gemm_backend_config", {}).get("dot_dimension_numbers", {})
            lhs = _shape_of(comp, ins.operands[0])
            k = math.prod(lhs.dims[int(d)] for d in dims.get("lhs_contracting_dimensions", []))
            return 2.0 * _first_leaf(ins.shape).num_elements * k
        if target.startswith(ATTENTION_TARGETS):
            return attention_flops(ins, comp)
        if target.startswith(CONV_TARGETS):
            return self._conv_flops(ins, comp)
        return 0.0

    def computation_flops(self, name: str, in_place: bool = True) -> tuple[float, float, str]:
        """Total (flops, transcendentals, op_class) of a fused/applied computation; for a
        dynamic-update-slice fusion run in place, its update's share only."""
        hit = self._comp_flops.get((name, in_place))
        if hit is not None:
            return hit
        comp = self.module.computations[name]
        flops = trans = 0.0
        classes = set()
        scales = _in_place_update_scale(comp) if in_place else {}
        for ins in comp.instructions:
            f, t = self.flops(ins, comp)
            scale = scales.get(ins.name, 1.0)
            flops += f * scale
            trans += t * scale
            classes.add(_leaf_class(ins))
        for cls in (OpClass.GEMM, OpClass.CONV, OpClass.ATTENTION, OpClass.REDUCTION):
            if cls in classes:
                break
        else:
            cls = OpClass.ELEMENTWISE if (flops or trans) else OpClass.DATA_MOVEMENT
        self._comp_flops[(name, in_place)] = (flops, trans, cls)
        return flops, trans, cls

    # --- bytes ---------------------------------------------------------------------
    def bytes(self, ins: HloInstruction, comp: HloComputation) -> tuple[float, float]:
        op = ins.opcode
        operands = [_shape_of(comp, o) for o in ins.operands]
        written = _output_bytes(ins)
        if op in ("dynamic-slice", "slice", "gather"):
            return float(written), float(written)
        if op == "dynamic-update-slice":  # in place: only the update moves
            return float(operands[1].nbytes), float(operands[1].nbytes)
        if op == "fusion":
            fused = self.module.computations[ins.called("calls")[0]]
            comps = self.module.computations
            in_place = self.in_place(ins)
            read = sum(_param_read_bytes(fused, i, s, comps, in_place)
                       for i, s in enumerate(operands))
            return float(read), float(_fusion_written_bytes(fused, written) if in_place
                                      else written)
        return float(sum(s.nbytes for s in operands)), float(written)

    def op_class(self, ins: HloInstruction) -> str:
        if ins.opcode == "fusion":
            return self.computation_flops(ins.called("calls")[0], self.in_place(ins))[2]
        return _leaf_class(ins)


def cudnn_attention_meta(ins: HloInstruction, comp: HloComputation) -> dict | None:
    """The shapes of a cuDNN fused-attention call, as the attention kernel model reads them
    (hardware_models.attention_kernels): Q[B,S,H,D], K[B,T,Hkv,D], the mask and direction."""
    q = _shape_of(comp, ins.operands[0]) if ins.operands else None
    k = _shape_of(comp, ins.operands[1]) if len(ins.operands) > 1 else None
    if q is None or k is None or len(q.dims) != 4 or len(k.dims) != 4:
        return None
    b, s, h, d = q.dims
    cfg = ins.backend_config.get("cudnn_fmha_backend_config", {})
    target = ins.attr("custom_call_target") or ""
    return {"batch": b, "heads": h, "kv_heads": k.dims[2], "seq_q": s, "seq_kv": k.dims[1],
            "head_dim": d, "causal": "CAUSAL" in str(cfg.get("mask_type", "")).upper(),
            "backward": "backward" in target.lower(), "dtype": q.dtype, "impl": "cudnn"}


def attention_flops(ins: HloInstruction, comp: HloComputation) -> float:
    """cuDNN fused attention: Q[B,S,H,D] x K[B,T,H,D]: 4*B*H*S*T*D forward, halved if causal;
    the backward kernel does 2.5x the forward work (5 GEMMs vs 2)."""
    q = _shape_of(comp, ins.operands[0])
    k = _shape_of(comp, ins.operands[1])
    if len(q.dims) != 4 or len(k.dims) != 4:
        return 0.0
    b, s, h, d = q.dims
    t = k.dims[1]
    flops = 4.0 * b * h * s * t * d
    cfg = ins.backend_config.get("cudnn_fmha_backend_config", {})
    if "CAUSAL" in str(cfg.get("mask_type", "")).upper():
        flops /= 2
    target = ins.attr("custom_call_target") or ""
    return flops * 2.5 if "Backward" in target or "backward" in target else flops


def _leaf_class(ins: HloInstruction) -> str:
    op = ins.opcode
    if op == "dot":
        return OpClass.GEMM
    if op == "convolution":
        return OpClass.CONV
    if op in ("reduce", "reduce-window"):
        return OpClass.REDUCTION
    if op == "custom-call":
        target = (ins.attr("custom_call_target") or "").strip('"')
        if target.startswith(GEMM_TARGETS):
            return OpClass.GEMM
        if target.startswith(ATTENTION_TARGETS):
            return OpClass.ATTENTION
        if target.startswith(CONV_TARGETS):
            return OpClass.CONV
        return OpClass.CUSTOM
    if op in DATA_MOVEMENT or op in ALIASES:
        return OpClass.DATA_MOVEMENT
    if base_opcode(op) in COLLECTIVES:
        return OpClass.COLLECTIVE
    if op in ("scatter", "sort", "select-and-scatter"):
        return OpClass(op)
    if not is_known(op):
        return OpClass.UNKNOWN
    return OpClass.ELEMENTWISE


def _first_leaf(shape: Shape) -> Shape:
    while shape.is_tuple and shape.elements:
        shape = shape.elements[0]
    return shape


def _shape_of(comp: HloComputation, name: str) -> Shape:
    ins = comp.by_name.get(name)
    return ins.shape if ins is not None else Shape("f32", ())


def _output_bytes(ins: HloInstruction) -> int:
    if ins.opcode == "custom-call" and ins.shape.is_tuple and ins.shape.elements:
        # GEMM/conv custom-calls return (result, scratch workspace); the scratch is not output.
        leaves = [e for e in ins.shape.elements if e.dtype != "s8" or len(ins.shape.elements) == 1]
        return sum(e.nbytes for e in leaves)
    return ins.shape.nbytes


_SLICING = frozenset({"slice", "dynamic-slice", "gather"})
# followed to the parameter's real readers: a pad only adds constants around it, so a
# window sliced out of the padded value reads at most that window of the parameter (XLA's
# bidirectional windowed einsum pads a chunk with -inf and slices both halves of it)
_TRANSPARENT = frozenset({"bitcast", "reshape", "pad"})


def _param_read_bytes(fused: HloComputation, index: int, shape: Shape, comps: dict,
                     in_place: bool = True) -> int:
    """Bytes a fused kernel reads from operand `index`: the slices taken when the parameter
    is only sliced, nothing when it is only the target of a dynamic-update-slice run in
    place; a nested fusion (TPU puts the per-layer slice in an inner kLoop fusion) is
    followed."""
    param = fused.parameters.get(index)
    if param is None:
        return shape.nbytes
    return read_through(fused, fused.users.get(param.name, []), shape, comps, in_place)


def read_through(fused: HloComputation, users: list, shape: Shape, comps: dict,
                 in_place: bool = True) -> int:
    """Bytes of a value of `shape` that `users` ((instruction, operand position) pairs in
    `fused`) read: the slices they take, or all of it (_param_read_bytes)."""
    frontier = list(users)
    seen_bytes = 0
    while frontier:
        u, operand_pos = frontier.pop()
        if u.opcode in _TRANSPARENT:
            frontier.extend(fused.users.get(u.name, []))
        elif u.opcode in _SLICING and operand_pos == 0:
            seen_bytes += u.shape.nbytes
        elif u.opcode == "dynamic-update-slice" and operand_pos == 0 and in_place:
            continue
        elif u.opcode == "fusion" and u.called("calls")[0] in comps:
            seen_bytes += _param_read_bytes(comps[u.called("calls")[0]], operand_pos, shape,
                                            comps)
        else:
            return shape.nbytes
    return min(seen_bytes, shape.nbytes)


def _fusion_written_bytes(fused: HloComputation, full: int) -> int:
    """Bytes an in-place fusion writes: each dynamic-update-slice output its update, any
    other output whole."""
    outs = update_roots(fused)
    if not outs:
        return full
    return sum(_shape_of(fused, r.operands[1]).nbytes
               if r is not None and r.opcode == "dynamic-update-slice" else
               (r.shape.nbytes if r is not None else 0) for _, r in outs)


_PASS_THROUGH = frozenset({"convert", "bitcast", "reshape", "copy"})


def _in_place_update_scale(comp: HloComputation) -> dict[str, float]:
    """For a fusion whose root is an in-place dynamic-update-slice (maybe behind converts),
    the ops on the updated buffer's path run only over the update: XLA's in-place emitter
    writes the update region and leaves the rest of the buffer alone. (HloCostAnalysis
    charges them for the whole buffer, which inflates scanned loops on CPU, where bf16
    buffers get wrapped in converts.)"""
    chain = []
    ins = comp.root
    while ins.opcode in _PASS_THROUGH and ins.operands:
        chain.append(ins)
        ins = comp.by_name.get(ins.operands[0])
        if ins is None:
            return {}
    if ins.opcode != "dynamic-update-slice":
        return {}
    full = ins.shape.num_elements
    update = _shape_of(comp, ins.operands[1]).num_elements
    if not full:
        return {}
    scale = update / full
    buf = comp.by_name.get(ins.operands[0])
    while buf is not None and buf.opcode in _PASS_THROUGH:
        chain.append(buf)
        buf = comp.by_name.get(buf.operands[0]) if buf.operands else None
    return {c.name: scale for c in chain}


def _window_size(window: str | None) -> int:
    if not window:
        return 1
    for part in window.strip("{}").split():
        if part.startswith("size="):
            return math.prod(int(x) for x in part[5:].split("x"))
    return 1
