"""Composite nodes: nodes of a layer-granular graph that stand for blocks of a template.

`passes.layer_template.LayerTemplate` writes a whole model's step as one forward and one
backward node per layer (plus the embedding, the head, and the once-per-step work) from a
few extracted layers. Those nodes carry no time and no flops of their own: each names the
template block it stands for and a scale (`meta["composite"] = {"block": "F:layer",
"scale": 1.0}`), and the template graph itself travels with the layered graph (meta
`layer_template.template`). Prices are made here, for the cost model in hand, every time
a graph is priced; a layered graph is never priced for one spec and estimated on another.

A block's time is its template nodes' time on the compute stream when the template runs
one microbatch alone: the compute nodes of the block plus the waits on its own
tensor/context-parallel collectives (the once-per-step gradient reduction is left out:
the layered graph carries it as collectives of its own) and on the host's launches of its
kernels (frameworks that launch from the host: a block of short kernels is launch-bound,
and its op-class split says so, `host_launch`, rather than calling that time a collective). The forward and backward of a model's
first and last layers are the template's first and last layers'; those of every other
layer are the mean of the template's interior layers.

Known limit: a block's waits are the compute stream's idle time since the previous
block's last node, so slack that one resource what-if opens in one block (a faster
embedding) can show up as a longer wait in the next; with a template of 2 layers (no
interior layer) the model's many layers inherit that shift, and a faster resource can
price a step up to a few tenths of a percent slower. Templates of 3 or more layers (the
engine's dense templates) keep it well below that. The host's kernel launches shift slack
the same way (a long kernel lets the host run ahead, so the next block's short kernels
wait less), and so does a pipeline whose stages run different blocks: the metamorphic
tests (tests/test_metamorphic*.py) bound the effect at 0.1% of the step.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable

from flint.errors import FlintError
from flint.graph import Node, NodeKind, WorkloadGraph

LAYER = "layer"           # the representative layer in composite block names ("F:layer")
WAIT = "collective"       # the class a block's waits on its own collectives are counted in
# the class of a block's waits for the host to launch its kernels (PyTorch's eager launch
# thread, schedule.py): GPU time no kernel and no collective holds
LAUNCH = "host_launch"


@dataclass(frozen=True)
class BlockPrices:
    """Seconds per template block ("F:layer", "B:head", "pre", ...), per block the seconds
    by op class (what a per-class breakdown of a layered graph reports), and per block the
    seconds its own collectives hold the device's collective channels (what other
    collectives of the device queue behind, as they would behind the template's)."""

    seconds: dict
    by_class: dict
    network: dict           # block -> {link class: seconds}
    # block -> ((template compute node, its seconds per execution of the block), ...): how
    # a block and a collective beside it slow each other is its kernels' (interference)
    kernels: dict = field(default_factory=dict)

    def network_time(self, composite: dict) -> dict[str, float]:
        """{link class (hardware_models.links): seconds} the block holds of them."""
        scale = float(composite.get("scale", 1.0))
        return {k: v * scale for k, v in self.network.get(composite["block"], {}).items()}

    def time(self, composite: dict) -> float:
        # a block the template has no node in (no embedding work on this stage) takes 0
        return self.seconds.get(composite["block"], 0.0) * float(composite.get("scale", 1.0))

    def classes(self, composite: dict) -> dict[str, float]:
        """The block's op-class split of one execution of the node."""
        scale = float(composite.get("scale", 1.0))
        return {k: v * scale for k, v in self.by_class.get(composite["block"], {}).items()}


_PARSED: dict[int, tuple[dict, WorkloadGraph]] = {}


def interior(indices: list[int]) -> list[int]:
    """The template layers that stand for the model's middle layers."""
    return list(indices[1:-1]) or list(indices)


def template_of(graph: WorkloadGraph) -> WorkloadGraph | None:
    """The template a layered graph's composite nodes stand for (None for other graphs)."""
    info = graph.meta.get("layer_template")
    doc = info.get("template") if isinstance(info, dict) else None
    if doc is None:
        if any("composite" in n.meta for n in graph.nodes):
            raise FlintError("the graph has composite (layer-template) nodes but not the "
                             "template they stand for: it cannot be priced")
        return None
    hit = _PARSED.get(id(doc))
    if hit is None or hit[0] is not doc:
        if len(_PARSED) > 8:
            _PARSED.clear()
        hit = (doc, WorkloadGraph.from_json(doc))
        _PARSED[id(doc)] = hit
    return hit[1]


