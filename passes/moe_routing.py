"""Routing skew for mixture-of-experts graphs: per-expert token counts as a distribution.

A MoE program (flint.models.moe) is compiled with every expert taking the balanced share of
tokens, as vendors' benchmarks force it. Real routers are not balanced: DeepSeek's
auxiliary-loss-free balancing paper (Wang et al. 2024, arXiv 2408.15664, Fig. 1 and Table
2) reports "MaxVio" (hottest expert's load over the mean, minus 1) of 0.7 to 2+ in training
without a balancing loss and 0.04 to 0.4 with one. This pass re-prices one step for a given
distribution of tokens over experts:

- `balanced`: every expert gets tokens x top_k / experts;
- `zipf:S`: expert popularity follows a Zipf law of exponent S (share of the r-th most
  popular expert proportional to r^-S), popularity ranks placed on expert ids by a seeded
  permutation (the router does not know the EP layout);
- `imbalance:F`: the hottest expert takes F times the mean load (F = MaxVio + 1), the
  others share the rest evenly;
- `histogram:c0,c1,...` or `histogram:FILE` (a JSON list or one number per line): relative
  token counts per expert, in expert-id order.

Experts sit on EP ranks contiguously (rank r holds experts r*E/ep ... (r+1)*E/ep - 1, as
Megatron-Core and the zoo model place them). Every source rank routes by the same
distribution, so rank r receives ep x P_r times a balanced rank's tokens, P_r being its
experts' share. Each MoE layer's all-to-all synchronizes the EP group, so every layer waits
for the straggler (the rank with the largest P_r): the pass prices the graph (one program
for every rank) at the straggler's load, the same distribution in every layer.

Dropless routing (capacity_factor 0): the straggler's expert GEMMs become a grouped GEMM
whose per-expert row counts are its experts' token counts (meta `grouped_gemm`: problems
[m, n, k], priced tile by tile by hardware_models/grouped_gemm.py); the element-wise work
between them and both all-to-alls scale by the straggler's factor (it receives that many
tokens in the dispatch and sends them back in the combine). Token dropping (capacity
factor > 0): shapes stay padded to capacity, so times do not change; the dropped share of
tokens is reported.

The exact per-pair traffic goes with each MoE all-to-all (meta `moe_all_to_all`: the
balanced bytes per rank, every EP rank's load, and whether it carries tokens into the
experts): in a dispatch rank i sends rank j balanced/ep x load_j bytes, in a combine
balanced/ep x load_i. The Chakra exporter writes it as per-peer sends and receives
(flint/exporters/chakra_alltoallv.py), an all-to-all-v with each rank's own sizes; the
expert nodes keep what `at_rank` needs to price them for any EP rank (meta `moe_expert`,
the report's `expert_shares`), so that each rank's file runs its own experts' tokens.

Contract: input a per-device graph with nodes in `.../moe/experts` scopes and (with EP) all-
to-alls in `.../moe/dispatch` and `.../moe/combine`; output a copy whose expert nodes and
MoE all-to-alls carry the straggler's work, with meta["moe_routing"] the report (experts,
ep, the per-expert and per-rank loads, straggler factor, all-to-all bytes per rank,
dropped share). Raises FlintError on a malformed distribution or a graph without experts.
"""
from __future__ import annotations

import copy
import json
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from flint.errors import FlintError
from flint.graph import WorkloadGraph

KINDS = ("balanced", "zipf", "imbalance", "histogram")
MAX_EXPERTS = 1 << 16


def expert_shares(distribution: str, experts: int, seed: int = 0) -> np.ndarray:
    """Share of the routed tokens each expert gets (sums to 1), in expert-id order."""
    kind, _, arg = distribution.partition(":")
    kind = kind.strip().lower()
    if kind not in KINDS:
        raise FlintError(f"routing distribution {distribution!r}: use balanced | zipf:S | "
                         f"imbalance:F | histogram:c0,c1,... | histogram:FILE")
    if kind == "balanced":
        return np.full(experts, 1.0 / experts)
    if kind == "histogram":
        counts = _histogram(arg)
        if len(counts) != experts:
            raise FlintError(f"routing histogram has {len(counts)} counts for {experts} experts")
        return counts / counts.sum()
    try:
        value = float(arg)
    except ValueError:
        raise FlintError(f"routing distribution {distribution!r}: {kind} needs a number, "
                         f"e.g. {kind}:1.2") from None
    if kind == "zipf":
        if not 0.0 <= value <= 8.0:
            raise FlintError(f"zipf exponent must be in 0..8, got {value}")
        by_rank = np.arange(1, experts + 1, dtype=float) ** -value
        order = np.random.default_rng(seed).permutation(experts)
        shares = np.empty(experts)
        shares[order] = by_rank
        return shares / shares.sum()
    if not 1.0 <= value <= experts:
        raise FlintError(f"imbalance factor (hottest expert / mean) must be in 1..{experts}, "
                         f"got {value}")
    shares = np.full(experts, (1.0 - value / experts) / max(experts - 1, 1))
    shares[int(np.random.default_rng(seed).integers(experts))] = value / experts
    return shares / shares.sum()


