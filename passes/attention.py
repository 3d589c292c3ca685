"""Collapse each fused-attention call into one attention node.

The zoo decoders write their attention core inside a named scope that says what kernel
it stands for (`flint.models.attention`: `flashattn_fwd_b1_h4_kv1_sq8192_skv8192_d128_causal`).
XLA compiles that core into several dots and fusions; a real GPU runs one flash kernel
instead. This pass merges the nodes of each call (same scope path, same loop) into ONE
node with op_class "attention" and the kernel's cost:

- flops: executed FLOPs, 4*B*H*Sq*Skv*D, halved when causal, x2.5 for the backward
  (value head dim Dv != D: `attention_cost`);
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
                    r"(?:dv(\d+)_)?(causal|full)")


FUSED_ATTENTION_OP = "fused-attention"

def scope_name(phase: str, b, h, kv, sq, skv, d, causal: bool, dv: int | None = None) -> str:
    """The named scope a fused-attention call is traced in (per-device shapes; `dv`: the
    value head dim when it differs from the query/key one, as in multi-head latent
    attention)."""
    value = f"dv{dv}_" if dv and dv != d else ""
    return (f"flashattn_{phase}_b{b}_h{h}_kv{kv}_sq{sq}_skv{skv}_d{d}_{value}"
            f"{'causal' if causal else 'full'}")


def attention_cost(b, h, kv, sq, skv, d, causal: bool, backward: bool,
                   dtype_bytes: int = 2, dv: int | None = None) -> tuple[float, float, float]:
    """(flops, bytes read, bytes written) of a flash-attention kernel: 2*B*H*Sq*Skv*(D+Dv)
    forward (QK^T over D, PV over Dv; 4*B*H*Sq*Skv*D when equal), halved under a causal
    mask; backward 2*B*H*Sq*Skv*(3D+2Dv) (FlashAttention-2, Dao 2023: S recomputed, dQ and
    dK over D, dP and dV over Dv; 2.5x the forward when equal); traffic is Q, K, V, O (+
    dO, dQ, dK, dV and the f32 log-sum-exp for the backward) only. Dv differs from D in
    multi-head latent attention (DeepSeek-V3: 192 and 128), which FlashAttention-3 and
    cuDNN run as is."""
    dv = dv or d
    per_pair = (3 * d + 2 * dv) if backward else (d + dv)
    flops = 2.0 * b * h * sq * skv * per_pair * (0.5 if causal else 1.0)
    q = b * sq * h * d * dtype_bytes
    o = b * sq * h * dv * dtype_bytes
    k = b * skv * kv * d * dtype_bytes
    v = b * skv * kv * dv * dtype_bytes
    lse = b * h * sq * 4
    if backward:
        return flops, q + k + v + o + o + lse, q + k + v          # reads dO; writes dQ, dK, dV
    return flops, q + k + v, o + lse


@dataclass(frozen=True)
class CollapseAttention:
    """Contract: ids stay dense and deps point backwards; loops, collective windows and
    control edges are remapped; nodes outside attention scopes keep their relative order
    except that consumers of a call may move after it (and its late inputs before it)."""

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
        skipped = 0
        calls: list[tuple[tuple, list[int]]] = []
        taken: set[int] = set()
        for key, ids in groups.items():
            members = set(ids)
            if all(p in members for i in ids for p in graph.nodes[i].inputs):
                continue        # loop-invariant pieces (the mask) hoisted out of the call
            hull = _convex_hull(graph, users, members)
            if hull is None or taken & set(hull):
                skipped += 1
                continue
            taken.update(hull)
            calls.append((key, hull))
        while calls:
            order = _contracted_order(graph, calls)
            broken = _loops_split(graph, calls, order)
            if not broken:
                break
            skipped += len(broken)
            calls = [c for k, c in enumerate(calls) if k not in broken]
        if not calls:
            return _with_counts(graph, 0, skipped)
        return _with_counts(_rebuild(graph, calls, order), len(calls), skipped)


def _with_counts(out: WorkloadGraph, calls: int, skipped: int):
    meta = dict(out.meta, attention_calls=calls)
    if skipped:
        meta["attention_uncollapsed"] = skipped
    out = replace(out, meta=meta)
    out.check()
    return out


def _convex_hull(graph: WorkloadGraph, users, members: set) -> list[int] | None:
    """The call's nodes plus every node on a path from one of them to another (layout
    copies, converts and head-group sums XLA emits without the scope's metadata): the
    smallest set that contracts to one node without a cycle. None when the hull would
    swallow a collective or a matrix multiply of its own (a projection GEMM is not part
    of the attention kernel)."""
    lo, hi = min(members), max(members)
    # deps point backwards, so every such path stays inside [lo, hi]
    after: set[int] = set()
    for i in range(lo, hi + 1):
        n = graph.nodes[i]
        if i in members or any(p in after for p in n.inputs + n.control):
            after.add(i)
    before: set[int] = set()
    controls: dict[int, list[int]] = {}
    for i in range(lo, hi + 1):
        for p in graph.nodes[i].control:
            controls.setdefault(p, []).append(i)
    for i in range(hi, lo - 1, -1):
        if i in members or any(u in before for u in users[i] + controls.get(i, [])):
            before.add(i)
    hull = sorted(after & before)
    for i in hull:
        n = graph.nodes[i]
        if i not in members and (n.collective is not None or n.kind != NodeKind.COMPUTE
                                 and n.kind != NodeKind.MEMORY
                                 or n.op_class in ("gemm", "conv", "attention")):
            return None
    return hull


def _contracted_order(graph: WorkloadGraph, calls) -> list[tuple]:
    """Slots in the new schedule: ("n", id) for a kept node, ("g", k) for call k. A
    stable topological order of the contracted graph: every slot goes as early as its
    inputs allow and ties keep the compiler's order (a call ranks at its first node), so
    nothing moves unless a call's late input or early consumer forces it."""
    import heapq

    owner = {i: k for k, (_, ids) in enumerate(calls) for i in ids}
    slot = lambda i: ("g", owner[i]) if i in owner else ("n", i)  # noqa: E731
    rank = {("g", k): (ids[0], 0) for k, (_, ids) in enumerate(calls)}
    deps: dict[tuple, set] = {}
    for n in graph.nodes:
        s = slot(n.id)
        rank.setdefault(s, (n.id, 1))
        d = deps.setdefault(s, set())
        d.update(slot(p) for p in n.inputs + n.control)
        d.discard(s)
    waiting = {s: len(d) for s, d in deps.items()}
    downstream: dict[tuple, list] = {}
    for s, d in deps.items():
        for p in d:
            downstream.setdefault(p, []).append(s)
    ready = [(rank[s], s) for s, k in waiting.items() if k == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, s = heapq.heappop(ready)
        order.append(s)
        for u in downstream.get(s, ()):
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, (rank[u], u))
    if len(order) != len(deps):      # the hull makes contraction acyclic; guard anyway
        raise AssertionError("collapse-attention: contracted graph has a cycle")
    return order


