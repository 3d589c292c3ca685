"""Trip counts of while loops that the compiler did not annotate (TPU never writes
`known_trip_count`): find the induction variable the condition compares against a constant,
its start value in the loop's init tuple, and its constant step in the body.
"""
from __future__ import annotations

import math

from flint.hlo.module import HloComputation, HloInstruction, HloModule

_THROUGH = frozenset({"copy", "bitcast", "convert", "reshape"})


def infer_trip_count(module: HloModule, loop: HloInstruction,
                     caller: HloComputation) -> int | None:
    """Iterations of `loop`, or None when they depend on data."""
    try:
        cond = module.computations[loop.called("condition")[0]]
        body = module.computations[loop.called("body")[0]]
        found = _bound(module, cond)
        if found is None:
            return None
        index, direction, limit, var_on_left = found
        start = _constant(caller, _tuple_element(caller, loop.operands[0], index))
        step = _step(module, body, index)
        if start is None or step is None or step == 0:
            return None
        if not var_on_left:  # `limit OP var` -> `var OP' limit`
            direction = {"LT": "GT", "LE": "GE", "GT": "LT", "GE": "LE"}.get(direction, direction)
        return _count(start, limit, step, direction)
    except (KeyError, IndexError, ValueError):
        return None


def _count(start: int, limit: int, step: int, direction: str) -> int | None:
    if direction == "LT" and step > 0:
        n = math.ceil((limit - start) / step)
    elif direction == "LE" and step > 0:
        n = (limit - start) // step + 1
    elif direction == "GT" and step < 0:
        n = math.ceil((start - limit) / -step)
    elif direction == "GE" and step < 0:
        n = (start - limit) // -step + 1
    elif direction == "NE" and (limit - start) % step == 0:
        n = (limit - start) // step
    else:
        return None
    return max(int(n), 0)


def _source(comp: HloComputation, name: str) -> HloInstruction:
    ins = comp.by_name[name]
    while ins.opcode in _THROUGH and ins.operands:
        ins = comp.by_name[ins.operands[0]]
    return ins


def _constant(comp: HloComputation, name: str | None) -> int | None:
    if name is None:
        return None
    ins = _source(comp, name)
    if ins.opcode == "constant" and ins.shape.num_elements == 1:
        return int(float(ins.operand_text.strip("{} ")))
    return None


def _tuple_element(comp: HloComputation, name: str, index: int) -> str | None:
    ins = _source(comp, name)
    return ins.operands[index] if ins.opcode == "tuple" and index < len(ins.operands) else None


def _state_index(comp: HloComputation, name: str) -> int | None:
    """Which loop-state element `name` reads: get-tuple-element(parameter(0)), index=k."""
    ins = _source(comp, name)
    if ins.opcode == "get-tuple-element":
        src = _source(comp, ins.operands[0])
        if src.opcode == "parameter":
            return int(ins.attr("index") or 0)
    return None


def _facts(outer: HloComputation, comp: HloComputation, args, name: str):
    """(loop-state index, constant value) an operand stands for; inside a fusion (`args` are
    the fusion's operands in `outer`) a parameter stands for the matching operand."""
    src = _source(comp, name)
    if args is not None:
        if src.opcode != "parameter":
            return None, _constant(comp, name)
        name, comp = args[int(src.operand_text)], outer
    return _state_index(comp, name), _constant(comp, name)


def _bound(module: HloModule, cond: HloComputation):
    """(state index, direction, limit, var_on_left) of the condition's compare."""
    root = _source(cond, cond.root.name)
    comp, cmp, args = cond, root, None
    if root.opcode == "fusion":  # the compare is fused: map its parameters to operands
        comp = module.computations[root.called("calls")[0]]
        cmp = _source(comp, comp.root.name)
        args = root.operands
    if cmp.opcode != "compare":
        return None
    direction = (cmp.attr("direction") or "").strip()
    (li, lc), (ri, rc) = (_facts(cond, comp, args, name) for name in cmp.operands[:2])
    if li is not None and rc is not None:
        return li, direction, rc, True
    if ri is not None and lc is not None:
        return ri, direction, lc, False
    return None


def _step(module: HloModule, body: HloComputation, index: int) -> int | None:
    name = _tuple_element(body, body.root.name, index)
    if name is None:
        return None
    ins = _source(body, name)
    comp, args = body, None
    if ins.opcode == "fusion":
        comp = module.computations[ins.called("calls")[0]]
        args = ins.operands
        ins = _source(comp, comp.root.name)
    if ins.opcode not in ("add", "subtract"):
        return None
    (vi, vc), (wi, wc) = (_facts(body, comp, args, name) for name in ins.operands[:2])
    if vi == index and wc is not None:
        return wc if ins.opcode == "add" else -wc
    if wi == index and vc is not None and ins.opcode == "add":
        return vc
    return None
