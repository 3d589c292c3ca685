"""The planner's search: prune, rank with the closed form, price the best with predict.

    result = search(request, Budget(candidates=24), out="plan/")
    result.rows            # priced candidates, best first (predict's numbers)

1. flint.plan_space enumerates the layouts that pass the divisibility rules.
2. The memory floor (flint.plan_model: weights, gradients, optimizer state and layer
   inputs, all that any policy must hold) prunes the layouts that cannot fit.
3. The closed form ranks the survivors. Candidates are then priced with
   flint.engine.predict best-first. After each priced candidate the closed form is
   corrected by what predict said (Corrections: a program's own ratio predict / closed
   form where it was priced, else the smallest ratio seen; the activation memory by the
   nearest priced layout's ratio); layouts the corrected memory puts over the device's
   capacity are passed over.
4. Pricing stops at the budget (`candidates` priced, `seconds` of wall time, distinct
   stage `programs` priced: compiled or cached alike, so the same command takes the same
   path whatever the cache holds) or when no remaining layout's corrected estimate
   is within `margin` of the best priced step time (after at least `min_priced`).
Ties break on fewer devices, then less memory, then the layout's fields in order, so a
plan is the same every time. The local executor prices one candidate at a time; `ray`
prices rounds of candidates, one Ray task per stage program, and corrects between rounds.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from flint.errors import FlintError
from flint.plan_corrections import Corrections
from flint.plan_model import Machine, ModelFacts, analytic
from flint.plan_price import LAYOUT, price, price_group, row_key
from flint.plan_space import Candidate, PlanRequest, enumerate_space, model_config

REMAT_ORDER = {"none": 0, "selective": 1, "dots": 2, "full": 3}
DEFAULT_COMPILE_S = 15.0      # a stage program's compile before one is seen (5-20 s)


@dataclass(frozen=True)
class Budget:
    candidates: int = 24       # at most this many priced with predict
    seconds: float = 0.0       # 0: no wall-time bound
    programs: int = 8          # distinct stage programs priced (compiled or cached alike,
                               # so a warm plan takes the cold plan's path)
    margin: float = 0.10       # stop when nothing left is within this of the best
    min_priced: int = 5        # price at least this many (the top-k and a runner-up)


@dataclass
class PlanResult:
    request: PlanRequest
    rows: list                 # priced rows, best first (ok and fitting, then OOM, then failed)
    counts: dict               # raw, invalid, pruned_memory, ranked, priced, ...
    stop_reason: str
    wall_s: float
    analytic_best: list = field(default_factory=list)   # unpriced leaders of the closed form
    corrections: dict = field(default_factory=dict)
    learned: object = field(default=None, repr=False)   # the Corrections (seeds what-ifs)
    programs: frozenset = frozenset()                    # stage programs it priced

    @property
    def fitting(self) -> list:
        return [r for r in self.rows if r["status"] == "ok" and not r["oom"]]

    @property
    def winner(self) -> dict | None:
        return self.fitting[0] if self.fitting else None

    def to_json(self) -> dict:
        return {"request": self.request.to_json(), "rows": self.rows, "counts": self.counts,
                "stop_reason": self.stop_reason, "analytic_best": self.analytic_best,
                "corrections": self.corrections}


def rank_key(row: dict) -> tuple:
    """Best first: fitting before out of memory before failed, then step time, fewer
    devices, less memory, then the layout (deterministic)."""
    ok = row.get("status") == "ok"
    return (0 if ok and not row.get("oom") else 1 if ok else 2,
            row.get("step_time_s", float("inf")) if ok else float("inf"),
            row["devices"], row.get("memory_bytes", 0.0), _layout_order(row))


def _layout_order(d) -> tuple:
    get = d.get if isinstance(d, dict) else lambda k: getattr(d, k)
    return (get("tp"), get("cp"), get("pp"), get("vp"), get("ep"), get("zero"), get("hsdp"),
            get("micro_batch"), REMAT_ORDER.get(get("remat"), 9), get("precision"))


@dataclass
class _Ranked:
    candidate: Candidate
    estimate: object
    signature: tuple


def rank(request: PlanRequest, spec=None):
    """(ranked survivors in closed-form order, counts). `spec`: the request's spec with
    its what-ifs (loaded when None)."""
    from flint.hardware_models.spec import load_spec

    space = enumerate_space(request)
    spec = spec or load_spec(request.hardware, list(request.what_if))
    facts = ModelFacts.of(model_config(request))
    capacity = spec.hbm_capacity
    machine = Machine(spec)
    ranked, pruned, memo = [], 0, {}
    for c in space.candidates:
        est = analytic(c, request, facts, machine, memo)
        if est.memory_floor_bytes > capacity:
            pruned += 1
            continue
        ranked.append(_Ranked(c, est, c.program_signature(request, spec.devices_per_node)))
    ranked.sort(key=lambda r: (r.estimate.step_s, r.candidate))
    counts = {**space.counts, "invalid_reasons": dict(sorted(space.rejected.items())),
              "pruned_memory": pruned, "ranked": len(ranked),
              "programs": len({r.signature for r in ranked})}
    return ranked, counts, capacity


class Search:
    """One plan's pricing loop (flint.plan_search.search wraps it)."""

    def __init__(self, request, budget: Budget, out=None, cache=None, cost_model=None,
                 on_event: Callable | None = None, corrections: Corrections | None = None,
                 free_programs=()):
        self.request, self.budget, self.cost_model = request, budget, cost_model
        self.out = Path(out) if out else None
        self.cache = cache
        self.on_event = on_event or (lambda kind, info: None)
        self.corrections = corrections or Corrections()
        self.rows: dict = {}               # candidate -> row
        self.done = self._load_done()
        self.compile_s: list = []
        self.price_s: list = []
        self.compiled: set = set()        # programs compiled now
        self.programs: set = set()        # programs of the priced candidates
        self.free: set = set(free_programs or ())   # programs the budget does not count
        self.warm: dict = {}

    def _load_done(self) -> dict:
        if self.out is None:
            return {}
        from flint.hardware_models.pluggable import cost_model_name
        from flint.sweep import load_results

        self.out.mkdir(parents=True, exist_ok=True)
        return load_results(self.out, cost_model_name(self.cost_model))

    # --- the loop ---------------------------------------------------------------------
    def run(self, ranked: list, capacity: float, executor: str = "local", workers: int = 2):
        t0 = time.perf_counter()
        self.t0 = t0
        self.capacity = capacity
        remaining = list(ranked)
        reason = ""
        while True:
            picks, reason = self._next(remaining, workers if executor == "ray" else 1)
            if not picks:
                break
            if executor == "ray":
                self._price_round(picks, workers)
            else:
                self._price_one(picks[0])
            remaining = [r for r in remaining if r.candidate not in self.rows]
        return reason, sum(not self._fits(r) for r in remaining)

    def _fits(self, r) -> bool:
        return self.corrections.memory_bytes(r.candidate, r.signature, r.estimate) \
            <= self.capacity

    def _next(self, remaining: list, round_size: int):
        """The next candidates to price and, when there are none, why the search stops."""
        b = self.budget
        priced = len(self.rows)
        if priced >= b.candidates:
            return [], f"candidate budget ({b.candidates}) spent"
        elapsed = time.perf_counter() - self.t0
        if b.seconds and elapsed >= b.seconds:
            return [], f"time budget ({b.seconds:.0f} s) spent"
        fitting = [r["step_time_s"] for r in self.rows.values()
                   if r["status"] == "ok" and not r["oom"]]
        best = min(fitting, default=None)
        order = sorted(remaining, key=lambda r: (
            self.corrections.step(r.candidate, r.signature, r.estimate), r.candidate))
        fit = [r for r in order if self._fits(r)]
        if not fit and best is None:
            # nothing is estimated to fit: price the layouts needing the least memory,
            # so the plan shows how far the best attempt is from fitting
            if priced >= b.min_priced:
                return [], "no layout is estimated to fit in memory"
            fit = sorted(order, key=lambda r: (self.corrections.memory_bytes(
                r.candidate, r.signature, r.estimate), _layout_order(r.candidate)))
        picks, programs = [], set(self.programs)
        for r in fit:
            if len(picks) >= min(round_size, b.candidates - priced):
                break
            corrected = self.corrections.step(r.candidate, r.signature, r.estimate)
            if best is not None and len(fitting) + len(picks) >= b.min_priced and \
                    corrected > best * (1 + b.margin):
                if not picks:
                    return [], (f"no unpriced layout within {b.margin:.0%} of the best "
                                f"(closed form, corrected)")
                break
            if r.signature not in programs and r.signature not in self.free:
                if len(programs - self.free) >= b.programs:
                    continue
                if b.seconds and self.rows and not self._is_warm(r) and \
                        elapsed + self._compile_estimate() > b.seconds:
                    continue
                programs.add(r.signature)
            picks.append(r)
        if not picks:
            return [], ("stage-program budget spent" if len(programs - self.free) >= b.programs
                        else "no candidate left to price")
        return picks, ""

    def _is_warm(self, r) -> bool:
        if r.signature in self.warm:
            return self.warm[r.signature]
        from flint.engine import stage_program
        from flint.template_cache import TemplateCache, default_cache_dir

        try:
            run = r.candidate.run(self.request)
        except FlintError:
            return True                    # priced at once as invalid: no compile
        store = TemplateCache(self.cache) if self.cache else TemplateCache(default_cache_dir())
        warm = store.has(stage_program(run))
        self.warm[r.signature] = warm
        return warm

    def _compile_estimate(self) -> float:
        return statistics.median(self.compile_s) if self.compile_s else DEFAULT_COMPILE_S

    def _job(self, r) -> dict:
        fields = r.candidate.run_fields(self.request)
        est = r.estimate
        return {"run": fields, "what_if": list(self.request.what_if),
                "key": row_key(fields, self.request.what_if),
                "layout": {k: getattr(r.candidate, k) for k in LAYOUT},
                "analytic": {"step_s": est.step_s, "memory_bytes": est.memory_bytes,
                             "memory_floor_bytes": est.memory_floor_bytes}}

    def _record(self, r, row: dict, fresh: bool) -> None:
        self.programs.add(r.signature)
        if row.get("extracted"):
            self.compile_s.append(row["time_s"])
            self.compiled.add(r.signature)
        elif fresh:
            self.price_s.append(row["time_s"])
        self.warm[r.signature] = True
        self.rows[r.candidate] = row
        self.corrections.learn(r.candidate, r.signature, r.estimate, row)
        if fresh and self.out is not None:
            from flint.sweep import append_result

            append_result(self.out, row)
        self.on_event("priced", self.progress(row))

    def progress(self, row=None) -> dict:
        """What the progress bar shows: priced, the budget, time spent and left."""
        b = self.budget
        elapsed = time.perf_counter() - self.t0
        per = statistics.mean(self.price_s) if self.price_s else 1.0
        left = max(b.candidates - len(self.rows), 0) * per
        if b.seconds:
            left = min(left, max(b.seconds - elapsed, 0.0))
        return {"priced": len(self.rows), "total": b.candidates, "elapsed_s": elapsed,
                "left_s": left, "compiled": len(self.compiled), "row": row}

    def _price_one(self, r) -> None:
        job = self._job(r)
        if job["key"] in self.done:
            self._record(r, self.done[job["key"]], fresh=False)
            return
        self.on_event("pricing", {"layout": r.candidate.short(), **self.progress()})
        claims = self._claims()
        if claims is not None and not claims.take(job["key"]):
            claims.take(job["key"], wait=True)      # another plan prices it: wait, read
            self.done = self._load_done()
            claims.release(job["key"])
            if job["key"] in self.done:
                self._record(r, self.done[job["key"]], fresh=False)
                return
        try:
            row, _ = price(job, self.cache, self.cost_model)
            self._record(r, row, fresh=True)
        finally:
            if claims is not None:
                claims.release_all()

    def _claims(self):
        if self.out is None:
            return None
        from flint.sweep import Claims

        if not hasattr(self, "_claim_store"):
            self._claim_store = Claims(self.out)
        return self._claim_store

    def _price_round(self, picks: list, workers: int) -> None:
        """One round on Ray: one task per stage program."""
        from flint.sweep_ray import run_groups

        todo, by_key = {}, {}
        for r in picks:
            job = self._job(r)
            if job["key"] in self.done:
                self._record(r, self.done[job["key"]], fresh=False)
                continue
            todo.setdefault(r.signature, []).append(job)
            by_key[job["key"]] = r
        if not todo:
            return
        cache = str(self.cache) if self.cache else ""
        name = self.cost_model if isinstance(self.cost_model, str) else None
        if self.cost_model is not None and name is None:
            raise FlintError("the ray executor takes a cost model by its module:factory name")
        got = []
        run_groups(cache, list(todo.values()), workers, got.append, price_group, name)
        for row in sorted(got, key=lambda x: x["key"]):   # deterministic order of learning
            self._record(by_key[row["key"]], row, fresh=True)


