"""Hostile Chakra exports and profiler traces for tests/hostile_cases.py: malformed
Chakra ET files (protobuf-encoded from one valid export by mutation) and broken JAX, Kineto
and nsys traces, each a (name, setup, argv) case that must end in exit code 2 with one line
on stderr."""
from __future__ import annotations

import gzip
import io
import json
import zipfile

from hostile_cases import write_graph


# --- Chakra ---------------------------------------------------------------------------
def _et_bytes(meta_attrs=(), nodes=()) -> bytes:
    from chakra.src.third_party.utils.protolib import encodeMessage

    from flint.exporters import chakra_format as cf

    buf = io.BytesIO()
    encodeMessage(buf, cf.GlobalMetadata(version="0.0.4", attr=list(meta_attrs)))
    for n in nodes:
        encodeMessage(buf, n)
    return buf.getvalue()


def _comm_node(size=1024, comm_type=0, pg="0", node_id=1):
    from flint.exporters import chakra_format as cf

    attrs = [cf.Attr(name="comm_type", int64_val=comm_type),
             cf.Attr(name="comm_size", int64_val=size)]
    if pg is not None:
        attrs.append(cf.Attr(name="pg_name", string_val=pg))
    return cf.Node(id=node_id, name="ar", type=cf.COLL, attr=attrs)


def _comp_node(node_id=0, **attrs):
    from flint.exporters import chakra_format as cf

    return cf.Node(id=node_id, name="gemm", type=cf.COMP, attr=[
        cf.Attr(name=k, **v) for k, v in attrs.items()])


def _chakra_cases():
    from flint.exporters import chakra_format as cf

    def et_dir(d, files: dict, groups=None, manifest=None):
        e = d / "et"
        e.mkdir()
        for name, data in files.items():
            (e / name).write_bytes(data)
        if groups is not None:
            (e / "comm_groups.json").write_text(groups if isinstance(groups, str)
                                                else json.dumps(groups))
        if manifest is not None:
            (e / "flint_export.json").write_text(manifest)

    ok = _et_bytes(nodes=[_comp_node(num_ops={"int64_val": 10}), _comm_node()])
    graph_attr = cf.Attr(name="flint_graph", string_val="{not json")
    no_cluster = cf.Attr(name="flint_graph", string_val=json.dumps(
        {"format": "flint.chakra", "version": 1, "communicators": []}))
    flint_node = cf.Node(id=0, name="x", type=cf.COMP, attr=[
        cf.Attr(name="flint_node", string_val="[1, 2")])
    good_graph_attr = cf.Attr(name="flint_graph", string_val=json.dumps(
        {"format": "flint.chakra", "version": 1, "communicators": [],
         "cluster": {"devices": 2, "mesh": [["data", 2]]}}))
    cases = {
        "flint_graph not JSON": {"w.0.et": _et_bytes([graph_attr], [_comp_node()])},
        "flint_graph lacks cluster": {"w.0.et": _et_bytes([no_cluster], [_comp_node()])},
        "flint_node not JSON": {"w.0.et": _et_bytes([good_graph_attr], [flint_node])},
        "negative comm_size": {"w.0.et": _et_bytes(nodes=[_comm_node(size=-5)])},
        "unknown comm_type": {"w.0.et": _et_bytes(nodes=[_comm_node(comm_type=99)])},
        "num_ops text": {"w.0.et": _et_bytes(nodes=[_comp_node(num_ops={
            "string_val": "many"})])},
        "rank gap 0,1,5": {"w.0.et": ok, "w.1.et": ok, "w.5.et": ok},
        "JSON trace": {"w.0.et": b'{"schema": "1.0.2-chakra.0.0.4", "nodes": []}'},
        "gzip": {"w.0.et": gzip.compress(ok)},
        "truncated": {"w.0.et": ok[:-3]},
        "random bytes": {"w.0.et": bytes(range(7, 250))},
        "empty": {"w.0.et": b""},
        "dependency on missing node": {"w.0.et": _et_bytes(nodes=[cf.Node(
            id=0, name="a", type=cf.COMP, data_deps=[9])])},
        "duplicate id": {"w.0.et": _et_bytes(nodes=[_comp_node(0), _comp_node(0)])},
        "two prefixes": {"a.0.et": ok, "b.0.et": ok},
    }
    for name, files in cases.items():
        yield (f"chakra {name}", lambda d, f=files: et_dir(d, f, groups={"0": [0, 1]}),
               lambda d: ["import", str(d / "et")])
    for name, groups in {"group 0,0,1": {"0": [0, 0, 1]}, "groups not JSON": "{",
                         "groups a list": [[0, 1]], "group of words": {"0": ["a"]},
                         "group empty": {"0": []}, "undefined pg": {"7": [0, 1]}}.items():
        yield (f"chakra {name}", lambda d, g=groups: et_dir(d, {"w.0.et": ok}, groups=g),
               lambda d: ["import", str(d / "et")])
    for name, text in {"manifest not JSON": "{", "manifest a list": "[1]"}.items():
        yield (f"chakra {name}", lambda d, t=text: et_dir(d, {"w.0.et": ok}, manifest=t),
               lambda d: ["import", str(d / "et")])
    yield ("chakra empty directory", lambda d: (d / "et").mkdir(),
           lambda d: ["import", str(d / "et")])
    yield ("chakra missing rank", lambda d: et_dir(d, {"w.0.et": ok}),
           lambda d: ["import", str(d / "et"), "--rank", "3"])


