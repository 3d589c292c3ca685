"""Kernel-level checks of Flint's compute model: GEMM shapes against published cuBLAS figures,
attention kernels against the FlashAttention papers' figures, the three shared traces
per op class and per kernel-duration bucket, and the MaxText trace's kernels that ran beside
a collective against the same ops alone (flint/validate/overlap.py).

Every published figure below names its source; none of them sets a constant of the model
(the model's figures live in the hardware specs with their own sources). Errors are
predicted / measured - 1 of the time (so a positive error is a prediction too slow);
TFLOP/s use each source's FLOP convention (2MNK for GEMMs; 4 S^2 D H B for attention,
halved under a causal mask, as the FlashAttention papers count).

    python scripts/compare_kernels.py [--section gemm|attention|traces] [--json]
"""
from __future__ import annotations

import argparse
import json
import statistics

from flint.hardware_models.attention_kernels import FA1_A100_RANGE, FA2_A100_RANGE
from kernel_traces import trace_tables, tracelens_kernels


# Maximum Achievable Matmul FLOPS (torch.mm, bf16, cuBLAS; the best shape of a sweep):
# stas00/ml-engineering, compute/accelerator/README.md, "Maximum Achievable Matmul FLOPS
# comparison table": the CUDA 12.1 revision (A100 SXM, H100 SXM) and a later one (torch
# 2.5-2.10: A100, H100, B200, B300, GB200, and MI300X on ROCm 6.2 and 6.3). The best of a
# search over thousands of shapes: a training step's GEMMs run below it. Every spec's
# gemm_fraction is RULE x the fraction that reproduces its MAMF rows, so these rows read
# about +9% by construction; the check is that one rule holds for every GPU.
RULE = 0.919     # B200: 0.72 of its dense peak in a step against the 0.784 of its MAMF row
MAMF = (("a100-80gb-sxm", 6912, 16384, 2048, 267.9), ("h100-sxm", 6144, 17920, 2816, 792.1),
        ("a100-80gb-sxm", 1024, 10240, 5120, 271.2), ("h100-sxm", 2048, 2048, 13312, 794.5),
        ("b200", 1792, 16128, 3072, 1745.0), ("b300", 12288, 18432, 1024, 1769.0),
        ("gb200-nvl72", 4096, 9728, 2048, 1822.0), ("mi300x", 4096, 10240, 4864, 781.9),
        ("mi300x", 10240, 15360, 8192, 668.4))
# The same table's FP8 (float8_e4m3fn) rows: a check of the rule, which is set from the bf16
# rows alone and applies one gemm_fraction to every tensor dtype.
MAMF_FP8 = (("h100-sxm", 1024, 9216, 14336, 1402.6), ("h200", 1280, 4096, 12032, 1453.4),
            ("b200", 15360, 4096, 3072, 3432.5), ("b300", 3072, 6144, 7168, 3353.3),
            ("gb200-nvl72", 19456, 5120, 1536, 3615.6))

