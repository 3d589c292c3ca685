"""Which what-ifs changed a prediction, and why the others did not.

A what-if (`--set nic_bandwidth=800Gb/s`) that prices nothing differently is a silent
wrong answer waiting to happen: the user reads the unchanged step as the faster network's.
So every prediction states, per what-if item, what it did:

    nic_bandwidth=800Gb/s changed nothing: no collective crosses a node in this run
    (every group stays inside one 8-device nvlink domain)
    hbm_bandwidth=4.8TB/s applied: re-priced 155 of 248 distinct ops (0 collectives, 155
    compute); their summed time -29.63%

The check is exact and cheap: every distinct op of the priced graph (the layer template's
ops, each pipeline copy once) is priced again under the spec without the item. Op prices
are all a step depends on besides the graph (the overlap slowdown follows the same HBM and
core figures; a time-balanced pipeline split follows the prices), the memory verdict reads
the capacity and MFU/HFU the bf16 peak. An item that changes none of them changed nothing,
and the reason names what the run lacks for it (no collective across nodes, no GEMM in
that dtype, ...).
"""
from __future__ import annotations

from dataclasses import fields

from flint.graph import WorkloadGraph

# what-if figures of the scale-out network and of the scale-up (NVLink / ICI) level
SCALE_OUT = ("nic_bandwidth", "nic_latency", "oversubscription", "leaf_group")
SCALE_UP = ("scale_up_bandwidth", "scale_up_latency", "scale_up_link", "switch_reduction")
PLACEMENT = ("devices_per_node", "scale_up_domain", "fabric", "torus")
# relative change below which two prices are one (float noise of the same arithmetic)
SAME = 1e-12


def what_if_effects(graph: WorkloadGraph, hardware: str | None, what_if, base=(),
                    cost_model=None, memory_bytes: float | None = None,
                    algorithm: str = "auto") -> list[dict]:
    """Per item of `what_if` (spec overrides applied on top of `base`, the run's own), a
    mapping {"what_if", "effect": "applied" | "memory only" | "utilization only" |
    "none", "detail": one line}; an applied one also says how many distinct ops it
    re-priced (`repriced_ops`) and their summed time after over before
    (`repriced_time_ratio`). `graph`: the graph the prediction priced (a layered or
    pipelined graph is re-priced from its template); `memory_bytes`: the per-device peak
    the memory verdict compared with the capacity; `hardware` None: the graph's own;
    `cost_model`, `algorithm`: as the prediction was priced."""
    from flint.hardware_models.pluggable import cost_model_for
    from flint.passes.expand_loops import ExpandLoops

    items = [str(w) for w in what_if]
    if not items:
        return []
    base = [str(b) for b in base]
    flat = ExpandLoops().run(graph)
    ops = _distinct_ops(flat)
    full = cost_model_for(flat, hardware, base + items, cost_model, algorithm)
    priced = None
    out = []
    for i, item in enumerate(items):
        key = item.partition("=")[0].strip()
        later = next((w for w in items[i + 1:] if w.partition("=")[0].strip() == key), None)
        if later is not None:
            out.append(_row(item, "none", f"{later} later in the list overrides it"))
            continue
        # the spec as it would be without this figure set at all (earlier items that set
        # the same figure are overridden by this one: they are not the baseline)
        others = [w for w in items if w.partition("=")[0].strip() != key]
        without = cost_model_for(flat, hardware, base + others, cost_model, algorithm)
        if _same_spec(without.spec, full.spec):
            out.append(_row(item, "none", f"the {full.spec.name} spec already has {key} = "
                                          f"{item.partition('=')[2].strip()}"))
            continue
        priced = priced or [full.node_time(n, g) for n, g in ops]
        before = [without.node_time(n, g) for n, g in ops]
        out.append(_effect(item, key, flat, ops, priced, before, without, full, memory_bytes))
    return out


def _distinct_ops(flat: WorkloadGraph) -> list[tuple]:
    """(node, its graph) for every op whose price the step uses once: the layer template's
    ops (composite blocks are priced from them) and the other ops of `flat`, pipeline
    copies and repeated stage-to-stage transfers once (as estimate.price_nodes prices)."""
    from flint.graph import NodeKind
    from flint.hardware_models.composite import template_of

    template = template_of(flat)
    ops = [(n, template) for n in template.nodes] if template is not None else []
    seen: set = set()
    for n in flat.nodes:
        if "composite" in n.meta:
            continue
        if n.kind in (NodeKind.SEND, NodeKind.RECV) and n.collective is not None:
            c = n.collective
            key = ("p2p", n.kind, c.communicator, c.bytes_in, c.bytes_out, c.dtype)
        else:
            t = n.meta.get("template")
            key = ("node", n.id) if t is None else ("copy", t)
        if key not in seen:
            seen.add(key)
            ops.append((n, flat))
    return ops


