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
from collections import defaultdict
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

    from flint.cluster import Cluster
    from flint.graph import Collective, Communicator, Node, NodeKind
    from flint.hardware_models.network import NetworkModel
    from flint.hardware_models.spec import load_spec
    from flint.validate.kineto import nccl_kernels, read_kineto

    kernels = [k for k in nccl_kernels(read_kineto(a.trace)) if k.collective == "allreduce"]
    fastest: dict[int, list] = defaultdict(list)
    for k in kernels:
        fastest[k.in_bytes].append(k)
    spec = load_spec(a.hardware, a.overrides)
    group = kernels[0].group_size
    net = NetworkModel(spec, Cluster(group, (("data", group),), spec.name))
    pcie = NetworkModel(load_spec(a.hardware, [*a.overrides, "scale_up_bandwidth=31.5GB/s"]),
                        net.cluster)
    comm = Communicator(0, "groups", "{}", group, group, 1, ("data",))
    t = Table(title=f"NCCL all-reduce, {group} ranks: measured (fastest per size) vs predicted on "
                    f"{spec.name}")
    for col in ("size", "runs", "measured", "bus BW measured", "predicted", "ratio",
                "predicted PCIe 4.0", "ratio PCIe", "kernel"):
        t.add_column(col, justify="right")
    for size in sorted(fastest):
        best = min(fastest[size], key=lambda k: k.duration_s)
        node = Node(0, "ar", NodeKind.COLLECTIVE, "all-reduce", "collective",
                    collective=Collective("all-reduce", 0, size, size, "f32"))
        pred, pred_pcie = net.time(node, comm), pcie.time(node, comm)
        bus = 2 * (group - 1) / group * size / best.duration_s
        t.add_row(f"{size / 2**20:.1f} MiB", str(len(fastest[size])),
                  f"{best.duration_s * 1e3:.3f} ms", f"{bus / 1e9:.1f} GB/s",
                  f"{pred * 1e3:.3f} ms", f"{pred / best.duration_s:.3f}x",
                  f"{pred_pcie * 1e3:.3f} ms", f"{pred_pcie / best.duration_s:.2f}x",
                  best.algorithm)
    Console().print(t)


if __name__ == "__main__":
    main()
