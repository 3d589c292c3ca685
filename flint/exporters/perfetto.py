"""A predicted timeline as Chrome trace-event JSON (opens in Perfetto and chrome://tracing)."""
from __future__ import annotations

from flint.graph import dumps_json
from flint.io import write_atomic

_TIDS = {"compute": 1, "collectives": 2, "p2p": 3, "p2p-send": 3, "p2p-recv": 5, "copies": 4}


def timeline_events(timeline) -> dict:
    graph = timeline.graph
    events = [{"ph": "M", "name": "process_name", "pid": 0, "tid": 0,
               "args": {"name": f"device 0 of {graph.cluster.devices} ({graph.cluster.hardware})"}}]
    for stream, tid in _TIDS.items():
        events.append({"ph": "M", "name": "thread_name", "pid": 0, "tid": tid,
                       "args": {"name": stream}})
    critical = set(timeline.critical_path)
    for node, start, finish, stream in zip(graph.nodes, timeline.start, timeline.finish,
                                           timeline.stream):
        events.append({"ph": "X", "pid": 0, "tid": _TIDS.get(stream, 6), "name": node.name,
                       "cat": node.op_class, "ts": round(start * 1e6, 3),
                       "dur": round((finish - start) * 1e6, 3),
                       "args": {"op": node.op, "flops": node.flops,
                                "bytes": node.bytes_read + node.bytes_written,
                                "layer": node.meta.get("layer", ""),
                                "critical": node.id in critical}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_timeline(timeline, path) -> None:
    write_atomic(path, dumps_json(timeline_events(timeline)))