def price_blocks(template: WorkloadGraph, node_time: Callable[[Node], float],
                 slowdown=None, links_of=None, gaps=None, comm_slowdown=None) -> BlockPrices:
    """Every block's seconds (and split by op class) with `node_time(template node)`;
    `slowdown(node, collective)`: how compute overlapping the block's own collectives
    slows (the cost model's overlap_slowdown), as in hardware_models.estimate;
    `links_of(collective)`: the link classes it uses (hardware_models.links; None: all);
    `gaps`: its nodes' launch gaps (schedule.launch_gaps); `comm_slowdown(collective,
    node)`: how the compute beside a collective slows it (contention.py)."""
    from flint.hardware_models.links import BOTH, node_links
    from flint.hardware_models.contention import contended

    blocks = [n.meta.get("block", "") for n in template.nodes]
    durations = [node_time(n) for n in template.nodes]
    # the gradient reduction's collectives run in the layered graph's own nodes; its
    # compute (casts, scaling of the reduced gradients) is priced as "R:<layer>" blocks;
    # so do parameter gathers held for the step ("G", passes.layer_gathers)
    quiet = [0.0 if b.startswith("R") or b == "G" else d for b, d in zip(blocks, durations)]
    # collectives hold their device's link classes, as in the step's own schedule
    # (estimate: links=collective_links): a collective on a stream of its own (FSDP2's
    # all-gather stream) on the NIC and one on the collectives stream over NVLink run at
    # once inside a block as they do between blocks. (Two on the one collectives stream
    # still run in turn, whatever their links.)
    tl = contended(template, quiet, slowdown, comm_slowdown,
                   links=node_links(template, links_of), gaps=gaps)
    seconds: dict[str, float] = defaultdict(float)
    by_class: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    spans: dict[str, list] = defaultdict(list)
    for i, s in enumerate(tl.stream):
        # every collective off the compute stream holds its links in the step's schedule
        # (schedule.simulate), those on a framework's own stream (FSDP2's all-gathers) too
        node = template.nodes[i]
        if (s != "compute" and node.collective is not None and tl.finish[i] > tl.start[i]
                and node.kind not in (NodeKind.SEND, NodeKind.RECV)):
            for link in (links_of(node) if links_of else BOTH):
                spans[link].append((tl.start[i], tl.finish[i]))
    busy = {link: _Intervals(v) for link, v in spans.items()}
    network: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    kernels: dict[str, list] = defaultdict(list)
    last = 0.0
    order = sorted((i for i, s in enumerate(tl.stream) if s == "compute"),
                   key=lambda i: (tl.start[i], i))
    for i in order:
        block = blocks[i]
        if block.startswith("R"):
            if template.nodes[i].collective is not None:
                # a synchronous reduction (libtpu's): the layered graph's own node runs it
                continue
            seconds[block] += durations[i]
            by_class[block][str(template.nodes[i].op_class)] += durations[i]
            if durations[i] > 0:
                kernels[block].append((template.nodes[i], durations[i]))
        else:
            wait = max(tl.start[i] - last, 0.0)
            launch = min(tl.launch_wait[i], wait) if tl.launch_wait else 0.0
            ran = tl.finish[i] - tl.start[i]
            seconds[block] += ran + wait
            by_class[block][str(template.nodes[i].op_class)] += ran
            if durations[i] > 0 and template.nodes[i].collective is None:
                kernels[block].append((template.nodes[i], durations[i]))
            if launch:
                by_class[block][LAUNCH] += launch
            if wait - launch:
                by_class[block][WAIT] += wait - launch
            # the collective channels' busy time while the block ran (its own collectives
            # and those prefetched for it alike): what it holds of them in a layered graph
            for link, held in busy.items():
                network[block][link] += held.overlap(min(last, tl.start[i]), tl.finish[i])
        last = max(last, tl.finish[i])
    # "the layer": the template's interior layers (the first runs beside the embedding,
    # the last beside the head: their collectives overlap other work than a middle
    # layer's), or all of them when the template has no interior layer
    indices = interior(template.meta.get("template_layer_indices") or [])
    for phase in ("F", "B"):
        keys = [f"{phase}:{i}" for i in indices]
        if keys:
            seconds[f"{phase}:{LAYER}"] = sum(seconds.get(k, 0.0) for k in keys) / len(keys)
            mean: dict[str, float] = defaultdict(float)
            for k in keys:
                for cls, v in by_class.get(k, {}).items():
                    mean[cls] += v / len(keys)
            by_class[f"{phase}:{LAYER}"] = mean
            held: dict[str, float] = defaultdict(float)
            for k in keys:
                for link, v in network.get(k, {}).items():
                    held[link] += v / len(keys)
            network[f"{phase}:{LAYER}"] = held
            kernels[f"{phase}:{LAYER}"] = [(n, d / len(keys)) for k in keys
                                           for n, d in kernels.get(k, ())]
    return BlockPrices(dict(seconds), {k: dict(v) for k, v in by_class.items()},
                       {k: dict(v) for k, v in network.items()},
                       {k: tuple(v) for k, v in kernels.items()})


