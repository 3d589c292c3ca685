"""Predicted vs measured on the shared nsys-jax MaxText archive (4x H100, FSDP), before and
after calibration, and calibration across hardware (MaxText H100 <-> HTA A100 all-reduces).

The archive's optimized HLO becomes the WorkloadGraph; per-thunk GPU times join to nodes by
HLO instruction name. The embedding-gradient scatter is data dependent (22-68 ms per device)
and is reported separately: the step without it subtracts the slowest device's scatter.

    python scripts/compare_maxtext.py [--hardware h100-sxm]
"""
from __future__ import annotations

import argparse
from pathlib import Path

TRACES = Path(__file__).resolve().parents[2] / "shared/traces"
ARCHIVE = TRACES / "jaxtoolbox_maxtext_fsdp4_4xH100.data.zip"
HTA = TRACES / "hta_resnet50_ddp_2xA100_nccl_data.json.gz"
SCATTER = ["input_scatter_fusion"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--archive", default=str(ARCHIVE))
    p.add_argument("--hta", default=str(HTA))
    p.add_argument("--hardware", default="h100-sxm")
    a = p.parse_args()
    from rich.console import Console

    from flint.hardware_models.spec import load_spec
    from flint.validate.report import render_calibration, render_validation
    from flint.validate.samples import collective_error
    from flint.validate.workflow import open_input, run_calibrate, run_validate

    console = Console(width=120)
    spec = load_spec(a.hardware)
    # JAX-Toolbox's 2024 MaxText run: XLA's LLVM emitters (populations.XLA_EMITTERS)
    mt = open_input(a.archive, hardware=spec.name, xla_emitters="legacy")
    raw = run_validate(mt, spec)
    console.print(f"raw step error (scatter included): {100 * raw.step_error:+.1f} % "
                  f"(measured {raw.measured_step_s * 1e3:.1f} ms, predicted "
                  f"{raw.predicted_step_s * 1e3:.1f} ms)")
    render_validation(run_validate(mt, spec, None, SCATTER), console)
    report = run_calibrate([mt], spec, "2-3", "4-5", SCATTER)
    render_calibration(report, console)
    a100 = load_spec("a100-40gb-sxm")
    hta = open_input(a.hta, hardware=a100.name)
    from_hta = run_calibrate([hta], a100).calibration
    before = run_validate(mt, spec, "4-5", SCATTER).step_error
    after = run_validate(mt, from_hta.apply(spec, with_hardware=False), "4-5", SCATTER).step_error
    console.print(f"cross-hardware: MaxText efficiencies -> HTA all-reduces (A100): median "
                  f"|error| {100 * collective_error(hta.nccl, a100):.1f} % -> "
                  f"{100 * collective_error(hta.nccl, report.calibration.apply(a100, False)):.1f} %")
    console.print(f"cross-hardware: HTA efficiencies -> MaxText steps 4-5 (H100): step error "
                  f"{100 * before:+.1f} % -> {100 * after:+.1f} %")


if __name__ == "__main__":
    main()
