"""The three shared traces, op by op, against Flint's compute and collective models: per op
class and per kernel-duration bucket, and the MaxText trace's kernels that ran beside a
collective against the same ops alone (flint/validate/overlap.py). scripts/compare_kernels.py
prints them (--section traces)."""
from __future__ import annotations

import statistics
from pathlib import Path

TRACES = Path(__file__).resolve().parents[2] / "shared/traces"
MAXTEXT = TRACES / "jaxtoolbox_maxtext_fsdp4_4xH100.data.zip"
TRACELENS = TRACES / "tracelens_qwen1.5-0.5b_fwd_1xH100.json.gz"
HTA = TRACES / "hta_resnet50_ddp_2xA100_nccl_data.json.gz"


def trace_tables() -> dict:
    """Per trace: op-class and duration-bucket tables (predicted / measured, median per-op
    |error|)."""
    from flint.hardware_models.spec import load_spec
    from flint.validate.compare import OpResult, by_class, by_duration
    from flint.validate.workflow import open_input, run_validate

    out = {}
    # JAX-Toolbox's 2024 MaxText run: XLA's LLVM emitters (populations.XLA_EMITTERS)
    mt = run_validate(open_input(MAXTEXT, hardware="h100-sxm", xla_emitters="legacy"),
                      load_spec("h100-sxm"), None, ["input_scatter_fusion"])
    out["MaxText nsys-jax, 4x H100 (XLA)"] = _tables(mt.ops, by_class, by_duration, mt.step_error)
    out["MaxText nsys-jax, 4x H100 (XLA)"]["beside_collectives"] = _beside_collectives()
    out["MaxText nsys-jax, 4x H100 (XLA)"]["collectives_beside"] = _collectives_beside()
    tl = tracelens_kernels()
    ops = [OpResult(r["op"], r["class"], r["measured_s"], r["predicted_s"]) for r in tl["kernels"]]
    out["TraceLens Kineto, 1x H100 (eager PyTorch)"] = _tables(ops, by_class, by_duration, None,
                                                              tl["notes"])
    hta = [OpResult(f"all-reduce {s.node.collective.bytes_in}", "collective:all-reduce",
                    s.seconds, t) for s, t in _hta()]
    out["HTA Kineto, 2x A100 (NCCL all-reduces, fastest per size)"] = _tables(
        hta, by_class, by_duration, None,
        ["kernel times include the wait for the peer rank (MANIFEST); compute kernels carry "
         "no shapes in this trace"])
    return out


def _beside_collectives() -> list[dict]:
    """The MaxText trace's ops that a collective overlapped: their time against the same
    ops' alone, measured and as Flint's interference model prices it."""
    from flint.hardware_models.spec import load_spec
    from flint.validate.calibrate import model_for
    from flint.validate.overlap import overlap_table
    from flint.validate.workflow import open_input

    inp = open_input(MAXTEXT, hardware="h100-sxm", xla_emitters="legacy")
    return overlap_table(MAXTEXT, inp.graph, model_for(load_spec("h100-sxm"), inp.graph))


def _collectives_beside() -> list[dict]:
    """The MaxText trace's collectives by the share of their length memory-bound kernels
    covered: measured, and as Flint prices them alone and beside those kernels."""
    from flint.hardware_models.spec import load_spec
    from flint.validate.calibrate import model_for
    from flint.validate.overlap import collective_table
    from flint.validate.workflow import open_input

    inp = open_input(MAXTEXT, hardware="h100-sxm", xla_emitters="legacy")
    return collective_table(MAXTEXT, inp.graph, model_for(load_spec("h100-sxm"), inp.graph))


def _tables(ops, by_class, by_duration, step_error, notes=()) -> dict:
    errs = [abs(o.error) for o in ops if o.measured_s > 0]
    return {"ops": len(ops), "median_abs_error": statistics.median(errs) if errs else None,
            "step_error": step_error, "by_class": by_class(ops),
            "by_duration": [d for d in by_duration(ops) if d["ops"]], "notes": list(notes)}


_TRACELENS: dict = {}


def tracelens_kernels() -> dict:
    """Every kernel of the TraceLens step as the node of the aten op that launched it,
    priced by the eager population (its graph is PyTorch eager)."""
    if _TRACELENS:
        return _TRACELENS
    from flint.hardware_models.compute import RooflineCompute
    from flint.hardware_models.spec import load_spec
    from flint.validate.kernel_nodes import execution_node, executions, other_executions
    from flint.validate.kineto_kernels import step_kernels
    from flint.validate.trace_events import read_trace_events

    model = RooflineCompute(load_spec("h100-sxm"))
    found = step_kernels(read_trace_events(TRACELENS, "Kineto trace"), 6, str(TRACELENS))
    execs, others = executions(found.kernels)
    rest, loose = other_executions(others)
    kernels, groups, unbuilt = [], {}, 0
    for i, ex in enumerate(execs + rest):
        node = execution_node(ex, i)
        if node is None:
            unbuilt += len(ex.kernels)
            continue
        t = model.time(node)
        kernels.append({"op": ex.op.name, "class": ex.op_class, "measured_s": ex.measured_s,
                        "predicted_s": t})
        if ex.op_class == "gemm":
            g = node.meta["gemm"]
            key = f"M={g['m']} N={g['n']} K={g['k']} {g['dtype']}"
            e = groups.setdefault(key, {"shape": key, "count": 0, "flops": 0.0,
                                        "measured_s": 0.0, "predicted_s": 0.0})
            e["count"] += 1
            e["flops"] += node.flops
            e["measured_s"] += ex.measured_s
            e["predicted_s"] += t
    _TRACELENS.update({"kernels": kernels, "gemm_groups": list(groups.values()), "notes": [
        f"{unbuilt + len(loose)} of {len(found.kernels)} kernels not priced (operators whose "
        f"recorded arguments torch's meta kernels cannot rebuild: cat's tensor lists, "
        f"mean's dim lists)"]})
    return _TRACELENS


def _hta():
    from flint.hardware_models.network import NetworkModel
    from flint.hardware_models.spec import load_spec
    from flint.validate.samples import samples_from_nccl

    spec = load_spec("a100-40gb-sxm")
    return [(s, NetworkModel(spec, s.cluster).time(s.node, s.comm))
            for s in samples_from_nccl(HTA) if s.node.op == "all-reduce"]
