"""`flint estimate`: a saved graph -> its predicted step time (the built-in cost model, a
third-party one with --cost-model, or ASTRA-sim as a second opinion)."""
from __future__ import annotations

from typing import Optional

import typer

from flint.cli._common import check_output_file, cost_model_option, report_out, run
from flint.errors import FlintError


def estimate(
    graph_file: str = typer.Argument(..., help="a workload graph JSON (flint extract --out), "
                                               "a Chakra .et, or a directory of them"),
    hardware_name: Optional[str] = typer.Option(None, "--hardware", help="spec name or a "
                                                "spec YAML path (default: the graph's)"),
    set_: list[str] = typer.Option([], "--set", help="what-if, e.g. hbm_bandwidth=4.8TB/s"),
    algorithm: str = typer.Option("auto", help="collective algorithm: auto|ring|tree|"
                                               "hierarchical|direct"),
    cost_model: Optional[str] = typer.Option(None, "--cost-model", metavar="MODULE:FACTORY",
                                             help="a third-party cost model: "
                                             "package.module:factory (see README)"),
    trace: Optional[str] = typer.Option(None, help="write the predicted timeline "
                                                   "(Chrome/Perfetto trace JSON)"),
    plot: Optional[str] = typer.Option(None, help="write a PNG breakdown of the step"),
    backend: str = typer.Option("flint", help="flint | astra-sim: also run ASTRA-sim on a "
                                "Chakra export of the graph and compare the steps"),
    astra_sim: Optional[str] = typer.Option(None, "--astra-sim", help="ASTRA-sim binary or "
                                            "directory (default: $ASTRA_SIM, "
                                            "../shared/tools/astra-sim)"),
    as_json: bool = typer.Option(False, "--json", help="print the estimate as JSON"),
    routing: Optional[str] = typer.Option(None, help="MoE graphs: tokens per expert, "
                                          "balanced | zipf:S | imbalance:F | histogram:..."),
):
    """Predict the step time of a workload graph with the built-in cost model."""
    def go():
        from flint.frontends.saved import load_graph

        factory = cost_model_option(cost_model)
        for flag, path in (("--trace", trace), ("--plot", plot)):
            if path:
                check_output_file(path, flag)
        graph = load_graph(graph_file)
        if routing:
            from flint.passes.moe_routing import MoeRouting

            graph = MoeRouting.for_graph(graph, routing).run(graph)
        if backend != "flint":
            from flint.exporters.astra_sim_run import report_second_opinion

            return report_second_opinion(graph, hardware_name, set_, backend, astra_sim,
                                         as_json)
        _estimate(graph, hardware_name, set_, algorithm, trace, as_json, plot, factory)

    run(go)


def _estimate(graph, hardware_name, overrides, algorithm, trace, as_json, plot=None,
              cost_model=None):
    from flint.hardware_models.estimate import estimate as run_estimate
    from flint.hardware_models.network import ALGORITHMS

    if algorithm not in ALGORITHMS:
        raise FlintError(f"unknown collective algorithm {algorithm!r}; use {'|'.join(ALGORITHMS)}")
    result = run_estimate(graph, hardware_name, overrides, algorithm=algorithm,
                          cost_model=cost_model)
    if trace:
        from flint.exporters.perfetto import write_timeline

        write_timeline(result.timeline, trace)
    if plot:
        from flint.exporters.plot import write_breakdown

        write_breakdown(result.to_json(), plot)
    from flint.render import render_estimate

    report = result.to_json()
    if "moe_routing" in graph.meta:
        report["moe_routing"] = graph.meta["moe_routing"]
    if overrides:
        from flint.what_if_effects import what_if_effects

        report["what_if_effects"] = what_if_effects(graph, hardware_name, overrides, (),
                                                    cost_model, result.memory_bytes, algorithm)

    def render(rep, console):
        from flint.prediction_report import render_what_if_effects

        render_estimate(rep, console)
        render_what_if_effects(rep.get("what_if_effects") or [], console)
        r = rep.get("moe_routing")
        if r:
            console.print(f"MoE routing {r['distribution']}: hottest expert "
                          f"{r['max_over_mean_expert']:.2f}x the mean, straggler EP rank "
                          f"{r['straggler_factor']:.2f}x a balanced rank's tokens; all-to-all "
                          f"{r['all_to_all_straggler_bytes_per_rank'] / 1e6:.2f} MB per rank "
                          f"(balanced {r['all_to_all_balanced_bytes_per_rank'] / 1e6:.2f} MB); "
                          f"dropped tokens {100 * r['dropped_token_share']:.1f}%")

    report_out(report, as_json, render)