def _histogram(arg: str) -> np.ndarray:
    text = arg
    if arg and not any(c in arg for c in ",") and Path(arg).is_file():
        text = Path(arg).read_text(errors="replace")
        try:
            doc = json.loads(text)
            text = ",".join(str(x) for x in doc) if isinstance(doc, list) else text
        except ValueError:
            text = text.replace("\n", ",")
    try:
        counts = np.array([float(x) for x in text.split(",") if x.strip()])
    except ValueError:
        raise FlintError(f"routing histogram: not a list of numbers: {arg[:60]!r}") from None
    if not len(counts) or len(counts) > MAX_EXPERTS or (counts < 0).any() or \
            not np.isfinite(counts).all() or counts.sum() <= 0:
        raise FlintError("routing histogram: give one count >= 0 per expert, not all zero")
    return counts


@dataclass(frozen=True)
class MoeRouting:
    distribution: str = "balanced"
    seed: int = 0
    dropless: bool = True        # False: capacity-padded shapes (token dropping)
    capacity_factor: float = 1.0  # with dropping: each expert's buffer / balanced share
    top_k: int = 0               # for the report (and hierarchical all-to-all dedup)
    # DeepEP/HybridEP send a token once per remote node (the network model deduplicates
    # top-k copies across nodes); NCCL's all-to-all dispatcher (Megatron-Core's default
    # `alltoall`) sends every copy
    deduplicate: bool = True
    name: str = "moe-routing"

    @classmethod
    def for_graph(cls, graph: WorkloadGraph, distribution: str, seed: int = 0,
                  deduplicate: bool = True) -> "MoeRouting":
        """The pass for a graph whose meta["moe"] (written at extraction) says top_k and
        the capacity factor."""
        moe = graph.meta.get("moe") or {}
        cf = float(moe.get("capacity_factor") or 0.0)
        return cls(distribution, seed, dropless=not cf, capacity_factor=cf or 1.0,
                   top_k=int(moe.get("top_k") or 0), deduplicate=deduplicate)

    def run(self, graph: WorkloadGraph) -> WorkloadGraph:
        experts_nodes = [n for n in graph.nodes if "moe/experts" in str(n.meta.get("scope", ""))]
        gemms = [n for n in experts_nodes if n.op_class == "gemm"]
        if not gemms:
            raise FlintError("moe-routing: the graph has no expert GEMMs (moe/experts scope)")
        a2a = [n for n in graph.nodes if n.collective is not None
               and n.collective.type in ("all-to-all", "ragged-all-to-all")
               and any(s in str(n.meta.get("scope", "")) for s in ("moe/dispatch", "moe/combine"))]
        ep = graph.communicator(a2a[0]).size if a2a else 1
        local = _expert_dims(gemms[0])[0] if gemms[0].outputs else 1
        experts = local * ep
        shares = expert_shares(self.distribution, experts, self.seed)
        rank_share = shares.reshape(ep, local).sum(axis=1)
        straggler = int(np.argmax(rank_share))
        factor = float(rank_share[straggler] * ep)          # straggler tokens / balanced
        mine = shares[straggler * local:(straggler + 1) * local] * experts   # per expert
        dropped = (float(np.maximum(shares * experts - self.capacity_factor, 0).sum() / experts)
                   if not self.dropless else 0.0)
        scale = factor if self.dropless else 1.0
        nodes = []
        tokens_dim = _token_rows(gemms, local)
        expert_ids, a2a_ids = {n.id for n in experts_nodes}, {n.id for n in a2a}
        for n in graph.nodes:
            node = n
            if n.id in expert_ids and self.dropless:
                node = copy.copy(n)
                node.meta = dict(n.meta)
                if n.op_class == "gemm":
                    axis = _grouped(node, mine, tokens_dim)
                    if axis is not None:
                        node.meta["moe_expert"] = {"token_axis": axis, "rows": tokens_dim}
                else:
                    _scale(node, scale)
                    node.meta["moe_expert"] = {"scale": scale}
            elif n.id in a2a_ids:
                node = copy.copy(n)
                node.meta = (dict(n.meta, moe_top_k=self.top_k)
                             if self.top_k and self.deduplicate else dict(n.meta))
                c = n.collective
                if self.dropless:
                    node.meta["moe_all_to_all"] = {
                        "balanced_bytes": c.bytes_in, "into_experts": _into_experts(n),
                        "rank_load": [float(x * ep) for x in rank_share]}
                node.collective = replace(c, bytes_in=int(round(c.bytes_in * scale)),
                                          bytes_out=int(round(c.bytes_out * scale)))
            nodes.append(node)
        balanced = [n.collective.bytes_in for n in a2a]
        report = {"distribution": self.distribution, "seed": self.seed, "experts": experts,
                  "ep": ep, "local_experts": local, "top_k": self.top_k,
                  "dropless": self.dropless, "capacity_factor": self.capacity_factor,
                  "max_over_mean_expert": float(shares.max() * experts),
                  "rank_load": [float(x * ep) for x in rank_share],
                  "straggler_rank": straggler, "straggler_factor": factor,
                  "all_to_all_count": len(a2a),
                  "all_to_all_balanced_bytes_per_rank": max(balanced, default=0),
                  "all_to_all_straggler_bytes_per_rank": int(round(max(balanced, default=0)
                                                                   * scale)),
                  "dropped_token_share": dropped,
                  "expert_shares": [float(x) for x in shares]}
        meta = copy.deepcopy(graph.meta)
        meta["moe_routing"] = report
        return WorkloadGraph(graph.cluster, nodes, list(graph.communicators),
                             list(graph.loops), meta)


