"""Predicted vs measured NCCL all-reduce times of the shared HTA ResNet-50 DDP trace (2x A100).

Kernel times include waiting for the peer, so each size is compared at its fastest run.
The measured bus bandwidth (3-13 GB/s, NCCL's LL protocol, whose 8-byte lines carry 4 bytes
of data) is far below NVLink and near PCIe, so a second column repeats the prediction with
the scale-up link set to PCIe 4.0 x16: 16 GT/s x 16 lanes x 128/130 = 31.5 GB/s per
direction (PCI-SIG, PCI Express Base Specification 4.0).

    python scripts/compare_hta_allreduce.py [--hardware a100-40gb-sxm] [--set ...]
"""
from __future__ import annotations

import argparse
from pathlib import Path

TRACE = Path(__file__).resolve().parents[2] / "shared/traces/hta_resnet50_ddp_2xA100_nccl_data.json.gz"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", default=str(TRACE))
    p.add_argument("--hardware", default="a100-40gb-sxm")
    p.add_argument("--set", action="append", default=[], dest="overrides")
    a = p.parse_args()
    from rich.console import Console
    from rich.table import Table

    from flint.hardware_models.network import NetworkModel
    from flint.hardware_models.spec import load_spec
    from flint.validate.kineto import nccl_kernels, read_kineto
    from flint.validate.samples import samples_from_nccl

    spec = load_spec(a.hardware, a.overrides)
    pcie_spec = load_spec(a.hardware, [*a.overrides, "scale_up_bandwidth=31.5GB/s"])
    algorithms = {k.in_bytes: k.algorithm for k in nccl_kernels(read_kineto(a.trace))}
    samples = [s for s in samples_from_nccl(a.trace) if s.node.op == "all-reduce"]
    t = Table(title=f"NCCL all-reduce: measured (fastest per size) vs predicted on {spec.name}")
    for col in ("size", "ranks", "measured", "bus BW measured", "predicted", "ratio",
                "predicted PCIe 4.0", "ratio PCIe", "kernel"):
        t.add_column(col, justify="right")
    for s in samples:
        size, group = s.node.collective.bytes_in, s.comm.size
        pred = NetworkModel(spec, s.cluster).time(s.node, s.comm)
        pred_pcie = NetworkModel(pcie_spec, s.cluster).time(s.node, s.comm)
        bus = 2 * (group - 1) / group * size / s.seconds
        t.add_row(f"{size / 2**20:.1f} MiB", str(group), f"{s.seconds * 1e3:.3f} ms",
                  f"{bus / 1e9:.1f} GB/s", f"{pred * 1e3:.3f} ms", f"{pred / s.seconds:.3f}x",
                  f"{pred_pcie * 1e3:.3f} ms", f"{pred_pcie / s.seconds:.2f}x",
                  algorithms.get(size, ""))
    Console().print(t)


if __name__ == "__main__":
    main()
