"""Flint's collective model against measured nccl-tests all-reduce curves (bus bandwidth vs
message size), from ../shared/tables/more-published.md section 4 (and an RCCL curve on
MI300X, scripts/tables/rccl-mi300x.md).

One figure of the model is read off one curve: the pipeline fill (nccl.PIPELINE_FILL_BYTES)
is fitted on the DGX H100 sample (4a, one process per GPU as in training); the other curves
are the validation set, and NCCL's tuning constants come from its source. Each system is
rebuilt from what its source states (GPU, ranks, ranks per node, NICs, the algorithm a
run forced with NCCL_ALGO); Flint's all-reduce time becomes a bus bandwidth by the
nccl-tests convention (algbw x 2(n-1)/n). Errors are predicted / measured - 1 of the bus
bandwidth (the same as measured / predicted - 1 of the time), per size decade (median
over that decade's sizes) and over all sizes from 1 KiB (smaller sizes round to 0.00 GB/s
in the published tables).

    python scripts/compare_nccl.py [--table PATH] [--json] [--fill-scan]
"""
from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

TABLE = Path(__file__).resolve().parents[2] / "shared/tables/more-published.md"
MIN_BYTES = 1024


@dataclass(frozen=True)
class System:
    name: str
    hardware: str
    ranks: int
    per_node: int
    block: int                    # which csv block of section 4 (0: 4a, 1: 4b, 2: 4c)
    column: str                   # the in-place bus bandwidth (or time) column
    algorithm: str = "auto"       # what the run forced with NCCL_ALGO (the source says)
    overrides: tuple = ()
    note: str = ""
    table: str = ""               # a curve of its own file (scripts/tables), not section 4


SYSTEMS = (
    System("DGX H100 8 GPUs (4a)", "h100-sxm", 8, 8, 0, "ip_time_us",
           note="NCCL's default algorithm (none forced)"),
    System("ND A100 v4 8 GPUs (4b)", "a100-80gb-sxm", 8, 8, 1, "ND_A100_v4_busbw_GBps",
           note="no NVLS on A100: NCCL's default"),
    System("ND H100 v5 8 GPUs (4b)", "h100-sxm", 8, 8, 1, "ND_H100_v5_busbw_GBps", "nvls",
           note="the source runs NCCL_ALGO=NVLS"),
    System("ND H200 v5 8 GPUs (4b)", "h200", 8, 8, 1, "ND_H200_v5_busbw_GBps", "nvls",
           note="the source runs NCCL_ALGO=NVLS"),
    System("ND GB200 v6 4 GPUs (4b)", "gb200-nvl72", 4, 4, 1, "ND_GB200_v6_busbw_GBps", "ring",
           note="the source runs NCCL_ALGO=Ring; 4 GPUs (one VM) assumed by the table"),
    # A3 Mega: 8 x 200 Gb/s NICs per 8-GPU node (GPUDirect-TCPXO), as the table states,
    # under the NCCL environment GCP's TCPXO recipes set (NCCL_PROTO=Simple,
    # NCCL_NVLS_ENABLE=0): the a3-mega spec
    System("A3 Mega 2x8 H100 (4c)", "a3-mega", 16, 8, 2, "ip_time_us",
           note="8 x 200 Gb/s TCPXO NICs per node; Simple only, no NVLS, as GCP's "
                "TCPXO environment sets"),
    System("MI300X 8 GPUs, RCCL (ROCm blog)", "mi300x", 8, 8, 0, "busbw_GBps",
           note="RCCL's default", table="rccl-mi300x.md"),
)
TABLES = Path(__file__).resolve().parent / "tables"
DECADES = ((1 << 10, "1-10 KB"), (10 << 10, "10-100 KB"), (100 << 10, "0.1-1 MB"),
           (1 << 20, "1-10 MB"), (10 << 20, "10-100 MB"), (100 << 20, "0.1-1 GB"),
           (1 << 30, "1-10 GB"), (10 << 30, "10+ GB"))


def read_blocks(path: Path, section: str = "## 4. NCCL", count: int = 3) -> list[list[dict]]:
    text = path.read_text()
    start = text.find(section)
    if start < 0:
        sys.exit(f"{path}: no section {section!r} (nccl-tests curves)")
    blocks = re.findall(r"```csv\n(.*?)```", text[start:], re.S)
    out = []
    for block in blocks[:count]:
        lines = block.strip().splitlines()
        header = lines[0].split(",")
        out.append([dict(zip(header, line.split(","))) for line in lines[1:]])
    return out


def measured(system: System, rows: list[dict]) -> list[tuple[int, float]]:
    """(bytes, bus bandwidth in B/s) per size of `system`'s curve."""
    n = system.ranks
    points = []
    for row in rows:
        size = int(row.get("size_B") or row["bytes"])
        if size < MIN_BYTES:
            continue
        if system.column.endswith("time_us"):
            bw = 2 * (n - 1) / n * size / (float(row[system.column]) * 1e-6)
        else:
            bw = float(row[system.column]) * 1e9
        points.append((size, bw))
    return points