# FlashAttention-3 paper (Shah et al., arXiv 2407.08608), Fig. 5: attention forward speed,
# BF16, H100 80GB SXM5, batch x seqlen = 16k, heads x head dim = 2048; TFLOP/s per bar at
# seqlen 512, 1k, 2k, 4k, 8k, 16k (None: out of memory, or the 512 bars whose labels the
# available transcriptions of the figure disagree on). "standard" is PyTorch's unfused
# attention.
SEQS = (512, 1024, 2048, 4096, 8192, 16384)
FA3_PAPER = {
    (64, False): {"standard": (52, 63, 67, 72, 73, None), "flash2": (282, 306, 318, 321, 322, 324),
                  "cudnn": (335, 373, 395, 408, 412, 413), "flash3": (333, 392, 460, 476, 496, 497)},
    (128, False): {"standard": (74, 100, 119, 133, 139, None),
                   "flash2": (309, 350, 362, 368, 370, 370),
                   "cudnn": (None, 574, 617, 609, 600, 595),
                   "flash3": (None, 565, 625, 638, 646, 648)},
    (256, False): {"flash2": (275, 313, 321, 323, 324, 326), "cudnn": (470, 546, 580, 581, 580, 581),
                   "flash3": (482, 639, 707, 736, 746, 756)},
    (64, True): {"standard": (16, 18, 18, 18, 18, None), "flash2": (180, 229, 262, 284, 295, 299),
                 "cudnn": (225, 288, 334, 363, 379, 388), "flash3": (197, 265, 371, 420, 460, 473)},
    (128, True): {"standard": (26, 31, 34, 35, 35, None), "flash2": (191, 260, 298, 319, 333, 335),
                  "cudnn": (315, 410, 484, 518, 529, 539), "flash3": (292, 423, 521, 579, 602, 616)},
    (256, True): {"flash2": (208, 251, 278, 293, 297, 298), "cudnn": (308, 391, 450, 483, 497, 509),
                  "flash3": (286, 427, 537, 612, 628, 642)},
}
# The same paper's Fig. 7: attention backward speed, same shapes, non-causal, head dims 64
# and 128 (standard: out of memory at 16k). BACKWARD_SHARE is set from the 16k bars at head
# dim 128 alone; the rest check the rule.
FA3_PAPER_BACKWARD = {
    64: {"standard": (68, 76, 88, 92, 95, None), "flash2": (198, 238, 264, 279, 287, 291),
         "cudnn": (266, 348, 395, 417, 432, 433), "flash3": (272, 363, 422, 453, 472, 474)},
    128: {"standard": (104, 131, 159, 174, 181, None), "flash2": (214, 260, 291, 310, 318, 322),
          "cudnn": (305, 408, 465, 499, 518, 516), "flash3": (316, 424, 501, 542, 559, 561)},
}
# PyTorch benchmark (pytorch/benchmark, commit ff65cb67, D60117034): FlashAttention-3
# forward on H100, head dim 128, non-causal, same shapes as the paper: TFLOP/s.
FA3_TORCHBENCH = (430.3, 517.1, 565.5, 590.2, 614.2, 620.7)
# FlashAttention-2 paper (Dao, arXiv 2307.08691, abstract): FlashAttention-2 at 50-73% of the
# theoretical maximum FLOP/s on A100 (forward and backward, head dims 64/128, sequence
# 512-16k), FlashAttention (v1) at "only 25-40%" (hardware_models.attention_kernels)
IMPLS = {"standard": "unfused", "flash1": "flash1", "flash2": "flash2", "cudnn": "cudnn",
         "flash3": "flash3"}
# NVIDIA Technical Blog, 'Making Softmax More Efficient with NVIDIA Blackwell Ultra' (2026):
# doubling the SFUs' MUFU.EX2 rate gives GB300 ~35% more attention forward (FPROP)
# throughput than GB200 (DeepSeek-V3, FP8). A ratio, so it checks the exponentials' share
# of an attention block on Blackwell, not any one rate. Shapes: DeepSeek-V3's 128 heads at
# 4k tokens, causal; its MLA query/key head dim is 192, a plain head 128.
BLACKWELL_ULTRA_FPROP_GAIN = 1.35


def gemm_rows() -> list[dict]:
    from flint.graph import Node, NodeKind
    from flint.hardware_models.compute import RooflineCompute
    from flint.hardware_models.spec import load_spec

    rows = []
    for table, label, dtype, width in ((MAMF, "bf16", "bf16", 2),
                                       (MAMF_FP8, "fp8", "f8e4m3fn", 1)):
        for hardware, m, n, k, tflops in table:
            model = RooflineCompute(load_spec(hardware))
            node = Node(0, "mm", NodeKind.COMPUTE, "dot", "gemm", flops=2.0 * m * n * k,
                        operands=[f"{dtype}[{m},{k}]", f"{dtype}[{k},{n}]"],
                        outputs=[f"bf16[{m},{n}]"], bytes_read=width * (m * k + k * n),
                        bytes_written=2.0 * m * n)
            t = model.time(node)
            measured = 2.0 * m * n * k / (tflops * 1e12)
            rows.append({"source": "MAMF (ml-engineering)", "hardware": hardware,
                         "shape": f"{m}x{n}x{k} {label}",
                         "measured_TFLOPs": tflops, "predicted_TFLOPs": 2.0 * m * n * k / t / 1e12,
                         "error": t / measured - 1})
    for g in tracelens_kernels()["gemm_groups"]:
        rows.append({"source": "TraceLens trace (cuBLAS)", "hardware": "h100-sxm",
                     "shape": f"{g['shape']} x{g['count']}",
                     "measured_TFLOPs": g["flops"] / g["measured_s"] / 1e12,
                     "predicted_TFLOPs": g["flops"] / g["predicted_s"] / 1e12,
                     "error": g["predicted_s"] / g["measured_s"] - 1})
    return rows


