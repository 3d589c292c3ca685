"""Per-dimension latencies for ASTRA-sim that reproduce Flint's own latency terms.

Flint prices a GPU collective as NCCL's tuner does: a base launch latency, per-step latency
of the protocol it picks (LL for small messages, Simple for large), and the bandwidth term.
ASTRA-sim's analytical network has one latency per link and dimension, charged on every
step of its algorithm. So the latency written for each dimension is the one that makes
ASTRA-sim's latency terms add up to Flint's over this graph's collectives: Flint's time
minus its bandwidth-only time is the latency a collective pays; each collective spans some
dimensions, where ASTRA-sim's algorithm takes a known number of steps (a point-to-point
transfer: one). Each dimension's per-link latency is the latency its collectives pay in
Flint, summed over the step (times how often each runs; a collective spanning several
dimensions split by their step counts), over the link-steps ASTRA-sim charges there: the
totals agree exactly, single collectives only on average (NCCL's launch latency is per
collective, ASTRA-sim's per step).
"""
from __future__ import annotations

import math
from dataclasses import replace

STEPS = {  # ASTRA-sim algorithm -> steps on a dimension of n ranks, per collective family
    "ring": {"all-reduce": lambda n: 2 * (n - 1), "all-gather": lambda n: n - 1,
             "reduce-scatter": lambda n: n - 1, "all-to-all": lambda n: n - 1},
    "halvingDoubling": {"all-reduce": lambda n: 2 * math.ceil(math.log2(n)),
                        "all-gather": lambda n: math.ceil(math.log2(n)),
                        "reduce-scatter": lambda n: math.ceil(math.log2(n)),
                        "all-to-all": lambda n: n - 1},
    "direct": {"all-reduce": lambda n: 2, "all-gather": lambda n: 1,
               "reduce-scatter": lambda n: 1, "all-to-all": lambda n: 1},
}
POINT_TO_POINT = ("collective-permute", "send", "recv")
LINKS = {"Switch": 2, "Ring": 1}   # links per step that ASTRA-sim charges latency on


def matched_latencies(network, dims: list[dict], algorithms: dict, flat, durations,
                      families: dict, simulated) -> list[dict]:
    """`dims` with each dimension's `latency_ns` fitted to Flint's latency terms."""
    if flat is None or not getattr(network, "nccl", False):
        return dims
    free = replace(network, latency_free=True)
    paid = [0.0] * len(dims)         # seconds of latency Flint charges, per dimension
    charged = [0.0] * len(dims)      # link-steps ASTRA-sim charges latency on
    for node, t in zip(flat.nodes, durations):
        c = node.collective
        p2p = c is not None and c.type in POINT_TO_POINT
        if c is None or not (p2p or (c.type in simulated and c.type in families)):
            continue
        comm = flat.communicators[c.communicator]
        if comm.kind != "groups" and not p2p:
            continue
        spans = spanned_dimensions(network, comm, dims)
        latency = t - free.time(node, comm)
        if not spans or latency <= 0:
            continue
        steps = {d: (1 if p2p else STEPS.get(algorithms[families[c.type]][d], STEPS["ring"])
                     [families[c.type]](dims[d]["npus"])) * LINKS.get(dims[d]["topology"], 1)
                 for d in spans}
        total = sum(steps.values())
        runs = max(node.repeat, 1)
        for d, k in steps.items():
            paid[d] += latency * k / total * runs
            charged[d] += k * runs
    out = []
    for d, dim in enumerate(dims):
        if charged[d] and paid[d] > 0:
            dim = dict(dim, latency_ns=float(paid[d] / charged[d] * 1e9))
        out.append(dim)
    return out


def spanned_dimensions(network, comm, dims: list[dict]) -> list[int]:
    """Indices of the dimensions the first group of `comm` spans (ranks fill dimension 0
    first, so rank r's coordinate in dimension i is r // prod(npus before i) % npus_i)."""
    group = comm.groups()[0]
    out, stride = [], 1
    for i, d in enumerate(dims):
        coords = {(int(r) // stride) % d["npus"] for r in group}
        if len(coords) > 1:
            out.append(i)
        stride *= d["npus"]
    return out