# --- traces ---------------------------------------------------------------------------
def _jax_event(**over):
    e = {"ph": "X", "pid": 1, "tid": 1, "ts": 10.0, "dur": 5.0, "name": "dot.1",
         "args": {"hlo_op": "dot.1", "hlo_module": "jit_step", "run_id": "1"}}
    e.update(over)
    return e


def _kernel(**over):
    e = {"ph": "X", "cat": "kernel", "name": "sm90_gemm", "pid": 0, "tid": 7, "ts": 1.0,
         "dur": 2.0, "args": {"device": 0, "correlation": 1}}
    e.update(over)
    return e


def _nccl(**args):
    base = {"Collective name": "allreduce", "In msg nelems": 1024, "Out msg nelems": 1024,
            "Group size": 2, "dtype": "Float", "device": 0}
    base.update(args)
    return _kernel(name="ncclKernel_AllReduce_RING_LL_Sum_float", args=base)


def _nsys_zip(columns: dict) -> bytes:
    import lzma

    import pyarrow as pa
    import pyarrow.parquet as pq

    table = io.BytesIO()
    pq.write_table(pa.table(columns), table)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        z.writestr("dump/m.jit_train_step.sm_90_gpu_after_optimizations.hlo.pb.xz",
                   lzma.compress(b"not a proto"))
        z.writestr("nvtx_gpu_proj_trace/trace.parquet", table.getvalue())
    return out.getvalue()


def _trace_cases():
    traces = {
        "event not an object": [_jax_event(), 5],
        "dur abc": [_jax_event(dur="abc")],
        "missing ts": [{k: v for k, v in _jax_event().items() if k != "ts"}],
        "missing dur": [{k: v for k, v in _jax_event().items() if k != "dur"}],
        "hlo_op list": [_jax_event(args={"hlo_op": ["dot"], "hlo_module": "m"})],
        "negative dur": [_jax_event(dur=-3)],
        "kernel without ts": [{k: v for k, v in _kernel().items() if k != "ts"}],
        "kernel dur text": [_kernel(dur="2us")],
        "traceEvents a number": {"traceEvents": 5},
        "no events": [],
        "neither format": [{"ph": "X", "name": "x", "ts": 1, "dur": 1}],
    }
    for name, doc in traces.items():
        yield (f"trace {name}", lambda d, x=doc: (write_graph(d), (d / "t.json").write_text(
            json.dumps(x))), lambda d: ["validate", str(d / "g.json"), "--trace",
                                        str(d / "t.json")])
    raw = {"not JSON": b"{traceEvents", "truncated gzip": gzip.compress(b"[1,2,3]" * 99)[:30],
           "binary": bytes(range(256)), "deep": b"[" * 100000}
    for name, data in raw.items():
        yield (f"trace file {name}", lambda d, b=data: (write_graph(d),
                                                         (d / "t.json").write_bytes(b)),
               lambda d: ["validate", str(d / "g.json"), "--trace", str(d / "t.json")])
    for name, args in {"nelems lots": {"In msg nelems": "lots"},
                       "nelems negative": {"Out msg nelems": -4},
                       "group size text": {"Group size": "two"}}.items():
        yield (f"kineto NCCL {name}",
               lambda d, a=args: (d / "k.json").write_text(json.dumps(
                   {"traceEvents": [_nccl(**a)]})),
               lambda d: ["calibrate", "--trace", str(d / "k.json"), "--out",
                          str(d / "c.yaml")])
    nsys = {
        "missing columns": {"Wrong": ["x"]},
        "no module rows": {"Name": ["TSL:Thunk:#hlo_op=x#"], "Projected Start": [1],
                           "Projected Duration": [1], "TID": [1], "RangeId": [1],
                           "ParentId": [0]},
    }
    for name, cols in nsys.items():
        yield (f"nsys-jax {name}", lambda d, c=cols: (write_graph(d), (d / "n.zip").write_bytes(
            _nsys_zip(c))), lambda d: ["validate", str(d / "g.json"), "--trace",
                                       str(d / "n.zip")])
    yield ("nsys-jax not a zip", lambda d: (write_graph(d), (d / "n.zip").write_bytes(
        b"PK\x03\x04garbage")), lambda d: ["validate", str(d / "g.json"), "--trace",
                                            str(d / "n.zip")])
    yield ("trace missing", write_graph,
           lambda d: ["validate", str(d / "g.json"), "--trace", str(d / "none.json")])
    yield ("trace dir without profiles", lambda d: (write_graph(d), (d / "logs").mkdir()),
           lambda d: ["validate", str(d / "g.json"), "--trace", str(d / "logs")])