def mamf_rule_rows() -> list[dict]:
    """Per GPU with a MAMF row: the gemm_fraction at which Flint's tile model reproduces it
    (the mean of its rows), the spec's figure, and their ratio, which is one number for every
    GPU (RULE). GPUs with no row (GB300) keep an assumed figure (their spec says which)."""
    from flint.hardware_models.compute import RooflineCompute
    from flint.hardware_models.kernels import GemmShape, figure, gemm_time
    from flint.hardware_models.spec import load_spec

    bursts: dict = {}
    for hardware, m, n, k, tflops in MAMF:
        spec = load_spec(hardware)
        peak = spec.peak("bf16")
        t = gemm_time(GemmShape(1, m, n, k), peak, spec.cores, RooflineCompute(spec).persistent)
        bursts.setdefault(hardware, []).append(tflops * 1e12 * t / (2.0 * m * n * k))
    rows = []
    for hardware, fractions in bursts.items():
        burst = statistics.mean(fractions)
        spec_figure = figure(load_spec(hardware), "gemm_fraction")
        rows.append({"hardware": hardware, "mamf_rows": len(fractions),
                     "reproducing_fraction": burst, "gemm_fraction": spec_figure,
                     "ratio": spec_figure / burst})
    return rows


def _launched_by(framework: str, node):
    """`node` as `framework` launches it, labelled by the engine's own pass
    (passes.kernel_population) on a one-node graph."""
    from flint.cluster import Cluster
    from flint.graph import WorkloadGraph
    from flint.passes.kernel_population import KernelPopulation

    graph = WorkloadGraph(Cluster(1, (("data", 1),)), [node], [], [], {})
    return KernelPopulation(framework).run(graph).nodes[0]