def _into_experts(node) -> bool:
    """Whether an all-to-all carries tokens to their experts (the forward dispatch, the
    backward of the combine) rather than back from them."""
    dispatch = "moe/dispatch" in str(node.meta.get("scope", ""))
    return dispatch != (node.meta.get("phase") == "backward")


def _dims(shape: str) -> list[int]:
    inner = shape.split("[", 1)[1].split("]", 1)[0] if "[" in shape else ""
    return [int(d) for d in inner.split(",") if d.strip().isdigit()]


def _expert_dims(node) -> list[int]:
    """[local experts, rows, cols] of an expert GEMM's output (XLA drops a unit expert
    dim when a rank holds one expert)."""
    d = _dims(node.outputs[0]) if node.outputs else []
    return [1] + d if len(d) == 2 else d


def _token_rows(gemms, local: int) -> int:
    """The compiled rows per expert: the forward gate/up GEMMs' M (their output is
    [local experts, tokens, f]; the most common second dim over forward expert GEMMs)."""
    seen: dict[int, int] = {}
    for n in gemms:
        d = _expert_dims(n)
        if len(d) == 3 and d[0] == local and n.meta.get("phase", "forward") == "forward":
            seen[d[1]] = seen.get(d[1], 0) + 1
    if not seen:
        raise FlintError("moe-routing: cannot tell the expert GEMMs' token dimension")
    return max(seen, key=lambda m: (seen[m], m))


def _grouped(node, per_expert: np.ndarray, rows: int) -> int | None:
    """One expert GEMM node -> a grouped GEMM of the straggler's per-expert token counts.
    The token count is M for the forward and input-gradient GEMMs, K for the weight
    gradients ([experts, d, f] outputs). Returns which of [m, n, k] holds the tokens."""
    d = _expert_dims(node)
    if len(d) != 3 or not node.flops:
        return None
    e, m, n = d
    k = max(1, round(node.flops / (2.0 * e * m * n)))
    axis = 0 if m == rows else 2 if k == rows else 1 if n == rows else None
    if axis is None:
        return None
    _set_problems(node, [[m, n, k]] * e, per_expert, rows, axis)
    return axis


def _set_problems(node, problems: list, per_expert, rows: int, axis: int) -> None:
    """Give `node` the grouped problems whose `axis` is each expert's token count."""
    counts = [max(0, round(rows * float(x))) for x in per_expert[:len(problems)]]
    problems = [[c if i == axis else v for i, v in enumerate(p)]
                for p, c in zip(problems, counts)]
    flops = sum(2.0 * a * b * c for a, b, c in problems)
    ratio = flops / node.flops if node.flops else 1.0
    node.flops = flops
    node.bytes_read *= ratio
    node.bytes_written *= ratio
    node.meta["grouped_gemm"] = problems


def _scale(node, factor: float) -> None:
    node.flops *= factor
    node.transcendentals *= factor
    node.bytes_read *= factor
    node.bytes_written *= factor


def at_rank(node, report: dict, position: int):
    """A routed expert node as EP rank `position` runs it (the pass prices the
    straggler's): its own experts' token counts, or its load for element-wise work. The
    node itself when it is no expert node."""
    info = node.meta.get("moe_expert")
    if not isinstance(info, dict):
        return node
    out = copy.copy(node)
    out.meta = dict(node.meta)
    if "token_axis" in info:
        local, experts = int(report["local_experts"]), int(report["experts"])
        shares = np.asarray(report["expert_shares"], dtype=float)
        mine = shares[position * local:(position + 1) * local] * experts
        _set_problems(out, node.meta["grouped_gemm"], mine, int(info["rows"]),
                      int(info["token_axis"]))
    else:
        _scale(out, float(report["rank_load"][position]) / float(info["scale"] or 1.0))
    return out
