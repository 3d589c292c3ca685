"""Flint nodes for the operators of a Kineto trace that launched GPU kernels, one per execution
(GEMM and attention operators; other_executions: every other aten operator).

Each operator recorded with `record_shapes` becomes the node the torch front end would have
built for it: shapes become meta tensors, the output shapes come from torch's own meta
kernels, and flops/bytes from passes.aten_cost (the rules passes.lower_fx uses), so a
prediction for a traced kernel and for the same op in an extracted graph agree.

Which operator stands for a kernel: for GEMMs the innermost of mm/addmm/bmm/baddbmm around
its launch (aten::linear and aten::matmul only wrap them); for attention the innermost
`_scaled_dot_product_*` operator (query/key/value as [batch, heads, seq, head_dim], as
make_fx records it), else the innermost attention operator, whose [batch, seq, heads,
head_dim] arguments (`_flash_attention_forward`, `_efficient_attention_forward`) are viewed
as [batch, heads, seq, head_dim] for the cost rules. Scalar arguments (is_causal, scale)
are read from `Concrete Inputs`; one not recorded takes the schema's default.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from flint.graph import Node, NodeKind
from flint.passes import aten_cost as ac
from flint.passes.lower_fx import DTYPES, shape_str
from flint.validate.kineto_kernels import CpuOp, GpuKernel

# Kineto's `Input type` names (c10 scalar type names) -> torch dtypes.
TORCH_DTYPES = {
    "float": torch.float32, "double": torch.float64, "c10::Half": torch.float16,
    "c10::BFloat16": torch.bfloat16, "long int": torch.int64, "int": torch.int32,
    "short int": torch.int16, "signed char": torch.int8, "unsigned char": torch.uint8,
    "bool": torch.bool, "c10::Float8_e4m3fn": torch.float8_e4m3fn,
    "c10::Float8_e5m2": torch.float8_e5m2,
}
GEMM_OPS = ("mm", "addmm", "bmm", "baddbmm")          # aten_cost has exact rules for these
SEQ_MAJOR = ("_flash_attention_forward", "_efficient_attention_forward")


@dataclass(frozen=True)
class OpExecution:
    """One execution of a GEMM or attention operator and the GPU work it launched."""

    op: CpuOp
    op_class: str                    # gemm | attention
    kernels: tuple[GpuKernel, ...]   # compute kernels ("kernel" category)
    other: tuple[GpuKernel, ...]     # memsets / memcpys it also launched
    phase: str = "forward"           # backward when autograd's engine ran it

    @property
    def measured_s(self) -> float:
        return sum(k.duration_s for k in self.kernels)


def modelled_op(kernel: GpuKernel) -> tuple[CpuOp, str] | None:
    """The operator that stands for `kernel` and its class, or None if not GEMM/attention."""
    for op in reversed(kernel.stack):
        short = _short(op.name)
        if short in GEMM_OPS and op.dims:
            return op, "gemm"
    attention = [op for op in kernel.stack
                 if ac.op_class(_short(op.name)) == "attention" and _short(op.name) in ac.SDPA]
    preferred = [op for op in attention if _short(op.name).startswith("_scaled_dot_product")]
    if preferred or attention:
        return (preferred or attention)[-1], "attention"
    return None


def executions(kernels) -> tuple[list[OpExecution], list[GpuKernel]]:
    """(GEMM and attention executions in launch order, compute kernels outside them)."""
    found: dict[int, tuple[CpuOp, str, list, list]] = {}
    others = []
    for k in kernels:
        m = modelled_op(k)
        if m is None:
            if k.category == "kernel":
                others.append(k)
            continue
        op, cls = m
        entry = found.setdefault(op.index, (op, cls, [], [], _phase(k, op)))
        (entry[2] if k.category == "kernel" else entry[3]).append(k)
    out = [OpExecution(op, cls, tuple(ks), tuple(rest), phase)
           for op, cls, ks, rest, phase in sorted(found.values(), key=lambda v: v[0].start_us)
           if ks]
    return out, others


def other_executions(kernels) -> tuple[list[OpExecution], list[GpuKernel]]:
    """The compute kernels outside GEMM/attention operators, one execution per innermost
    aten operator with recorded shapes (an op that launches several kernels is one
    execution of all of them); (executions, kernels with no such operator)."""
    found: dict[int, tuple[CpuOp, list]] = {}
    loose = []
    for k in kernels:
        op = next((o for o in reversed(k.stack)
                   if _short(o.name) and o.dims and hasattr(torch.ops.aten, _short(o.name))),
                  None)
        if op is None:
            loose.append(k)
            continue
        found.setdefault(op.index, (op, []))[1].append(k)
    out = [OpExecution(op, ac.op_class(_short(op.name)), tuple(ks), (), _phase(ks[0], op))
           for op, ks in sorted(found.values(), key=lambda v: v[0].start_us)]
    return out, loose


def execution_node(ex: OpExecution, node_id: int = 0) -> Node | None:
    """The Flint node of one execution; None when its shapes or arguments are not recorded
    in a form torch's meta kernels accept (the caller counts those)."""
    try:
        return _node(ex, node_id)
    except (RuntimeError, TypeError, ValueError, IndexError, NotImplementedError,
            AttributeError):
        return None           # shapes torch rejects: inconsistent or corrupt records


