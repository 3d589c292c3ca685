"""`flint hardware`: the hardware specs (what `--hardware` names everywhere), the compile
target each one's programs compile for, and the compile-only targets."""
from __future__ import annotations

import typer

from flint.cli._common import report_out, run


def hardware(as_json: bool = typer.Option(False, "--json", help="print the list as JSON")):
    """List the hardware specs, the compile target each uses, and the compile targets."""
    def go():
        from flint.errors import FlintError
        from flint.frontends.targets import ALIASES, known_hardware, resolve_target
        from flint.hardware_models.spec import load_spec, spec_names

        specs = {}
        for name in spec_names():
            spec = load_spec(name)
            try:
                target = resolve_target(name).hardware
            except FlintError:
                target = None
            specs[name] = {"model": spec.model, "kind": spec.kind, "compile_target": target,
                           "peak_bf16_flops": spec.peak_flops.get("bf16", 0.0),
                           # the 16-bit GEMM rate: BF16's, FP16's where there is no BF16
                           "peak_16bit_flops": spec.peak("bf16"),
                           "hbm_bytes": spec.hbm_capacity,
                           "hbm_bandwidth_bytes_per_s": spec.hbm_bandwidth,
                           "devices_per_node": spec.devices_per_node,
                           "scale_up_domain": spec.scale_up_domain}
        targets = {t: sorted(a for a, n in ALIASES.items() if n == t) for t in known_hardware()}
        report_out({"specs": specs, "compile_targets": targets}, as_json, _render)

    run(go)


def _render(report: dict, console) -> None:
    from rich.table import Table

    from flint.prediction_report import wide
    from flint.render import LOG_WIDTH

    console = wide(console, LOG_WIDTH)   # a catalogue: one line per entry
    from flint.hardware_models.units import fmt_bytes

    t = Table(title="Hardware specs (`--hardware NAME` or a spec YAML path)",
              title_justify="left")
    for col in ("spec", "device", "compiles for", "16-bit peak", "HBM", "HBM bandwidth",
                "per node", "scale-up domain"):
        t.add_column(col, justify="left" if col in ("spec", "device", "compiles for")
                     else "right", overflow="fold")
    for name, s in report["specs"].items():
        t.add_row(name, s["model"], s["compile_target"] or "none (graphs from another "
                  "target or a dump)", f"{s['peak_16bit_flops'] / 1e12:,.0f} TFLOP/s"
                  + ("" if s["peak_bf16_flops"] else " (fp16)"),
                  fmt_bytes(s["hbm_bytes"]), f"{s['hbm_bandwidth_bytes_per_s'] / 1e12:.2f} TB/s",
                  f"{s['devices_per_node']} devices", f"{s['scale_up_domain']} devices")
    console.print(t)
    console.print("compile-only targets: " + ", ".join(
        name + (f" (also: {', '.join(a)})" if a else "")
        for name, a in report["compile_targets"].items()), highlight=False, soft_wrap=True)