def attention_rows() -> list[dict]:
    from flint.graph import Node, NodeKind
    from flint.hardware_models.compute import RooflineCompute
    from flint.hardware_models.spec import load_spec
    from flint.passes.attention import attention_cost

    h100, a100 = RooflineCompute(load_spec("h100-sxm")), RooflineCompute(load_spec("a100-80gb-sxm"))

    def predicted(model, impl: str, d: int, s: int, causal: bool,
                  backward: bool = False) -> float:
        b, h = 16384 // s, 2048 // d
        flops, rd, wr = attention_cost(b, h, h, s, s, d, causal, backward)
        attn = {"batch": b, "heads": h, "kv_heads": h, "seq_q": s, "seq_kv": s, "head_dim": d,
                "causal": causal, "backward": backward, "dtype": "bf16", "impl": impl}
        node = Node(0, "attention", NodeKind.COMPUTE, "fused-attention", "attention",
                    flops=flops, bytes_read=rd, bytes_written=wr, operands=["bf16[1]"],
                    meta={"attention": attn})
        if impl == "unfused":            # the papers' "standard attention": PyTorch eager
            node = _launched_by("torch-eager", node)
        return flops / model.time(node) / 1e12

    rows = []
    for (d, causal), series in FA3_PAPER.items():
        for name, values in series.items():
            for s, v in zip(SEQS, values):
                if v is not None:
                    p = predicted(h100, IMPLS[name], d, s, causal)
                    rows.append({"source": "FA3 paper Fig. 5", "hardware": "h100-sxm",
                                 "kernel": name, "head_dim": d, "causal": causal, "seq": s,
                                 "measured_TFLOPs": v, "predicted_TFLOPs": p, "error": v / p - 1})
    for d, series in FA3_PAPER_BACKWARD.items():
        for name, values in series.items():
            for s, v in zip(SEQS, values):
                if v is not None:
                    p = predicted(h100, IMPLS[name], d, s, False, backward=True)
                    rows.append({"source": "FA3 paper Fig. 7 (backward)", "hardware": "h100-sxm",
                                 "kernel": name, "head_dim": d, "causal": False, "seq": s,
                                 "measured_TFLOPs": v, "predicted_TFLOPs": p, "error": v / p - 1})
    for s, v in zip(SEQS, FA3_TORCHBENCH):
        p = predicted(h100, "flash3", 128, s, False)
        rows.append({"source": "pytorch/benchmark D60117034", "hardware": "h100-sxm",
                     "kernel": "flash3", "head_dim": 128, "causal": False, "seq": s,
                     "measured_TFLOPs": v, "predicted_TFLOPs": p, "error": v / p - 1})
    peak = a100.spec.peak("bf16") / 1e12
    for kernel, (lo, hi) in (("flash2", FA2_A100_RANGE), ("flash1", FA1_A100_RANGE)):
        for d, s in ((64, 512), (64, 16384), (128, 512), (128, 16384)):
            p = predicted(a100, kernel, d, s, False)
            rows.append({"source": "FA2 paper (range)", "hardware": "a100-80gb-sxm",
                         "kernel": kernel, "head_dim": d, "causal": False, "seq": s,
                         "measured_TFLOPs": f"{lo * peak:.0f}-{hi * peak:.0f}",
                         "predicted_TFLOPs": p,
                         "error": 0.0 if lo * peak <= p <= hi * peak else
                         (lo * peak / p - 1 if p < lo * peak else hi * peak / p - 1)})
    for d in (192, 128):
        gb200 = predicted(RooflineCompute(load_spec("gb200-nvl72")), "native", d, 4096, True)
        gb300 = predicted(RooflineCompute(load_spec("gb300-nvl72")), "native", d, 4096, True)
        rows.append({"source": "NVIDIA Blackwell Ultra softmax blog", "hardware": "gb300 / gb200",
                     "kernel": "native", "head_dim": d, "causal": True, "seq": 4096,
                     "measured_TFLOPs": f"{BLACKWELL_ULTRA_FPROP_GAIN:.2f}x",
                     "predicted_TFLOPs": gb300 / gb200, "ratio": True,
                     "error": BLACKWELL_ULTRA_FPROP_GAIN / (gb300 / gb200) - 1})
    return rows