def _loops_split(graph: WorkloadGraph, calls, order) -> set[int]:
    """Calls to leave alone because the reordering they need would break a loop body's
    contiguous id range: every call with a member in, or a slot inside, such a body."""
    owner = {i: k for k, (_, ids) in enumerate(calls) for i in ids}
    pos = {s: k for k, s in enumerate(order)}
    broken: set[int] = set()
    for lp in graph.loops:
        if lp.last < lp.first:
            continue
        at = sorted({pos[("g", owner[i])] if i in owner else pos[("n", i)]
                     for i in range(lp.first, lp.last + 1)})
        if at[-1] - at[0] + 1 == len(at):
            continue
        broken.update(k for k in range(len(calls))
                      if at[0] <= pos[("g", k)] <= at[-1]
                      or any(lp.first <= i <= lp.last for i in calls[k][1]))
    return broken


def _rebuild(graph: WorkloadGraph, calls, order) -> WorkloadGraph:
    owner = {i: k for k, (_, ids) in enumerate(calls) for i in ids}
    new_id = {s: k for k, s in enumerate(order)}
    remap = [new_id[("g", owner[i])] if i in owner else new_id[("n", i)]
             for i in range(len(graph.nodes))]
    nodes = []
    for k, (tag, x) in enumerate(order):
        if tag == "g":
            key, ids = calls[x]
            n = _attention_node(graph, key, ids)
            old_inputs = [p for i in ids for p in graph.nodes[i].inputs]
            old_control = [p for i in ids for p in graph.nodes[i].control]
        else:
            n = graph.nodes[x]
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
    keep = [x if tag == "n" else calls[x][1][0] for tag, x in order]
    loops = [_remap_loop(lp, remap, keep) for lp in graph.loops]
    return replace(graph, nodes=nodes, loops=loops)


def _remap_loop(lp, remap: list[int], keep: list[int]):
    if lp.last < lp.first:          # an empty body stays empty, at its place
        first = sum(k < lp.first for k in keep)
        first_last = (first, first - 1)
    else:
        body = [remap[i] for i in range(lp.first, lp.last + 1)]
        first_last = (min(body), max(body))
    carried = [(sorted({remap[i] for i in a}), sorted({remap[i] for i in b}),
                sorted({remap[i] for i in c})) for a, b, c in lp.carried]
    return replace(lp, first=first_last[0], last=first_last[1], carried=carried)


def _attention_node(graph: WorkloadGraph, key: tuple, ids: list[int]):
    m = MARKER.search(key[0])
    phase, b, h, kv, sq, skv, d, dv, mask = m.groups()
    b, h, kv, sq, skv, d = map(int, (b, h, kv, sq, skv, d))
    dv = int(dv) if dv else d
    backward = phase == "bwd"
    causal = mask == "causal"
    flops, read, written = attention_cost(b, h, kv, sq, skv, d, causal, backward, dv=dv)
    last = graph.nodes[max(ids)]
    meta = {k: v for k, v in last.meta.items() if k not in ("fusion_kind", "unknown")}
    meta.update(attention={"batch": b, "heads": h, "kv_heads": kv, "seq_q": sq,
                           "seq_kv": skv, "head_dim": d, "causal": causal,
                           "backward": backward, "dtype": "bf16",
                           **({"v_head_dim": dv} if dv != d else {})},
                fused_from=len(ids), scope=meta.get("scope", ""))
    shape_q, shape_o = f"bf16[{b},{sq},{h},{d}]", f"bf16[{b},{sq},{h},{dv}]"
    shape_k, shape_v = f"bf16[{b},{skv},{kv},{d}]", f"bf16[{b},{skv},{kv},{dv}]"
    operands = [shape_q, shape_k, shape_v] + ([shape_o, shape_o] if backward else [])
    outputs = [shape_q, shape_k, shape_v] if backward else [shape_o, f"f32[{b},{h},{sq}]"]
    return replace(last, kind=NodeKind.COMPUTE, op=FUSED_ATTENTION_OP, op_class=OpClass.ATTENTION,
                   flops=flops, transcendentals=0.0, bytes_read=float(read),
                   bytes_written=float(written), operands=operands, outputs=outputs,
                   meta=meta)
