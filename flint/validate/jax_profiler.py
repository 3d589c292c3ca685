"""JAX / XLA profiler output (`jax.profiler.trace`): `*.trace.json.gz`, `perfetto_trace.json.gz`
or `*.xplane.pb` (converted by xprof, an optional extra), or the log directory holding them.

XLA tags every op event with `hlo_module`, `hlo_op` and the execution's `run_id`
(`device_ordinal` on host devices; on GPUs and TPUs the device is the event's process).
A step is one `run_id` of the module (or one `group_id` step marker when run ids are absent);
its time is the slowest device's span from its first op to its last.

A trace of a `flint replay` program has `flint_replay_names.json` in its log directory: the
replay's instruction names -> the graph's node names, so the trace joins the source graph.
"""
from __future__ import annotations

import bisect
import json
import re
from collections import Counter, defaultdict
from pathlib import Path

from flint.errors import FlintError
from flint.validate.measured import MeasuredStep, MeasuredTrace
from flint.validate.trace_events import JaxOpEvent, checked, read_trace_events


def find_profile_file(path: Path) -> Path:
    """A log directory -> its newest trace file (JSON preferred, else xplane.pb)."""
    if path.is_file():
        return path
    found = sorted(path.rglob("*.trace.json.gz")) or sorted(path.rglob("perfetto_trace.json.gz")) \
        or sorted(path.rglob("*.xplane.pb"))
    if not found:
        raise FlintError(f"{path} holds no JAX profiler output (*.trace.json.gz, *.xplane.pb)")
    return found[-1]


def load_trace_events(path: Path) -> list[dict]:
    if path.name.endswith(".xplane.pb"):
        return _xplane_events(path)
    return read_trace_events(path)


def _xplane_events(path: Path) -> list[dict]:
    try:
        from xprof.convert import raw_to_tool_data
    except ImportError:
        raise FlintError(f"{path}: reading xplane.pb needs the xprof extra "
                         f"(pip install 'flint[xprof]'), or pass the *.trace.json.gz that "
                         f"jax.profiler wrote beside it") from None
    try:
        data, _ = raw_to_tool_data.xspace_to_tool_data([str(path)], "trace_viewer", {})
        return json.loads(data)["traceEvents"]
    except Exception as e:  # noqa: BLE001 - xprof raises many types for a bad proto
        raise FlintError(f"{path} is not a readable xplane.pb: {type(e).__name__}") from None


def is_jax_profile(events: list[dict]) -> bool:
    return any(isinstance(e, dict) and isinstance(e.get("args"), dict) and "hlo_op" in e["args"]
               for e in events[:200000])


def replay_names(trace_file: Path, given: Path) -> dict | None:
    """The names map a replay wrote at the top of its log directory, if this trace has one:
    searched from the trace file's directory up to the directory the user gave (or up to
    the log directory of jax.profiler's `plugins/profile/<run>/` layout)."""
    from flint.io import read_json
    from flint.replay import NAMES_FILE

    chain = [trace_file.parent, *trace_file.parent.parents]
    top = chain.index(given) + 1 if given in chain else 4
    for directory in chain[:top]:
        if (directory / NAMES_FILE).is_file():
            names = read_json(directory / NAMES_FILE)
            if not isinstance(names, dict) or not isinstance(names.get("ops"), dict):
                raise FlintError(f"{directory / NAMES_FILE} is not a replay names map")
            return names
    return None


def read_jax_profile(path, module: str | None = None, events=None) -> MeasuredTrace:
    """`events`: the file's trace events when the caller has already read them."""
    given = Path(path)
    path = find_profile_file(given)
    names = replay_names(path, given)
    rename = names["ops"] if names else {}
    if names and module is None:
        module = names.get("module")
    if events is None:
        events = load_trace_events(path)
    ops = checked(JaxOpEvent, [e for e in events if isinstance(e, dict) and e.get("ph") == "X"
                               and isinstance(e.get("args"), dict) and "hlo_op" in e["args"]],
                  path, "JAX op event")
    if not ops:
        raise FlintError(f"{path} has no XLA op events (no `hlo_op`): not a JAX profile of "
                         f"a compiled step")
    time_by_module = Counter()
    for e in ops:
        time_by_module[e["args"].get("hlo_module", "")] += float(e["dur"])
    if module is None:
        module = time_by_module.most_common(1)[0][0]
    elif module not in time_by_module:
        raise FlintError(f"{path} has no executions of module {module!r} "
                         f"(it has: {', '.join(sorted(time_by_module))})")
    process = {e.get("pid"): e["args"].get("name", "") for e in events
               if e.get("ph") == "M" and e.get("name") == "process_name"
               and isinstance(e.get("args"), dict)}
    spans: dict[str, dict[str, list[float]]] = defaultdict(dict)
    per_op: dict[str, dict[str, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    kernels: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    step_of = _host_executions(events, module)
    for e in sorted(ops, key=lambda e: float(e["ts"])):
        a = e["args"]
        if a.get("hlo_module", "") != module:
            continue
        step = str(a.get("run_id", a.get("group_id", step_of(float(e["ts"])))))
        device = str(a.get("device_ordinal", process.get(e.get("pid"), e.get("pid"))))
        start, dur = float(e["ts"]) * 1e-6, float(e["dur"]) * 1e-6
        lo_hi = spans[step].setdefault(device, [start, start + dur])
        lo_hi[0], lo_hi[1] = min(lo_hi[0], start), max(lo_hi[1], start + dur)
        if COMMAND_BUFFER.match(a["hlo_op"]) and not rename:
            kernels[step][device].append((str(e.get("name", "")), dur))
            continue
        d = per_op[step][device]
        op = rename.get(a["hlo_op"], a["hlo_op"])
        d[op] = d.get(op, 0.0) + dur
    order = sorted(spans, key=lambda s: min(v[0] for v in spans[s].values()))
    steps = [MeasuredStep(k + 1, max(hi - lo for lo, hi in spans[s].values()),
                          {dev: dict(ops_) for dev, ops_ in sorted(per_op[s].items())},
                          {dev: list(ks) for dev, ks in sorted(kernels[s].items())})
             for k, s in enumerate(order)]
    return MeasuredTrace(str(path), "jax-profiler", module, steps)


# XLA runs most of a GPU step as command buffers (CUDA graphs); the profiler then tags each
# kernel of one with the command buffer's thunk, not its HLO op, and the kernel carries the
# name XLA gave it (a fusion's name, '.' -> '_') or the library's (cuBLAS, cuDNN).
COMMAND_BUFFER = re.compile(r"^command_buffer(_\d+)?$")


def _host_executions(events: list[dict], module: str):
    """ts -> the run id of the host execution of `module` that launched work at ts: GPU
    kernel events of a jax 0.11 profile carry no run id; PjRt's host `Execute` event does
    (`CommonPjRtLoadedExecutable::Execute (jit_step)`, args name and run_id)."""
    starts = sorted((float(e["ts"]), str(e["args"]["run_id"])) for e in events
                    if isinstance(e, dict) and e.get("ph") == "X"
                    and isinstance(e.get("args"), dict) and "run_id" in e["args"]
                    and "hlo_op" not in e["args"]
                    and (e["args"].get("name") == module
                         or str(e.get("name", "")).endswith(f"({module})")))
    times = [t for t, _ in starts]

    def step_of(ts: float) -> str:
        i = bisect.bisect_right(times, ts) - 1
        return starts[i][1] if i >= 0 else "0"
    return step_of