def render(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=130)
    if "gemm" in report:
        t = Table(title="GEMMs vs published cuBLAS figures (error: predicted / measured time - 1)")
        for col in ("source", "hardware", "shape", "measured", "Flint", "error"):
            t.add_column(col, justify="right" if col in ("measured", "Flint", "error") else "left")
        for r in report["gemm"]:
            t.add_row(r["source"], r["hardware"], r["shape"], f"{r['measured_TFLOPs']:.0f} TFLOP/s",
                      f"{r['predicted_TFLOPs']:.0f} TFLOP/s", f"{100 * r['error']:+.1f} %")
        console.print(t)
        r = Table(title=f"One rule for every GPU: spec gemm_fraction = {RULE} x the fraction "
                        "that reproduces its MAMF")
        for col in ("hardware", "MAMF rows", "reproducing fraction", "spec", "ratio"):
            r.add_column(col, justify="left" if col == "hardware" else "right")
        for row in report.get("mamf_rule", []):
            r.add_row(row["hardware"], str(row["mamf_rows"]), f"{row['reproducing_fraction']:.3f}",
                      f"{row['gemm_fraction']:.3f}", f"{row['ratio']:.3f}")
        console.print(r)
    if "attention" in report:
        t = Table(title="Attention kernels vs published FlashAttention figures (forward, bf16)")
        for col in ("source", "hardware", "kernel", "head dim", "mask", "seq", "measured",
                    "Flint", "error"):
            t.add_column(col, justify="left" if col in ("source", "hardware", "kernel", "mask")
                         else "right")
        for r in report["attention"]:
            m = r["measured_TFLOPs"]
            flint = (f"{r['predicted_TFLOPs']:.2f}x" if r.get("ratio")
                     else f"{r['predicted_TFLOPs']:.0f} TFLOP/s")
            t.add_row(r["source"], r["hardware"], r["kernel"], str(r["head_dim"]),
                      "causal" if r["causal"] else "full", str(r["seq"]),
                      m if isinstance(m, str) else f"{m:.0f} TFLOP/s",
                      flint, f"{100 * r['error']:+.1f} %")
        console.print(t)
        by_kernel: dict = {}
        for r in report["attention"]:
            by_kernel.setdefault((r["source"], r["kernel"]), []).append(abs(r["error"]))
        for (source, kernel), errs in by_kernel.items():
            console.print(f"  {source:<30} {kernel:<9} {len(errs):>3} points, median |error| "
                          f"{100 * statistics.median(errs):.1f} %", highlight=False)
    for name, tr in report.get("traces", {}).items():
        head = f"{name}: {tr['ops']} ops, median per-op |error| {100 * tr['median_abs_error']:.1f} %"
        if tr["step_error"] is not None:
            head += f", step error {100 * tr['step_error']:+.1f} %"
        c = Table(title=head)
        for col in ("op class / duration", "ops", "measured", "predicted", "ratio",
                    "median |op error|"):
            c.add_column(col, justify="left" if col.startswith("op class") else "right")
        rows = [(k, v) for k, v in tr["by_class"].items()] + [
            (d["bucket"], d) for d in tr["by_duration"]]
        for label, d in rows:
            c.add_row(label, str(d["ops"]), f"{d['measured_s'] * 1e3:.3f} ms",
                      f"{d['predicted_s'] * 1e3:.3f} ms", f"{d['ratio']:.2f}x",
                      f"{100 * d['median_abs_error']:.0f} %")
        console.print(c)
        for note in tr["notes"]:
            console.print(f"  note: {note}", highlight=False)
        if tr.get("beside_collectives"):
            console.print(_rows_table(
                f"{name}: kernels a collective overlapped (>= half their length) vs the same "
                f"ops alone", ("op class", "executions", "measured alone", "measured beside",
                               "measured ratio", "Flint ratio"),
                [(r["op_class"], str(r["executions"]), f"{r['measured_alone_s'] * 1e3:.2f} ms",
                  f"{r['measured_s'] * 1e3:.2f} ms", f"{r['measured_ratio']:.2f}x",
                  f"{r['flint_ratio']:.2f}x") for r in tr["beside_collectives"]]))
        if tr.get("collectives_beside"):
            console.print(_rows_table(
                f"{name}: collectives (>= 50 us) by the share of their length memory-bound "
                f"kernels covered; Flint / measured",
                ("collective", "memory-bound cover", "executions", "measured, each",
                 "Flint alone", "Flint beside the kernels"),
                [(f"{r['collective']} {r['bytes'] / 2**20:.0f} MiB", r["memory_cover"],
                  str(r["executions"]), f"{r['measured_s'] / r['executions'] * 1e6:.0f} us",
                  f"{r['flint_alone_ratio']:.2f}x", f"{r['flint_ratio']:.2f}x")
                 for r in tr["collectives_beside"]]))


def _rows_table(title: str, columns, rows):
    """A table whose first column is a label and the rest figures."""
    from rich.table import Table

    t = Table(title=title)
    for i, col in enumerate(columns):
        t.add_column(col, justify="left" if i == 0 else "right")
    for row in rows:
        t.add_row(*row)
    return t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--section", choices=("gemm", "attention", "traces"), action="append")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    sections = a.section or ["gemm", "attention", "traces"]
    report = {}
    if "gemm" in sections:
        report["gemm"] = gemm_rows()
        report["mamf_rule"] = mamf_rule_rows()
    if "attention" in sections:
        report["attention"] = attention_rows()
    if "traces" in sections:
        report["traces"] = trace_tables()
    if a.json:
        print(json.dumps(report, indent=1, default=str))
    else:
        render(report)


if __name__ == "__main__":
    main()