def _effect(item: str, key: str, flat: WorkloadGraph, ops, priced: list[float],
            before: list[float], without, full, memory_bytes) -> dict:
    changed = [(n, b, a) for (n, _), b, a in zip(ops, before, priced)
               if abs(a - b) > SAME * max(abs(a), abs(b))]
    if changed:
        colls = sum(1 for n, _, _ in changed if n.collective is not None)
        was, now = sum(b for _, b, _ in changed), sum(a for _, _, a in changed)
        change = f"; their summed time {_change(now / was)}" if was > 0 else ""
        note = ""
        nccl = full.spec.kind == "gpu" and not full.spec.torus
        if nccl and key.endswith("latency") and key not in without.spec.sources:
            # the spec states no latency: NCCL's own per protocol and link apply, which
            # a stated one replaces (a figure above them is slower, whatever the default)
            note = ("; it replaces NCCL's own per-step latencies (0.6-4 us on NVLink, "
                    "2.7-14 us on the network by protocol), which the spec does not state")
        return _row(item, "applied", f"re-priced {len(changed)} of {len(ops)} distinct ops "
                                     f"({colls} collectives, {len(changed) - colls} compute)"
                                     f"{change}{note}", repriced_ops=len(changed),
                    repriced_time_ratio=now / was if was > 0 else None)
    if full.spec.hbm_capacity != without.spec.hbm_capacity and memory_bytes is not None:
        def verdict(cap):
            return (f"{'fits' if memory_bytes <= cap else 'out of memory'} "
                    f"({_gib(memory_bytes)} of {_gib(cap)})")

        return _row(item, "memory only",
                    f"no op's time depends on it; memory {verdict(full.spec.hbm_capacity)}, "
                    f"with the spec's capacity {verdict(without.spec.hbm_capacity)}")
    if full.spec.peak("bf16") != without.spec.peak("bf16"):
        return _row(item, "utilization only",
                    f"no op's time changed ({_gemm_dtypes(flat)}); MFU and HFU are quoted "
                    f"against the bf16 peak it sets")
    return _row(item, "none", _why_nothing(key, flat, full.spec))


def _row(item: str, effect: str, detail: str, **figures) -> dict:
    return {"what_if": item, "effect": effect, "detail": detail, **figures}


def describe(effect: dict) -> str:
    """One line: 'nic_bandwidth=800Gb/s changed nothing: no collective crosses ...'."""
    verb = {"none": "changed nothing", "applied": "applied",
            "memory only": "changed the memory verdict only",
            "utilization only": "changed MFU/HFU only"}[effect["effect"]]
    return f"{effect['what_if']} {verb}: {effect['detail']}"


def _same_spec(a, b) -> bool:
    """Equal figures (the `sources` a what-if stamps on a figure aside)."""
    return all(getattr(a, f.name) == getattr(b, f.name) for f in fields(a)
               if f.name != "sources")


def _why_nothing(key: str, flat: WorkloadGraph, spec) -> str:
    """What the run lacks for the figure `key` to matter."""
    from flint.hardware_models.composite import template_of

    graphs = [g for g in (flat, template_of(flat)) if g is not None]
    spans = [_domains(g, c, spec) for g in graphs for c in _used_communicators(g)]
    link = spec.scale_up_link if not spec.torus else "ICI"
    if key in SCALE_OUT + SCALE_UP + ("nccl_protocol",) and not spans:
        return "this run has no collectives"
    if key == "nccl_protocol":
        return ("NCCL's tuner picks that protocol for every collective of this run anyway "
                "(or none of them runs on NCCL)")
    if key in SCALE_OUT:
        if all(k == 1 for k, _ in spans):
            return (f"no collective crosses a node in this run (every group stays inside "
                    f"one {spec.scale_up_domain}-device {link} domain)")
        return ("no collective of this run is bound by it (those crossing nodes are bound "
                "by latency or NCCL's protocol rate caps)")
    if key in SCALE_UP:
        if all(m == 1 for _, m in spans):
            return (f"no collective of this run has two ranks in one {link} domain (every "
                    f"group spreads one rank per domain)")
        return (f"no collective of this run is bound by it (those inside a {link} domain "
                f"are bound by latency or NCCL's protocol rate caps)")
    if key in PLACEMENT:
        return "no collective group of this run spans a different set of domains with it"
    if key.startswith("peak_"):
        return f"no GEMM of this run runs in {key[5:]} ({_gemm_dtypes(flat)})"
    return f"no op of this run is priced with {key}"


def _used_communicators(g: WorkloadGraph):
    used = {n.collective.communicator for n in g.nodes if n.collective is not None}
    return [g.communicators[c] for c in sorted(used)]


def _domains(g: WorkloadGraph, comm, spec) -> tuple[int, int]:
    """(scale-up domains the communicator's first group touches, most ranks it has in one
    domain); pairs: over every pair."""
    import numpy as np

    domain = max(int(spec.scale_up_domain), 1)
    groups = comm.groups()
    if groups.size == 0:
        return 1, 1
    rows = groups if comm.kind == "pairs" else groups[:1]
    spanned, most = 1, 1
    for row in rows:
        _, counts = np.unique(np.asarray(row, dtype=np.int64) // domain, return_counts=True)
        spanned, most = max(spanned, len(counts)), max(most, int(counts.max()))
    return spanned, most


def _gemm_dtypes(flat: WorkloadGraph) -> str:
    from flint.hardware_models.composite import template_of

    counts: dict[str, int] = {}
    for g in (flat, template_of(flat)):
        for n in (g.nodes if g is not None else ()):
            if n.op_class == "gemm" and n.operands:
                d = n.operands[0].split("[", 1)[0]
                counts[d] = counts.get(d, 0) + 1
    return "its GEMMs: " + (", ".join(f"{d} x {c}" for d, c in sorted(counts.items()))
                            or "none")


def _change(ratio: float) -> str:
    return f"{100 * (ratio - 1):+.2f}%" if 0.5 < ratio < 2 else f"x{ratio:.3g}"


def _gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.1f} GiB"
