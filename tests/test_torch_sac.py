"""Selective activation checkpointing (torch.utils.checkpoint with a SAC context_fn) in
the torch front end: the ops a policy marks for recompute run again in the backward and
their outputs are no longer saved; programs without a SAC policy are untouched."""
import functools

import pytest
import torch
from torch import nn

import flint.torch as ft
from flint.hardware_models.estimate import estimate


class _Block(nn.Module):
    """Three matmuls with pointwise ops between them; `policy` None: no checkpointing,
    "op": torchtitan's op policy (every second matmul and all pointwise ops recomputed),
    "recompute-all": every op recomputed (SAC's equivalent of full checkpointing)."""

    def __init__(self, policy):
        super().__init__()
        self.policy = policy
        self.a, self.b, self.c = (nn.Linear(256, 256, bias=False) for _ in range(3))

    def _math(self, x):
        return self.c(torch.relu(self.b(torch.nn.functional.silu(self.a(x))))) + x

    def forward(self, x):
        if self.policy is None:
            return self._math(x)
        from torch.utils.checkpoint import (CheckpointPolicy, checkpoint,
                                            create_selective_checkpoint_contexts)
        counts = {}

        def policy(ctx, func, *args, **kwargs):
            if self.policy == "recompute-all":
                return CheckpointPolicy.PREFER_RECOMPUTE
            key = "recompute" if ctx.is_recompute else "forward"
            if func == torch.ops.aten.mm.default:
                counts[key] = counts.get(key, 0) + 1
                if counts[key] % 2 == 0:
                    return CheckpointPolicy.PREFER_RECOMPUTE
                return CheckpointPolicy.MUST_SAVE
            return CheckpointPolicy.PREFER_RECOMPUTE

        return checkpoint(self._math, x, use_reentrant=False,
                          context_fn=functools.partial(create_selective_checkpoint_contexts,
                                                       policy))


def _graph(policy):
    def model():        # four blocks: the saved activations of all four meet the backward
        return nn.Sequential(*(_Block(policy) for _ in range(4)))
    x = torch.empty(16384, 256, device="meta")
    return ft.extract(model, (x,), world_size=1, fuse=False)


def _count(g, op, phase):
    return sum(1 for n in g.nodes if n.op == op and n.meta.get("phase") == phase)


@pytest.fixture(scope="module")
def graphs():
    return {p: _graph(p) for p in (None, "op", "recompute-all")}


def test_op_policy_recomputes_every_second_matmul_and_the_pointwise_ops(graphs):
    plain, op = graphs[None], graphs["op"]
    # per block 3 weight and 3 input gradients, less the first block's input gradient
    assert _count(plain, "mm", "backward") == 4 * 6 - 1
    # each block's second matmul (b) is recomputed; a and c keep their outputs
    assert _count(op, "mm", "backward") == _count(plain, "mm", "backward") + 4
    for pointwise in ("silu", "relu"):
        assert _count(plain, pointwise, "backward") == 0
        assert _count(op, pointwise, "backward") == 4
    assert op.meta["capture"]["sac_recomputed_ops"] >= 3
    assert "sac_recomputed_ops" not in plain.meta["capture"]


def test_recompute_costs_time_and_saves_memory(graphs):
    est = {p: estimate(g) for p, g in graphs.items()}
    t = {p: e.step_time_s for p, e in est.items()}
    mem = {p: e.memory_bytes for p, e in est.items()}
    assert t[None] < t["op"] < t["recompute-all"]
    assert mem["recompute-all"] < mem["op"] < mem[None]
    # the forward keeps its own shape: the same forward ops in every variant
    assert _count(graphs["op"], "mm", "forward") == _count(graphs[None], "mm", "forward") == 12