def _node(ex: OpExecution, node_id: int) -> Node | None:
    short = _short(ex.op.name)
    bound = _bind(short, ex.op)
    if bound is None:
        return None
    schema, args, kwargs, out = bound
    named = {**{a.name: v for a, v in zip(schema.arguments, args)}, **kwargs}
    cost_args = list(args)
    if short in SEQ_MAJOR:               # [B, S, H, D] -> [B, H, S, D] for the cost rules
        cost_args[:3] = [t.transpose(1, 2) for t in args[:3]]
    flops, trans = ac.cost(short, cost_args, named, out)
    ins = ac.tensors(list(args))
    outs = ac.tensors(out)
    meta = {"aten": ex.op.name, "phase": ex.phase, "kernel": ex.kernels[0].name,
            "kernels": len(ex.kernels)}
    if ex.op_class == "gemm":
        meta["gemm"] = _gemm_dims(short, args, outs[0])
    elif ex.op_class == "attention":
        meta["attention"] = _attention_meta(short, cost_args, named)
        meta["causal_recorded"] = _recorded(ex.op, schema, "is_causal")
    return Node(node_id, f"{short}.{ex.op.index}", NodeKind.COMPUTE, short, ex.op_class,
                flops=flops, transcendentals=trans,
                bytes_read=float(sum(ac.nbytes(t) for t in ins)),
                bytes_written=float(sum(ac.nbytes(t) for t in outs)),
                outputs=[shape_str(t) for t in outs], operands=[shape_str(t) for t in ins],
                meta=meta)


def _bind(short: str, op: CpuOp):
    """(schema, args, kwargs, meta outputs) of the first overload of aten::`short` that
    accepts the recorded arguments (Kineto names the operator, not its overload)."""
    packet = getattr(torch.ops.aten, short, None)
    if packet is None:
        return None
    names = sorted(packet.overloads(), key=lambda n: (n != "default", n != "Tensor", n))
    for name in names:
        overload = getattr(packet, name)
        parsed = _arguments(op, overload._schema)
        if parsed is None:
            continue
        try:
            out = overload(*parsed[0], **parsed[1])   # meta tensors: shapes only
        except (RuntimeError, TypeError, ValueError, IndexError, NotImplementedError):
            continue
        return overload._schema, parsed[0], parsed[1], out
    return None


def _phase(kernel: GpuKernel, op: CpuOp) -> str:
    """Autograd runs backward ops inside `autograd::engine::evaluate_function: ...Backward`."""
    backward = op.name.endswith("_backward") or any(
        o.name.startswith("autograd::engine::evaluate_function") for o in kernel.stack)
    return "backward" if backward else "forward"


def _short(name: str) -> str:
    return name.split("::", 1)[1] if name.startswith("aten::") else ""


def _arguments(op: CpuOp, schema) -> tuple[list, dict] | None:
    """(positional, keyword-only) arguments for the schema, in the order Kineto records them:
    meta tensors for recorded tensors, scalars parsed from `Concrete Inputs`, schema
    defaults for the rest. None if a required tensor has no recorded shape."""
    pos, kw = [], {}
    for i, arg in enumerate(schema.arguments):
        dims = op.dims[i] if i < len(op.dims) else ()
        dtype = TORCH_DTYPES.get(op.types[i] if i < len(op.types) else "")
        text = op.concrete[i] if i < len(op.concrete) else ""
        if dtype is not None and all(isinstance(d, int) for d in dims):
            value = torch.empty(dims, dtype=dtype, device="meta")
        elif "Tensor" in str(arg.type) and "Optional" not in str(arg.type):
            return None
        elif text:
            value = _scalar(text, str(arg.type))
            if value is None:
                return None
        else:
            value = arg.default_value if arg.has_default_value() else None
        if arg.kwarg_only:
            kw[arg.name] = value
        else:
            pos.append(value)
    return pos, kw


def _scalar(text: str, typ: str):
    try:
        if "bool" in typ:
            return {"True": True, "False": False}[text]
        if "int" in typ or "SymInt" in typ:
            return int(text)
        return float(text) if any(c in text for c in ".eE") or "float" in typ else int(text)
    except (KeyError, ValueError):
        return None


def _recorded(op: CpuOp, schema, name: str) -> bool:
    for i, arg in enumerate(schema.arguments):
        if arg.name == name:
            return i < len(op.concrete) and op.concrete[i] != ""
    return False


def _gemm_dims(short: str, args: list, out: torch.Tensor) -> dict:
    a = args[1] if short in ("addmm", "baddbmm") else args[0]
    batch = math.prod(out.shape[:-2]) if out.dim() > 2 else 1
    return {"batch": int(batch), "m": int(out.shape[-2]), "n": int(out.shape[-1]),
            "k": int(a.shape[-1]), "dtype": DTYPES.get(a.dtype, str(a.dtype))}


def _attention_meta(short: str, args: list, named: dict) -> dict:
    """The attention contract of the cost model, from [B, H, S, D] query and key."""
    q, k = (args[1], args[2]) if short.endswith("_backward") else (args[0], args[1])
    return {"batch": int(q.shape[0]), "heads": int(q.shape[1]), "kv_heads": int(k.shape[1]),
            "seq_q": int(q.shape[-2]), "seq_kv": int(k.shape[-2]), "head_dim": int(q.shape[-1]),
            "causal": bool(named.get("is_causal", False)), "backward": short.endswith("_backward"),
            "dtype": DTYPES.get(q.dtype, str(q.dtype)),
            # PyTorch's flash and memory-efficient SDPA kernels are FlashAttention-2-class;
            # only its cuDNN backend runs the architecture's own fused attention.
            "impl": "native" if "cudnn" in short else "flash2"}
