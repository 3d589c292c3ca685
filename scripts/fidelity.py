"""Fidelity that transfers: predicted vs published step time per family, before and after
the families' framework semantics, a leave-one-family-out table of those semantics, and
the rank correlation over BLOOM's topology sweep.

    python scripts/fidelity.py                        # both table files, every family
    python scripts/fidelity.py --file more --families 'BigScience'
    python scripts/fidelity.py --cached-only --json fidelity.json   # bounded rerun
    python scripts/fidelity.py --file scripts/tables/beyond-shared.md  # another table file

Rows: ../shared/tables/published.md (scripts/fidelity_published.py: the dense rows
compare_published rebuilds, plus Korthikanti's full-recompute baselines) and
../shared/tables/more-published.md (scripts/more_published.py: BLOOM-176B, InternEvo 7B,
MT-NLG 530B). Each row is a flint.run.TrainingRun priced by flint.engine.predict; how its
framework runs is its family's (scripts/fidelity_families.py), never a per-row choice.
Compiled stage programs are cached under --cache ($FLINT_CACHE style); runs that differ
only in data-parallel size share one. Progress lines go to stderr, tables to stdout.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fidelity_families import MECHANISMS, applicable, available, variant_fields  # noqa: E402
from fidelity_lofo import (holdout_sets, holdout_table, mechanism_table,  # noqa: E402
                           mech_id, variant_name, without)
from fidelity_bloom import alignment_table, spearman_table, topology_table  # noqa: E402
from fidelity_frameworks import same_model_table  # noqa: E402
from fidelity_stats import family_table  # noqa: E402
from published_rows import REPO  # noqa: E402


SHARED_FILES = ("published", "more", "both")      # --file's names for the shared tables


def load_cases(which: str) -> list:
    from fidelity_published import published_cases
    from more_published import more_cases

    if which not in SHARED_FILES:       # a table file in published.md's form
        return published_cases(Path(which))
    out = []
    if which in ("published", "both"):
        out += published_cases()
    if which in ("more", "both"):
        out += more_cases()
    return out


def planned_variants(case) -> list[list]:
    """before, after, and after without each of the row's mechanisms."""
    mine = applicable(case)
    out = [[], mine] + [without(case, m) for m in mine]
    return out


class NotCached(Exception):
    """--cached-only: a program the fit to memory needs is not in the cache."""


def _refuse(program: dict):
    raise NotCached(program)


class Runner:
    """Prices (case, mechanisms) once per distinct run and what-ifs."""

    def __init__(self, cache: Path, cached_only: bool = False, quiet: bool = False):
        from flint.template_cache import TemplateCache

        # --cached-only compiles nothing: a miss stops that one run, not the table
        self.store = TemplateCache(cache, extract=_refuse if cached_only else None)
        self.cached_only, self.quiet = cached_only, quiet
        self.memo: dict = {}
        self.skipped = 0

    def build(self, case, mechs):
        from flint.errors import FlintError
        from flint.run import TrainingRun

        try:
            run = TrainingRun(**variant_fields(case, mechs))
            if any(m.fit_memory for m in mechs) and not case.remat_stated:
                from flint.fit_memory import least_recompute

                try:
                    fitted = least_recompute(run, case.what_if, self.store)
                except NotCached:           # --cached-only: a program it needs is not
                    return None, ""         # cached (a run that fits needs only its own)
                if fitted != run and not self.quiet:
                    print(f"[fit] {case.label[:48]}: remat {fitted.remat}"
                          + (f" on {fitted.recompute_layers} layers per chunk"
                             if fitted.recompute_layers else " on every layer"),
                          file=sys.stderr, flush=True)
                run = fitted
            return run, ""
        except FlintError as err:
            return None, str(err)

    def run_all(self, jobs: list) -> None:
        """jobs: (case, mechanisms). Cheapest programs first, one program's runs together."""
        from flint.engine import stage_program
        from flint.template_cache import program_key

        todo = []
        for case, mechs in jobs:
            name = variant_name(case, mechs)
            if name in case.predicted:
                continue
            run, why = self.build(case, mechs)
            if run is None and not why:
                self.skipped += 1
                continue
            if run is None:
                case.predicted[name] = {"error": why}
                if name == "after" and not case.reason:
                    case.reason = f"Flint could not build it: {why}"
                continue
            key = (run.key(), case.what_if)
            case.runs[name] = "|".join((run.key(),) + tuple(case.what_if))
            program = stage_program(run)
            todo.append((_size(run), program_key(program), key, case, name, run, program))
        todo.sort(key=lambda t: t[:3])
        fresh = len({t[2] for t in todo} - set(self.memo))
        done = 0
        for _, _, key, case, name, run, program in todo:
            if key not in self.memo:
                if self.cached_only and not self.store.has(program):
                    self.skipped += 1
                    continue
                done += 1
                self.memo[key] = self._predict(run, case, name, done, fresh)
            case.predicted[name] = self.memo[key]
        for case, _ in jobs:
            if not applicable(case) and "before" in case.predicted:
                # no mechanism of its era applies: the row's "after" is its "before"
                case.predicted.setdefault("after", case.predicted["before"])
                case.runs.setdefault("after", case.runs.get("before", ""))
            failed = case.predicted.get("after", {}).get("error")
            if failed and not case.reason:
                case.reason = f"Flint could not price it: {failed.splitlines()[0][:160]}"

    def _predict(self, run, case, name, i, n) -> dict:
        from flint.engine import predict
        from flint.errors import FlintError

        t0 = time.perf_counter()
        try:
            p = predict(run, cache=self.store, what_if=case.what_if)
        except FlintError as err:
            res = {"error": str(err)}
            if not self.quiet:
                print(f"[{i}/{n}] {case.label[:48]} {name}: {err}", file=sys.stderr, flush=True)
            return res
        res = {"step_s": p.step_time_s, "mfu": p.mfu, "exposed_s": p.exposed_communication_s,
               "bubble": p.bubble_fraction, "oom": p.oom, "compiled": p.extracted}
        if not self.quiet:
            err = p.step_time_s / case.published_step_s - 1 if case.published_step_s else 0
            print(f"[{i}/{n}] {case.label[:48]:48s} {name[:14]:14s} {p.step_time_s:9.3f} s "
                  f"({err * 100:+6.1f}%) {'compiled' if p.extracted else 'cached  '} "
                  f"{time.perf_counter() - t0:5.1f} s", file=sys.stderr, flush=True)
        return res


