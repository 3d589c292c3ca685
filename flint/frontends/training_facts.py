"""The sequence length and batch a graph was extracted at, stated with every report
(`graph.meta["training"]`): a step time means nothing without them.

Flint's zoo records what it built; a user's torch step, the shape of one rank's token
ids ([batch, sequence] integers) times its micro-batches (the backward calls of a step
that accumulates gradients) and the data-parallel ways; a user's JAX step, the
shape of its batch-like integer argument ([global batch, sequence], or [micro-batches,
global micro-batch, sequence] for gradient accumulation). Where no such input
exists, the report says so rather than guess.
"""
from __future__ import annotations

import math
import re

from flint.frontends.sharding_report import NOT_DATA_DIMS, is_batch_path

# token ids: [batch, sequence], or [micro-batches, batch, sequence] (leading dims multiply)
_INT_SHAPE = re.compile(r"^[su](?:8|16|32|64)\[((?:\d+,){1,2})(\d+)\]$")


def record_training(graph) -> None:
    meta = graph.meta
    if meta.get("training"):
        return
    capture = meta.get("capture") or {}
    if "seq_len" in capture:
        dp = math.prod(s for a, s in graph.cluster.mesh if a not in NOT_DATA_DIMS)
        per_rank = capture["batch_per_rank"]
        meta["training"] = {"seq_len": capture["seq_len"], "batch_per_replica": per_rank,
                            "global_batch": per_rank * dp, "source": "one rank's token ids"}
        if capture.get("micro_batches", 1) > 1:
            meta["training"]["micro_batches"] = capture["micro_batches"]
            meta["training"]["source"] += (f" x {capture['micro_batches']} micro-batches "
                                           f"(backward calls)")
        return
    for name, shape, *_ in meta.get("arguments_sharding") or []:
        m = _INT_SHAPE.match(shape)
        if m and is_batch_path(name):
            lead = [int(d) for d in m.group(1).rstrip(",").split(",")]
            meta["training"] = {"seq_len": int(m.group(2)), "global_batch": math.prod(lead),
                                "source": f"argument {name}"}
            return