def predictor(system: System):
    from flint.cluster import Cluster
    from flint.graph import Collective, Communicator, Node, NodeKind
    from flint.hardware_models.network import NetworkModel
    from flint.hardware_models.spec import load_spec

    n = system.ranks
    spec = load_spec(system.hardware, list(system.overrides))
    cluster = Cluster(n, (("data", n),), system.hardware, devices_per_host=system.per_node)
    comm = Communicator(0, "groups", "{{" + ",".join(map(str, range(n))) + "}}", n, n, 1,
                        ("data",))
    net = NetworkModel(spec, cluster, system.algorithm)

    def bus_bandwidth(size: int) -> float:
        node = Node(0, "all-reduce", NodeKind.COLLECTIVE, "all-reduce", "collective",
                    collective=Collective("all-reduce", 0, size, size, "f32"))
        return 2 * (n - 1) / n * size / net.time(node, comm)

    return bus_bandwidth


def curve(system: System, blocks) -> list[dict]:
    """The rows of `system`'s measured curve."""
    if system.table:
        return read_blocks(TABLES / system.table, section="#", count=1)[0]
    return blocks[system.block]


def compare(system: System, rows: list[dict]) -> dict:
    bus_bw = predictor(system)
    points = [(size, bw, bus_bw(size)) for size, bw in measured(system, rows)]
    errors = [p / m - 1 for _, m, p in points if m > 0]
    decades = []
    for i, (lo, label) in enumerate(DECADES):
        hi = DECADES[i + 1][0] if i + 1 < len(DECADES) else math.inf
        errs = [p / m - 1 for size, m, p in points if lo <= size < hi and m > 0]
        if errs:
            decades.append({"decade": label, "sizes": len(errs),
                            "median_error": statistics.median(errs),
                            "median_abs_error": statistics.median(abs(e) for e in errs)})
    largest = points[-1]
    return {"system": system.name, "hardware": system.hardware, "ranks": system.ranks,
            "algorithm": system.algorithm, "note": system.note,
            "points": [{"bytes": s, "measured_GBps": m / 1e9, "predicted_GBps": p / 1e9}
                       for s, m, p in points],
            "decades": decades,
            "median_abs_error": statistics.median(abs(e) for e in errors),
            "median_error": statistics.median(errors),
            "largest": {"bytes": largest[0], "measured_GBps": largest[1] / 1e9,
                        "predicted_GBps": largest[2] / 1e9}}


def render(results: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=120)
    for r in results:
        t = Table(title=f"{r['system']}: {r['hardware']}, {r['ranks']} ranks, NCCL_ALGO "
                        f"{r['algorithm']} ({r['note']})")
        for col in ("size decade", "sizes", "median error", "median |error|"):
            t.add_column(col, justify="left" if col == "size decade" else "right")
        for d in r["decades"]:
            t.add_row(d["decade"], str(d["sizes"]), f"{100 * d['median_error']:+.1f} %",
                      f"{100 * d['median_abs_error']:.1f} %")
        console.print(t)
    s = Table(title="Summary: bus bandwidth, predicted / measured - 1, sizes >= 1 KiB")
    for col in ("system", "median error", "median |error|", "largest size", "measured",
                "Flint"):
        s.add_column(col, justify="left" if col == "system" else "right")
    for r in results:
        big = r["largest"]
        s.add_row(r["system"], f"{100 * r['median_error']:+.1f} %",
                  f"{100 * r['median_abs_error']:.1f} %", f"{big['bytes'] / 2**30:.0f} GiB",
                  f"{big['measured_GBps']:.0f} GB/s", f"{big['predicted_GBps']:.0f} GB/s")
    console.print(s)


def fill_scan(blocks) -> None:
    """How nccl.PIPELINE_FILL_BYTES was chosen: the fill minimizing the DGX H100 (4a)
    curve's median |error|, every other system shown beside it (not used to choose)."""
    from flint.hardware_models import nccl

    chosen = nccl.PIPELINE_FILL_BYTES
    names = [s.name.split(" (")[0] for s in SYSTEMS]
    print("fill MiB | " + " | ".join(names) + "   (median |error| of bus bandwidth, sizes "
          ">= 1 KiB; fitted on the first column only)")
    try:
        for mib in range(0, 26, 2):
            nccl.PIPELINE_FILL_BYTES = mib * 2**20
            errs = [compare(s, curve(s, blocks))["median_abs_error"] for s in SYSTEMS]
            mark = "  <- nccl.PIPELINE_FILL_BYTES" if mib * 2**20 == chosen else ""
            print(f"{mib:8d} | " + " | ".join(f"{100 * e:{len(n)}.1f}" for n, e in
                                              zip(names, errs)) + mark)
    finally:
        nccl.PIPELINE_FILL_BYTES = chosen


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--table", default=str(TABLE))
    p.add_argument("--json", action="store_true")
    p.add_argument("--fill-scan", action="store_true", help="median |error| per system for "
                   "pipeline fills of 0-24 MiB: the fit on 4a and how the others follow")
    a = p.parse_args()
    blocks = read_blocks(Path(a.table))
    if a.fill_scan:
        fill_scan(blocks)
        return
    results = [compare(s, curve(s, blocks)) for s in SYSTEMS]
    if a.json:
        print(json.dumps(results, indent=1))
    else:
        render(results)


if __name__ == "__main__":
    main()
