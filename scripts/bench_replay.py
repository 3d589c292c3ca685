"""Replay fidelity: a built-in model's real step vs the `flint replay` of its graph.

On this machine's host CPU devices, one process compiles the model's training step, extracts
its graph from that executable, and compiles the graph's replay. It then times the two in
alternating rounds (so drift and other load hit both alike), and profiles both with
jax.profiler: each trace is validated against the graph (`flint validate`'s join and step
error, with the stock cpu spec and with the spec calibrated on the original's trace), and
the replay's per-node times are compared with the original's.

    python scripts/bench_replay.py                      # gpt2-small shape, 2 layers, 8 devices
    python scripts/bench_replay.py --rounds 9 --json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="gpt2-small")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--devices", type=int, default=8)
    p.add_argument("--mesh", default="fsdp=8")
    p.add_argument("--rounds", type=int, default=7, help="timed rounds (one step of each)")
    p.add_argument("--profile-steps", type=int, default=3)
    p.add_argument("--out", help="keep the traces and the replay program here")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()

    from flint.replay.runtime import ask_for_host_devices

    ask_for_host_devices(a.devices)
    from rich.console import Console
    from rich.table import Table

    from flint.frontends.targets import prepare_environment
    from flint.hardware_models.spec import load_spec
    from flint.replay import load_replay, replay_program
    from flint.validate.live import compile_zoo_step
    from flint.validate.calibrate import model_for
    from flint.validate.compare import validate
    from flint.validate.workflow import open_input, run_calibrate, run_validate

    prepare_environment()
    import jax

    console = Console(stderr=True)
    out = Path(a.out or tempfile.mkdtemp(prefix="flint-replay-"))
    out.mkdir(parents=True, exist_ok=True)
    with console.status("compiling the original step and extracting its graph"):
        graph, step, args = compile_zoo_step(a.model, a.devices, a.mesh, layers=a.layers,
                                             seq_len=a.seq_len)
        graph.save(out / "graph.json")
        (out / "bench.py").write_text(replay_program(graph, f"{a.model} ({a.layers} layers)"))
    with console.status("compiling the replay"):
        replay = load_replay(graph)
    replay.run()
    original_s, replay_s = [], []
    for r in range(a.rounds):
        console.log(f"round {r + 1}/{a.rounds}")
        t0 = time.perf_counter()
        args = step(args)
        original_s.append(time.perf_counter() - t0)
        replay_s.append(replay.time_steps(1, warmup=0)[0])

    with console.status("profiling both"):
        jax.profiler.start_trace(str(out / "original"))
        try:
            for i in range(a.profile_steps + 1):
                with jax.profiler.StepTraceAnnotation("train", step_num=i):
                    args = step(args)
        finally:
            jax.profiler.stop_trace()
        replay.profile(out / "replay", a.profile_steps + 1, warmup=0)
    spec = load_spec("cpu")
    inputs = {name: open_input(str(out / name), graph, "cpu") for name in ("original", "replay")}
    # The cost model calibrated on the real step's trace, then asked about each trace.
    calibrated = model_for(run_calibrate([inputs["original"]], spec).calibration.apply(spec),
                           graph)
    checks = {}
    for name, inp in inputs.items():
        v = run_validate(inp, spec)
        c = validate(graph, inp.trace.select(), calibrated)
        checks[name] = {"join_share": v.join_share, "measured_step_s": v.measured_step_s,
                        "predicted_step_s": v.predicted_step_s, "step_error": v.step_error,
                        "calibrated_predicted_step_s": c.predicted_step_s,
                        "calibrated_step_error": c.step_error,
                        "op_times": inp.trace.select().op_times()}
    node_error = _node_error(checks["original"].pop("op_times"), checks["replay"].pop("op_times"))
    o, r = statistics.median(original_s), statistics.median(replay_s)
    result = {"model": a.model, "layers": a.layers, "devices": a.devices, "mesh": a.mesh,
              "nodes": len(graph), "replay_ops": len(replay.spec["ops"]),
              "original_step_s": o, "replay_step_s": r, "replay_over_original": r / o,
              "rounds": a.rounds, "original_round_s": original_s, "replay_round_s": replay_s,
              "validation": checks, "node_time_error": node_error,
              "approximations": replay.spec["approximations"], "out": str(out)}
    if a.json:
        print(json.dumps(result, sort_keys=True, indent=1))
        return 0
    t = Table(title=f"Replay fidelity: {a.model}, {a.layers} layers, {a.devices} host CPU "
                    f"devices ({a.mesh}), {a.rounds} alternating rounds")
    for c in ("", "original step", "replay", "replay / original"):
        t.add_column(c, justify="right")
    t.add_row("median step", f"{o * 1e3:.1f} ms", f"{r * 1e3:.1f} ms", f"{r / o:.3f}")
    t.add_row("min step", f"{min(original_s) * 1e3:.1f} ms", f"{min(replay_s) * 1e3:.1f} ms",
              f"{min(replay_s) / min(original_s):.3f}")
    for key, label in (("measured_step_s", "profiled step"), ("predicted_step_s", "graph estimate")):
        t.add_row(label, f"{checks['original'][key] * 1e3:.1f} ms",
                  f"{checks['replay'][key] * 1e3:.1f} ms", "")
    t.add_row("trace time joined to graph nodes", f"{checks['original']['join_share']:.1%}",
              f"{checks['replay']['join_share']:.1%}", "")
    t.add_row("step error, cpu spec", f"{checks['original']['step_error']:+.1%}",
              f"{checks['replay']['step_error']:+.1%}", "")
    t.add_row("step error, spec calibrated on the original",
              f"{checks['original']['calibrated_step_error']:+.1%}",
              f"{checks['replay']['calibrated_step_error']:+.1%}", "")
    Console().print(t)
    print(f"per-node time, replay vs original: {node_error['weighted_abs_error']:.1%} "
          f"time-weighted mean abs error over {node_error['nodes']} nodes "
          f"({node_error['covered_share']:.1%} of the original's op time)")
    print(f"approximations: {result['approximations'] or 'none'}; traces and bench.py in {out}")
    return 0


def _node_error(original: dict, replay: dict) -> dict:
    """Per graph node: |replay - original| weighted by the original's time."""
    common = sorted(set(original) & set(replay))
    total = sum(original.values()) or 1.0
    covered = sum(original[n] for n in common)
    err = sum(abs(replay[n] - original[n]) for n in common)
    return {"nodes": len(common), "covered_share": covered / total,
            "weighted_abs_error": err / covered if covered else 0.0}


if __name__ == "__main__":
    sys.exit(main())