def replay(cases, path: Path) -> bool:
    """Predictions (and reasons found while pricing) from an earlier --json, by row."""
    try:
        doc = json.loads(path.read_text())
        old = {(c["file"], c["label"]): c for c in doc["cases"]}
    except (OSError, ValueError, KeyError, TypeError) as err:
        print(f"fidelity: --replay {path}: not a fidelity --json ({err})", file=sys.stderr)
        return False
    for c in cases:
        prev = old.get((c.file, c.label))
        if prev:
            c.predicted, c.runs = dict(prev["predicted"]), dict(prev["runs"])
            c.reason = c.reason or prev["reason"]
    return True


def _size(run) -> float:
    from flint.models.decoder import param_count

    return param_count(run.model_config()) / run.pp / run.tp


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--file", default="both", help="published | more | both, or the path "
                    "of a table file in published.md's form (its sections priced as "
                    "published.md's are)")
    ap.add_argument("--families", default="", help="regex on the family name")
    ap.add_argument("--rows", default="", help="regex on the row label")
    ap.add_argument("--cache", default=str(REPO / "build" / "fidelity"),
                    help="stage-program cache directory")
    ap.add_argument("--cached-only", action="store_true", help="only runs whose stage "
                    "program is already in --cache (a bounded-time rerun)")
    ap.add_argument("--no-lofo", action="store_true", help="before/after only")
    ap.add_argument("--json", dest="json_out", default=None, help="also write JSON here")
    ap.add_argument("--quiet", action="store_true", help="no progress lines")
    ap.add_argument("--replay", default=None, help="take the predictions of an earlier "
                    "--json instead of pricing (tables only)")
    ap.add_argument("--include-blocked", action="store_true", help="also apply the "
                    "mechanisms the engine cannot price faithfully yet (diagnostics)")
    args = ap.parse_args(argv)
    import fidelity_families

    fidelity_families.INCLUDE_BLOCKED = args.include_blocked
    try:
        fam_rx, row_rx = re.compile(args.families), re.compile(args.rows)
    except re.error as err:
        print(f"fidelity: bad regex: {err}", file=sys.stderr)
        return 2
    from flint.frontends.targets import prepare_environment

    prepare_environment()
    shared = args.file in SHARED_FILES
    if not shared and not Path(args.file).is_file():
        print(f"fidelity: --file {args.file}: not published, more, both or a table file",
              file=sys.stderr)
        return 2
    cases = [c for c in load_cases(args.file)
             if fam_rx.search(c.family) and row_rx.search(c.label)]
    if not cases:
        print("fidelity: no rows match --file/--families/--rows", file=sys.stderr)
        return 2
    Path(args.cache).mkdir(parents=True, exist_ok=True)
    runner = Runner(Path(args.cache), args.cached_only or bool(args.replay), args.quiet)
    if args.replay and not replay(cases, Path(args.replay)):
        return 2
    built = [c for c in cases if not c.reason]
    runner.run_all([(c, v) for c in built for v in (
        [[], applicable(c)] if args.no_lofo else planned_variants(c))])
    report = {"mechanisms": [{"id": mech_id(m), "name": m.name, "eras": list(m.eras),
                              "assign": dict(m.assign), "fit_memory": m.fit_memory,
                              "source": m.source,
                              "developed_on": m.developed_on, "available": available(m),
                              "blocked": m.blocked}
                             for m in MECHANISMS]}
    for file in ("published", "more-published"):
        mine = [c for c in cases if c.file == file]
        if mine:
            name = f"{file}.md" if shared else Path(args.file).name
            text, doc = family_table(mine, f"\n== {name}: step time, predicted vs "
                                           f"published, per family ==")
            print(text)
            report[file] = doc
    if not args.no_lofo:
        sets = holdout_sets(cases)
        runner.run_all([(c, [m for m in applicable(c) if m in sets[c.family]])
                        for c in cases if not c.reason and c.family in sets])
        text, report["lofo_mechanisms"] = mechanism_table(cases)
        print(text)
        text, report["lofo_holdout"] = holdout_table(cases, sets)
        print(text)
    text, report["bloom_spearman"] = spearman_table(cases)
    print(text)
    text, report["bloom_head_width"] = alignment_table(cases)
    print(text)
    text, report["bloom_topology"] = topology_table(cases)
    if text:                    # only with BLOOM's rows (the tables above print theirs)
        print(text)
    text, report["same_model"] = same_model_table(cases)
    if text:                    # only with both table files' MT-NLG rows
        print(text)
    skipped = [c for c in cases if c.reason]
    print(f"\nnot rebuildable: {len(skipped)} of {len(cases)} rows (reasons in --json); "
          f"runs left out by --cached-only: {runner.skipped}")
    if args.json_out:
        from flint.io import write_atomic

        report["cases"] = [c.to_json() for c in cases]
        write_atomic(args.json_out, json.dumps(report, indent=1, sort_keys=True,
                                               default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
