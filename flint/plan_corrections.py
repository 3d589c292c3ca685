"""How the planner learns from what it prices: predict's numbers for the priced layouts
correct the closed form (flint.plan_model) of the layouts not priced yet.

    corrections.learn(candidate, signature, estimate, row)     # after each predict
    corrections.step(candidate, signature, estimate)           # a corrected step time
    corrections.memory_bytes(candidate, signature, estimate)   # a corrected memory
"""
from __future__ import annotations

import statistics


class Corrections:
    """What predict said of priced layouts, applied to the closed form of the others.

    Step time: a layout whose stage program was priced takes that program's ratio
    predict / closed form (of the same pipeline shape if priced, else the program's
    median); any other layout takes the smallest ratio seen so far: an optimistic
    estimate, so a layout the closed form misjudges is not passed over on another
    program's evidence (branch and bound: stop only when even the optimistic estimate
    is beyond the margin). Memory: the activations' ratio of the nearest priced layout
    (same program and pipeline shape, same program, same remat and micro-batch and
    pipeline kind, same remat, all), weights and optimizer state being exact counts."""

    def __init__(self):
        self.time: dict = {}
        self.memory: dict = {}

    @staticmethod
    def time_levels(c, signature) -> list:
        return [("program", signature, c.pp, c.vp), ("program", signature)]

    @staticmethod
    def memory_levels(c, signature) -> list:
        return [("program", signature, c.pp, c.vp), ("program", signature),
                ("remat", c.remat, c.micro_batch, c.pp > 1, c.vp > 1), ("remat", c.remat),
                ("all",)]

    def learn(self, c, signature, est, row) -> None:
        if row.get("status") != "ok" or est.step_s <= 0:
            return
        t = row["step_time_s"] / est.step_s
        static = est.memory_bytes - est.activations_bytes
        acts = max(est.activations_bytes, 1.0)
        mem = max(row["memory_bytes"] - static, 0.0) / acts
        for level in self.time_levels(c, signature) + [("all",)]:
            self.time.setdefault(level, []).append(t)
        for level in self.memory_levels(c, signature):
            self.memory.setdefault(level, []).append(mem)

    def step(self, c, signature, est) -> float:
        for level in self.time_levels(c, signature):
            if level in self.time:
                return est.step_s * statistics.median(self.time[level])
        seen = self.time.get(("all",))
        return est.step_s * (min(seen) if seen else 1.0)

    def memory_bytes(self, c, signature, est) -> float:
        acts = est.activations_bytes
        for level in self.memory_levels(c, signature):
            if level in self.memory:
                return est.memory_bytes - acts + acts * statistics.median(self.memory[level])
        return est.memory_bytes

    def summary(self) -> dict:
        t, m = self.time.get(("all",)), self.memory.get(("all",))
        return {"step_time_ratio_median": statistics.median(t) if t else None,
                "step_time_ratio_range": [min(t), max(t)] if t else None,
                "activation_memory_ratio_median": statistics.median(m) if m else None}