def search(request: PlanRequest, budget: Budget = Budget(), out=None, cache=None,
           cost_model=None, executor: str = "local", workers: int = 2,
           on_event: Callable | None = None, corrections: Corrections | None = None,
           spec=None, free_programs=()) -> PlanResult:
    """Plan `request`: rank every layout, price the best, return the priced rows best
    first. Several device counts are planned one after another with the budget split
    between them (at least `min_priced` each) and the corrections shared.
    `free_programs`: stage-program signatures the program budget does not count (a
    co-design point's: the baseline's)."""
    if executor not in ("local", "ray"):
        raise FlintError(f"unknown executor {executor!r}; use local or ray")
    t0 = time.perf_counter()
    ranked, counts, capacity = rank(request, spec)
    if not ranked:
        raise FlintError(_nothing_fits(counts))
    on_event = on_event or (lambda kind, info: None)
    on_event("ranked", counts)
    shared = corrections or Corrections()
    counts_per = {}
    rows, reasons, skipped, used = [], [], 0, set()
    per_count = max(budget.candidates // len(request.devices), budget.min_priced)
    for devices in request.devices:
        mine = [r for r in ranked if r.candidate.devices == devices]
        if not mine:
            reasons.append(f"{devices} devices: no layout fits")
            continue
        from dataclasses import replace

        part = replace(budget, candidates=per_count,
                       seconds=max(budget.seconds - (time.perf_counter() - t0), 1.0)
                       if budget.seconds else 0.0)
        s = Search(request, part, out, cache, cost_model, on_event, shared,
                   set(free_programs) | used)
        why, skipped_here = s.run(mine, capacity, executor, workers)
        skipped += skipped_here
        rows += list(s.rows.values())
        used |= s.programs
        reasons.append(why if len(request.devices) == 1 else f"{devices} devices: {why}")
        counts_per[str(devices)] = {"ranked": len(mine), "priced": len(s.rows),
                               "compiled": len(s.compiled), "programs": len(s.programs)}
    rows.sort(key=rank_key)
    priced = {tuple(r[k] for k in LAYOUT) for r in rows}
    leaders = [{**{k: getattr(r.candidate, k) for k in LAYOUT},
                "analytic_step_s": r.estimate.step_s,
                "corrected_step_s": shared.step(r.candidate, r.signature, r.estimate)}
               for r in ranked if tuple(getattr(r.candidate, k) for k in LAYOUT) not in priced][:5]
    counts.update({"priced": len(rows), "skipped_memory": skipped,
                   "programs_priced": len(used),
                   "compiled": sum(v["compiled"] for v in counts_per.values()),
                   "per_device_count": counts_per})
    return PlanResult(request, rows, counts, "; ".join(reasons), time.perf_counter() - t0,
                      leaders, shared.summary(), shared, frozenset(used))


def _nothing_fits(counts: dict) -> str:
    if not counts["valid"]:
        why = max(counts["invalid_reasons"].items(), key=lambda kv: kv[1])[0] \
            if counts["invalid_reasons"] else "no layout"
        return f"plan: no layout can run ({counts['raw']} tried; most often: {why})"
    return (f"plan: no layout fits in memory: all {counts['valid']} valid layouts need "
            f"more than the device holds for weights, gradients and optimizer state alone "
            f"(more devices, or zero 3)")
