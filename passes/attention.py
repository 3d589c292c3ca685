"""Collapse each fused-attention call into one attention node.

The zoo decoders write their attention core inside a named scope that says what kernel
it stands for (`flint.models.attention`: `flashattn_fwd_b1_h4_kv1_sq8192_skv8192_d128_causal`).
XLA compiles that core into several dots and fusions; a real GPU runs one flash kernel
instead. This pass merges the nodes of each call (same scope path, same loop) into ONE
node with op_class "attention" and the kernel's cost:

- flops: executed FLOPs, 4*B*H*Sq*Skv*D, halved when causal, x2.5 for the backward;
- bytes_read / bytes_written: Q, K, V, O (+ dO, dQ, dK, dV, log-sum-exp backward) only;
- meta["attention"]: {batch, heads, kv_heads, seq_q, seq_kv, head_dim, causal, backward,
  dtype} (per-device shapes).

The merged node sits right before the call's first outside consumer (XLA may schedule,
say, the weight-gradient GEMM of dQ before the core's last op). A call that cannot be
placed so (an outside input scheduled after an outside consumer) is left as it is and
counted in meta["attention_uncollapsed"].
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import ClassVar

from flint.graph import NodeKind, OpClass, WorkloadGraph

MARKER = re.compile(r"flashattn_(fwd|bwd)_b(\d+)_h(\d+)_kv(\d+)_sq(\d+)_skv(\d+)_d(\d+)_"
                    r"(causal|full)")


FUSED_ATTENTION_OP = "fused-attention"

def scope_name(phase: str, b, h, kv, sq, skv, d, causal: bool) -> str:
    """The named scope a fused-attention call is traced in (per-device shapes)."""
    return (f"flashattn_{phase}_b{b}_h{h}_kv{kv}_sq{sq}_skv{skv}_d{d}_"
            f"{'causal' if causal else 'full'}")


def attention_cost(b, h, kv, sq, skv, d, causal: bool, backward: bool,
                   dtype_bytes: int = 2) -> tuple[float, float, float]:
    """(flops, bytes read, bytes written) of a flash-attention kernel: 4*B*H*Sq*Skv*D
    forward (QK^T and PV), halved under a causal mask, x2.5 backward (FlashAttention-2,
    Dao 2023: five GEMMs for two); traffic is Q, K, V, O (+ dO, dQ, dK, dV and the f32
    log-sum-exp for the backward) only."""
    flops = 4.0 * b * h * sq * skv * d * (0.5 if causal else 1.0) * (2.5 if backward else 1.0)
    q = o = b * sq * h * d * dtype_bytes
    k = v = b * skv * kv * d * dtype_bytes
    lse = b * h * sq * 4
    if backward:
        return flops, q + k + v + o + o + lse, q + k + v          # reads dO; writes dQ, dK, dV
    return flops, q + k + v, o + lse


@dataclass(frozen=True)
class CollapseAttention:
    """Contract: ids stay dense and deps point backwards; loops, collective windows and
    control edges are remapped; nodes outside attention scopes are unchanged."""

    name: ClassVar[str] = "collapse-attention"

    def run(self, graph: WorkloadGraph) -> WorkloadGraph:
        groups: dict[tuple, list[int]] = {}
        for n in graph.nodes:
            m = MARKER.search(n.meta.get("op_name", ""))
            if m is None or n.collective is not None:
                continue
            key = (n.meta["op_name"][: m.end()], n.meta.get("loop"), n.repeat)
            groups.setdefault(key, []).append(n.id)
        if not groups:
            return graph
        users = graph.users
        placed: dict[int, tuple] = {}          # member -> (slot key of the merged node, group)
        skipped = 0
        collapsed = []
        for key, ids in groups.items():
            members = set(ids)
            if all(p in members for i in ids for p in graph.nodes[i].inputs):
                continue        # loop-invariant pieces (the mask) hoisted out of the call
            ids = _sandwiched(graph, users, members)
            if ids is None:
                skipped += 1
                continue
            members = set(ids)
            ext_in = [p for i in ids for p in graph.nodes[i].inputs + graph.nodes[i].control
                      if p not in members]
            ext_users = [u for i in ids for u in users[i] if u not in members]
            # the merged kernel goes right before its first outside consumer (XLA may
            # schedule a weight-gradient GEMM on dQ before the core's last op)
            anchor = min(ext_users, default=max(ids) + 1)
            if ext_in and max(ext_in) >= anchor:
                skipped += 1
                continue
            for i in ids:
                placed[i] = ((anchor, 0), len(collapsed))
            collapsed.append((key, ids))
        order = sorted({placed[i][0] if i in placed else (i, 1) for i in range(len(graph.nodes))})
        slot_id = {slot: k for k, slot in enumerate(order)}
        remap = [slot_id[placed[i][0] if i in placed else (i, 1)] for i in range(len(graph.nodes))]
        merged = {slot_id[(a, 0)]: collapsed[g] for (a, _), g in
                  {placed[i] for i in placed}}
        nodes = []
        for k, slot in enumerate(order):
            if k in merged:
                key, ids = merged[k]
                n = _attention_node(graph, key, ids)
                old_inputs = [p for i in ids for p in graph.nodes[i].inputs]
                old_control = [p for i in ids for p in graph.nodes[i].control]
            else:
                n = graph.nodes[slot[0]]
                old_inputs, old_control = n.inputs, n.control
            inputs = sorted({remap[p] for p in old_inputs if remap[p] != k})
            control = sorted({remap[p] for p in old_control if remap[p] != k} - set(inputs))
            node = replace(n, id=k, inputs=inputs, control=control)
            if n.collective is not None and n.collective.window is not None:
                lo, hi = (remap[w] for w in n.collective.window)
                node.collective = replace(n.collective, window=(lo, hi) if lo <= hi else None)
            if "window" in n.meta:
                lo, hi = (remap[w] for w in n.meta["window"])
                node.meta = dict(n.meta, window=[lo, max(lo, hi)])
            nodes.append(node)
        keep = [slot[0] for slot in order]
        loops = [_remap_loop(lp, remap, keep) for lp in graph.loops]
        meta = dict(graph.meta, attention_calls=len(collapsed))
        if skipped:
            meta["attention_uncollapsed"] = skipped
        out = replace(graph, nodes=nodes, loops=loops, meta=meta)
        out.check()
        return out


def _sandwiched(graph: WorkloadGraph, users, members: set) -> list[int] | None:
    """The call's nodes plus the outside ops that both consume and feed them (layout
    copies and converts XLA emits without the scope's metadata): they are part of the
    kernel. None when such an op is a collective."""
    members = set(members)
    changed = True
    while changed:
        changed = False
        for i in sorted(members):
            for u in users[i]:
                if u in members or not any(w in members for w in users[u]):
                    continue
                if graph.nodes[u].collective is not None:
                    return None
                members.add(u)
                changed = True
    return sorted(members)


def _remap_loop(lp, remap: list[int], keep: list[int]):
    import bisect

    if lp.last < lp.first:          # an empty body stays empty, at its place
        first = bisect.bisect_left(keep, lp.first)
        first_last = (first, first - 1)
    else:
        body = [remap[i] for i in range(lp.first, lp.last + 1)]
        first_last = (min(body), max(body))
    carried = [(sorted({remap[i] for i in a}), sorted({remap[i] for i in b}),
                sorted({remap[i] for i in c})) for a, b, c in lp.carried]
    return replace(lp, first=first_last[0], last=first_last[1], carried=carried)


def _attention_node(graph: WorkloadGraph, key: tuple, ids: list[int]):
    m = MARKER.search(key[0])
    phase, b, h, kv, sq, skv, d, mask = m.groups()
    b, h, kv, sq, skv, d = map(int, (b, h, kv, sq, skv, d))
    backward = phase == "bwd"
    causal = mask == "causal"
    flops, read, written = attention_cost(b, h, kv, sq, skv, d, causal, backward)
    last = graph.nodes[max(ids)]
    meta = {k: v for k, v in last.meta.items() if k not in ("fusion_kind", "unknown")}
    meta.update(attention={"batch": b, "heads": h, "kv_heads": kv, "seq_q": sq,
                           "seq_kv": skv, "head_dim": d, "causal": causal,
                           "backward": backward, "dtype": "bf16"},
                fused_from=len(ids), scope=meta.get("scope", ""))
    shape_q = f"bf16[{b},{sq},{h},{d}]"
    shape_kv = f"bf16[{b},{skv},{kv},{d}]"
    operands = [shape_q, shape_kv, shape_kv] + ([shape_q, shape_q] if backward else [])
    outputs = [shape_q, shape_kv, shape_kv] if backward else [shape_q, f"f32[{b},{h},{sq}]"]
    return replace(last, kind=NodeKind.COMPUTE, op=FUSED_ATTENTION_OP, op_class=OpClass.ATTENTION,
                   flops=flops, transcendentals=0.0, bytes_read=float(read),
                   bytes_written=float(written), operands=operands, outputs=outputs,
                   meta=meta)