def composite_prices(graph: WorkloadGraph, model) -> BlockPrices | None:
    """The block prices of `graph`'s template under `model` (any CostModel: the template's
    nodes are priced with its node_time, its collectives on the template's communicators,
    whose ranks are those of the first pipeline stage); None when `graph` has none."""
    from flint.hardware_models.links import links_of

    template = template_of(graph)
    if template is None:
        return None
    from flint.hardware_models.schedule import launch_gaps

    return price_blocks(template, lambda n: model.node_time(n, template),
                        getattr(model, "overlap_slowdown", None), links_of(template, model),
                        launch_gaps(template, model), getattr(model, "comm_slowdown", None))


def network_times(flat: WorkloadGraph, prices: BlockPrices | None) -> list | None:
    """Per node of `flat`, {link class: seconds} a composite node holds of its device's
    collective links (0.0 for other nodes; None when the graph has no composite nodes)."""
    if prices is None:
        return None
    return [prices.network_time(n.meta["composite"]) if "composite" in n.meta else 0.0
            for n in flat.nodes]


def composite_slowdown(prices: BlockPrices | None, slowdown):
    """`slowdown(node, collective)` extended to composite nodes: a block slows as its own
    kernels would beside that collective (each by its own factor: a GEMM's tiles fill the
    SMs left in waves, a memory-bound kernel gets its share of HBM), weighted by their
    seconds, and its waits (on its own collectives, on the host's launches) not at all."""
    if prices is None or slowdown is None:
        return slowdown
    return _blockwise(prices, slowdown)


def composite_comm_slowdown(prices: BlockPrices | None, comm_slowdown):
    """`comm_slowdown(collective, node)` extended to composite nodes: a collective beside
    a block moves as it would beside each of the block's kernels, weighted by their
    seconds (beside its waits, at full speed)."""
    if prices is None or comm_slowdown is None:
        return comm_slowdown
    mixed = _blockwise(prices, lambda node, comm: comm_slowdown(comm, node))
    return lambda comm, node: mixed(node, comm)


def _blockwise(prices: BlockPrices, factor):
    """`factor(node, collective)`, a composite node's by its block's kernels."""
    factors: dict = {}

    def mixed(node: Node, comm: Node) -> float:
        composite = node.meta.get("composite")
        if composite is None:
            return factor(node, comm)
        c = comm.collective
        key = (composite["block"], c.type, c.communicator, c.bytes_in) if c else (
            composite["block"], comm.id)
        if key not in factors:
            block = composite["block"]
            total = sum(prices.by_class.get(block, {}).values())
            ran = prices.kernels.get(block, ())
            busy = sum(d for _, d in ran)
            factors[key] = ((sum(d * factor(n, comm) for n, d in ran)
                             + max(total - busy, 0.0)) / total) if total else 1.0
        return factors[key]

    return mixed


class _Intervals:
    """The union of time intervals, for overlap queries."""

    def __init__(self, spans):
        merged: list[list[float]] = []
        for a, b in sorted(spans):
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        self.starts = [a for a, _ in merged]
        self.spans = merged

    def overlap(self, a: float, b: float) -> float:
        from bisect import bisect_right

        k = max(bisect_right(self.starts, a) - 1, 0)
        total = 0.0
        while k < len(self.spans) and self.spans[k][0] < b:
            lo, hi = self.spans[k]
            total += max(min(hi, b) - max(lo, a), 0.0)
            k += 1
        return total
