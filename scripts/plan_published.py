"""Where practitioners' published layouts rank among `flint plan`'s candidates.

    python scripts/plan_published.py                       # every rebuildable row
    python scripts/plan_published.py --rows 'LLAMA3_70B' --budget 12
    python scripts/plan_published.py --summary             # the table of what is done

For each configuration in ../shared/tables/published.md that the engine can rebuild
(scripts/compare_published.py's `training_run` for dense rows, scripts/published_moe.py
for MoE rows, with their stated assumptions), `flint plan` plans the same model, GPU
count, sequence length, global batch, system and precision (the row's precision only; the
planner chooses everything else: TP/SP, CP, PP x VP, EP, ZeRO/FSDP, micro-batch, remat).
The published layout is priced by the same engine, and the script prints:
- its rank among the planner's priced candidates (1 + how many fitting candidates are
  predicted faster; "OOM" when the engine says the published layout does not fit),
- its rank by the planner's closed form among every layout the planner ranked (how the
  cheap pass saw it), or why it lies outside the planner's space,
- how much faster the planner's winner is predicted to be (published step / winner step).
Rows sharing model, GPUs, batch, sequence, system and precision share one plan. Results
go to build/plan_published/results.jsonl, one line per row, so a rerun continues where
an interrupted one stopped (plans are slow on 2 cores: cold stage programs compile).
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from published_rows import REPO, TABLE, rows_of  # noqa: E402
from table_columns import tables  # noqa: E402

OUT = REPO / "build" / "plan_published"


def published_runs(table: Path) -> tuple[list, list]:
    """([(label, TrainingRun, published step s)], [(label, why not)])."""
    import published_moe
    from compare_published import training_run

    from flint.errors import FlintError

    runs, skipped = [], []
    for heading, records in tables(table):
        for row in rows_of(heading, records):
            if row.moe:
                continue
            if row.reason:
                skipped.append((row.label, row.reason))
                continue
            try:
                runs.append((row.label, training_run(row), row.published_step_s))
            except FlintError as e:
                skipped.append((row.label, str(e)))
    for row in published_moe.moe_rows(table):
        if row.reason:
            skipped.append((row.label, row.reason))
        else:
            runs.append((row.label, row.run, row.published_step_s))
    return runs, skipped


def group_key(run) -> tuple:
    return (str(run.model), run.devices, run.global_batch, run.seq_len, run.hardware,
            run.precision, run.dispatcher)


def plan_group(runs: list, budget, cache: Path) -> list[dict]:
    """One plan for rows sharing a group key; one result per row: `rank` among the plan's
    priced candidates that fit, `rank_step_only` among all it priced."""
    from flint.plan_price import LAYOUT, price, row_key
    from flint.plan_search import rank, search
    from flint.plan_space import Candidate, PlanRequest, invalid_reason, model_config

    run0 = runs[0][1]
    request = PlanRequest(model=run0.model, devices=(run0.devices,), seq_len=run0.seq_len,
                          global_batch=run0.global_batch, hardware=run0.hardware,
                          dispatcher=run0.dispatcher, precision=(run0.precision,))
    t0 = time.perf_counter()
    result = search(request, budget, cache=cache)
    ranked, _, _ = rank(request)
    order = {r.candidate: i + 1 for i, r in enumerate(ranked)}
    fitting = result.fitting
    winner = result.winner
    out = []
    for label, run, published_s in runs:
        c = Candidate(**{k: getattr(run, k) for k in LAYOUT})
        fields = c.run_fields(request)
        key = row_key(fields, request.what_if)
        row = next((r for r in result.rows if r["key"] == key), None)
        if row is None:
            job = {"run": fields, "what_if": [], "key": key,
                   "layout": {k: getattr(c, k) for k in LAYOUT}, "analytic": {}}
            row, _ = price(job, cache)
        why = invalid_reason(request, model_config(request), c.devices,
                             {k: getattr(c, k) for k in LAYOUT if k != "devices"})
        rec = {"label": label, "run": run.to_json(), "published_step_s": published_s,
               "layout": c.short(), "status": row["status"], "plan_wall_s":
               time.perf_counter() - t0, "plan_priced": len(result.rows),
               "plan_ranked": len(ranked), "closed_form_rank": order.get(c),
               "outside_space": "" if c in order else (why or "outside the planner's value "
                                                       "rules or its memory floor")}
        if row["status"] == "ok":
            rec.update({"predicted_step_s": row["step_time_s"], "oom": row["oom"],
                        "memory_gib": row["memory_bytes"] / 2**30})
            if not row["oom"]:
                faster = [r for r in fitting if r["step_time_s"] < row["step_time_s"]
                          and r["key"] != key]
                rec["rank"] = 1 + len(faster)
                rec["pool"] = len({r["key"] for r in fitting} | {key})
            # the same on step time alone, memory verdicts aside (the engine's memory
            # model may put a layout that ran in practice over the capacity)
            ok = [r for r in result.rows if r["status"] == "ok" and r["key"] != key]
            rec["rank_step_only"] = 1 + sum(r["step_time_s"] < row["step_time_s"] for r in ok)
            rec["pool_step_only"] = len(ok) + 1
        if winner:
            rec.update({"winner": winner["key"] == key and "the published layout" or
                        Candidate(**{k: winner[k] for k in LAYOUT}).short(),
                        "winner_step_s": winner["step_time_s"]})
            if row["status"] == "ok":
                rec["winner_faster"] = row["step_time_s"] / winner["step_time_s"] - 1
        out.append(rec)
    return out


def summary(records: list) -> None:
    print(f"\n{'row':52s} {'published layout':38s} {'rank':>8s} {'by step':>8s} {'closed':>7s} "
          f"{'pub. pred':>9s} {'winner':>8s} {'faster':>7s}  winner layout")
    for r in records:
        rank = (f"{r['rank']}/{r['pool']}" if r.get("rank") else
                "OOM" if r.get("oom") else r["status"])
        closed = str(r["closed_form_rank"]) if r["closed_form_rank"] else "-"
        step_only = (f"{r['rank_step_only']}/{r['pool_step_only']}"
                     if r.get("rank_step_only") else "-")
        pub = f"{r['predicted_step_s']:.3f}s" if r.get("predicted_step_s") else "-"
        win = f"{r['winner_step_s']:.3f}s" if r.get("winner_step_s") else "-"
        faster = (f"{100 * r['winner_faster']:+.0f}%" if r.get("winner_faster") is not None
                  else "-")
        print(f"{r['label'][:52]:52s} {r['layout'][:38]:38s} {rank:>8s} {step_only:>8s} "
              f"{closed:>7s} "
              f"{pub:>9s} {win:>8s} {faster:>7s}  {r.get('winner', '-')}"
              + (f"  [outside: {r['outside_space']}]" if r["outside_space"] else ""))
    ranked = [r for r in records if r.get("rank")]
    if ranked:
        ranks = [r["rank"] for r in ranked]
        gains = [r["winner_faster"] for r in ranked]
        print(f"\nrows planned: {len(records)}; published layout fits (engine): {len(ranked)}; "
              f"rank 1: {sum(x == 1 for x in ranks)}, top 3: {sum(x <= 3 for x in ranks)}, "
              f"top 5: {sum(x <= 5 for x in ranks)}; median rank {statistics.median(ranks):g}; "
              f"planner's winner faster by median {100 * statistics.median(gains):.1f}% "
              f"(max {100 * max(gains):.1f}%)")
    both = [r["rank_step_only"] for r in records if r.get("rank_step_only")]
    if both:
        print(f"on step time alone (memory verdicts aside): rank 1: {sum(x == 1 for x in both)}"
              f", top 3: {sum(x <= 3 for x in both)} of {len(both)}; median rank "
              f"{statistics.median(both):g}")
    print(f"published layouts the engine puts out of memory: "
          f"{sum(bool(r.get('oom')) for r in records)}; outside the planner's space: "
          f"{sum(bool(r['outside_space']) for r in records)}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", default=str(TABLE))
    ap.add_argument("--rows", default="", help="regex on the row label")
    ap.add_argument("--budget", type=int, default=12, help="candidates priced per plan")
    ap.add_argument("--programs", type=int, default=4, help="new stage programs per plan")
    ap.add_argument("--cache", default=str(OUT / "cache"))
    ap.add_argument("--results", default=str(OUT / "results.jsonl"))
    ap.add_argument("--summary", action="store_true", help="print what is done, plan nothing")
    args = ap.parse_args(argv)
    from flint.frontends.targets import prepare_environment
    from flint.plan_search import Budget

    prepare_environment()
    results = Path(args.results)
    results.parent.mkdir(parents=True, exist_ok=True)
    done = {}
    if results.is_file():
        for line in results.read_text().splitlines():
            try:
                rec = json.loads(line)
                done[rec["label"]] = rec
            except (ValueError, KeyError):
                continue
    runs, skipped = published_runs(Path(args.table))
    pick = re.compile(args.rows) if args.rows else None
    runs = [r for r in runs if pick is None or pick.search(r[0])]
    groups: dict = {}
    for item in runs:
        groups.setdefault(group_key(item[1]), []).append(item)
    from flint.models.decoder import param_count

    def cost(key):         # cheapest plans first: a partial run covers the most rows
        return (param_count(groups[key][0][1].model_config()), key[1], key)

    budget = Budget(candidates=args.budget, programs=args.programs, min_priced=3)
    for key in sorted(groups, key=cost):
        todo = [g for g in groups[key] if g[0] not in done]
        if args.summary or not todo:
            continue
        print(f"planning {key[0]} on {key[1]} x {key[4]}, gbs {key[2]}, seq {key[3]}, "
              f"{key[5]} ({len(todo)} rows)", flush=True)
        from flint.errors import FlintError

        try:
            recs = plan_group(todo, budget, Path(args.cache))
        except FlintError as e:
            recs = [{"label": label, "run": run.to_json(), "status": "no plan",
                     "error": str(e), "layout": "", "closed_form_rank": None,
                     "outside_space": ""} for label, run, _ in todo]
        with results.open("a") as f:
            for rec in recs:
                f.write(json.dumps(rec, sort_keys=True) + "\n")
                done[rec["label"]] = rec
        for rec in recs:
            rank = rec.get("rank") or ("OOM" if rec.get("oom") else rec["status"])
            print(f"  {rec['label'][:50]}: {rec['layout']} rank {rank}"
                  f", winner {rec.get('winner')} ({100 * rec.get('winner_faster', 0):+.1f}%)",
                  flush=True)
    records = [done[label] for label, _, _ in runs if label in done]
    summary(records)
    print(f"rows not rebuildable by the engine: {len(skipped)}; rebuildable rows not yet "
          f"planned: {len(runs) - len(records)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
