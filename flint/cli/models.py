"""`flint models`: the model presets and zoo models, with their dims."""
from __future__ import annotations

import typer

from flint.cli._common import report_out, run


def models(as_json: bool = typer.Option(False, "--json", help="print the dims as JSON")):
    """List the model presets (public configs) and zoo models with their dims."""
    def go():
        from flint.models.describe import known_models, to_mapping
        from flint.models.decoder import param_count

        report = {name: {**to_mapping(cfg), "parameters": param_count(cfg)}
                  for name, cfg in sorted(known_models().items())}
        report_out(report, as_json, _render)

    run(go)


def _render(report: dict, console) -> None:
    from rich.table import Table

    from flint.prediction_report import wide
    from flint.render import LOG_WIDTH

    console = wide(console, LOG_WIDTH)   # a catalogue: one line per entry
    t = Table(title="Models (`--model NAME`; dims from each model's public config)",
              title_justify="left")
    for col in ("model", "params", "layers", "hidden", "heads (kv)", "ffn", "vocab",
                "context", "experts"):
        t.add_column(col, justify="left" if col == "model" else "right", no_wrap=True)
    for name, m in report.items():
        experts = (f"{m['experts']} x {m['moe_ffn']} top-{m['top_k']}"
                   + (f" +{m['shared_experts']}" if m.get("shared_experts") else "")
                   if m.get("experts") else "-")
        t.add_row(name, f"{m['parameters'] / 1e9:.2f} B", str(m["layers"]), str(m["hidden"]),
                  f"{m['heads']} ({m['kv_heads']})", str(m["ffn"]), str(m["vocab"]),
                  str(m["seq"]), experts)
    console.print(t)
