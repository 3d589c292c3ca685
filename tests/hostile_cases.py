"""A generated corpus of bad inputs for every `flint` surface (tests/test_hostile_inputs.py).

Each case is (name, setup, argv): `setup(d)` writes the case's inputs into the fresh
directory `d` and `argv(d)` is the command line. Every case must end with exit code 2, one
line on stderr, no traceback and no file written. Inputs are built here from one valid
graph, spec, Chakra export and trace by mutation, not checked in as blobs (the Chakra and
trace cases in tests/hostile_file_cases.py).
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import yaml

from flint.cluster import Cluster
from flint.graph import Collective, Communicator, Node, NodeKind, WorkloadGraph

SPECS = Path(__file__).resolve().parents[1] / "hardware_models" / "specs"


# --- valid inputs the cases mutate ---------------------------------------------------
def tiny_graph() -> WorkloadGraph:
    """GEMM -> all-reduce over 8 ranks -> add: every node kind the readers check."""
    c = Cluster(8, (("data", 8),), "h100-sxm")
    comm = Communicator(0, "groups", "{{0,1,2,3,4,5,6,7}}", 8, 8, 1, ("data",))
    shape = "bf16[1024,1024]"
    nodes = [
        Node(0, "dot.1", NodeKind.COMPUTE, "dot", "gemm", flops=2 * 1024**3,
             bytes_read=4 * 2**20, bytes_written=2 * 2**20, outputs=[shape],
             operands=[shape, shape]),
        Node(1, "all-reduce.1", NodeKind.COLLECTIVE, "all-reduce", "collective", inputs=[0],
             bytes_read=2 * 2**20, bytes_written=2 * 2**20, outputs=[shape], operands=[shape],
             collective=Collective("all-reduce", 0, 2 * 2**20, 2 * 2**20, "bf16", "sum")),
        Node(2, "add.1", NodeKind.COMPUTE, "add", "elementwise", inputs=[1], flops=2**20,
             bytes_read=4 * 2**20, bytes_written=2 * 2**20, outputs=[shape],
             operands=[shape, shape]),
    ]
    return WorkloadGraph(c, nodes, [comm], [], {"model": "tiny-by-hand"})


GRAPH = tiny_graph().to_json()
SPEC = yaml.safe_load((SPECS / "h100-sxm.yaml").read_text())


def write_graph(d: Path, doc=None, name="g.json") -> Path:
    p = d / name
    p.write_text(json.dumps(GRAPH if doc is None else doc))
    return p


def mutated(path: tuple, value, base=None):
    doc = copy.deepcopy(GRAPH if base is None else base)
    node = doc
    for key in path[:-1]:
        node = node[key]
    if value is _DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return doc


_DELETE = object()


# --- the cases -------------------------------------------------------------------------
def _graph_cases():
    """Graph JSON with one field wrong: `flint estimate` must name it."""
    bad_values = {
        ("nodes", 0, "flops"): ["12", -1, None, [], True, 1e400],
        ("nodes", 0, "kind"): ["bogus", 3],
        ("nodes", 0, "name"): [5, None],
        ("nodes", 1, "inputs"): [[7], [-1], "0", [1], [0.5]],
        ("nodes", 0, "repeat"): [0, 1.5, "2"],
        ("nodes", 0, "id"): [5, "0"],
        ("nodes", 0, "outputs"): ["bf16[2]", [3]],
        ("nodes", 0, "meta"): [[1]],
        ("nodes", 0, "bytes_read"): [-5, "lots"],
        ("nodes", 1, "collective", "communicator"): [5, "0", -1],
        ("nodes", 1, "collective", "bytes_in"): [-1, "1MB"],
        ("nodes", 1, "collective", "window"): [[0], "0-1"],
        ("nodes", 1, "collective"): [3, [1]],
        ("cluster", "devices"): [0, 10**12, "8", 7],
        ("cluster", "mesh"): [[["data", 4]], [["da ta", 8]], "data=8", [["data", 0]]],
        ("cluster", "devices_per_host"): [0, -8],
        ("cluster",): [None],
        ("communicators", 0, "spec"): ["garbage", "{{0,99}}", "{{0,1}", 5],
        ("communicators", 0, "kind"): ["rings"],
        ("communicators", 0, "id"): [3],
        ("format",): ["flint.workloads", None],
        ("version",): [2, "1"],
        ("nodes",): ["all", {}],
        ("loops",): [[{"id": 0}], 3],
    }
    for path, values in bad_values.items():
        for v in values:
            key = ".".join(map(str, path))
            yield (f"graph {key}={v!r:.20}",
                   lambda d, p=path, v=v: write_graph(d, mutated(p, v)),
                   lambda d: ["estimate", str(d / "g.json")])
    extras = {
        "unknown top-level key": lambda: {**GRAPH, "nodez": []},
        "unknown node key": lambda: mutated(("nodes", 0, "flopz"), 1),
        "missing nodes": lambda: mutated(("nodes",), _DELETE),
        "missing node op": lambda: mutated(("nodes", 0, "op"), _DELETE),
        "top-level list": lambda: [GRAPH],
        "loop outside graph": lambda: mutated(("loops",), [
            {"id": 0, "name": "l", "trip_count": 2, "parent": None, "first": 1, "last": 9}]),
    }
    for name, make in extras.items():
        yield (f"graph {name}", lambda d, m=make: write_graph(d, m()),
               lambda d: ["estimate", str(d / "g.json")])
    raw = {
        "empty file": b"", "not JSON": b"{nodes: [", "binary": bytes(range(256)),
        "truncated JSON": json.dumps(GRAPH).encode()[:200],
        "deeply nested": b"[" * 100000 + b"]" * 100000, "NaN flops":
        json.dumps(GRAPH).replace('"flops": 2147483648', '"flops": NaN').encode(),
        "latin-1": "{\"format\": \"caf\xe9\"}".encode("latin-1"),
    }
    for name, data in raw.items():
        yield (f"graph file {name}", lambda d, b=data: (d / "g.json").write_bytes(b),
               lambda d: ["estimate", str(d / "g.json")])
    # the same reader behind every command that takes a graph
    bad = mutated(("nodes", 0, "flops"), "12")
    for cmd in (["export", "{g}", "--out", "{d}/et"], ["export", "{g}", "--format", "json",
                "--out", "{d}/j"], ["replay", "{g}", "--out", "{d}/b.py"],
                ["rescale", "{g}", "-n", "16", "--out", "{d}/r.json"],
                ["anonymize", "{g}", "--out", "{d}/a.json"], ["place", "{g}"],
                ["validate", "{g}", "--trace", "{d}/t.json"]):
        yield (f"bad graph via {cmd[0]} {cmd[-1][-6:]}",
               lambda d, b=bad: (write_graph(d, b), (d / "t.json").write_text("[]")),
               lambda d, c=cmd: [a.format(g=d / "g.json", d=d) for a in c])


def _spec_doc(edit):
    doc = copy.deepcopy(SPEC)
    edit(doc)
    return doc


def _spec_cases():
    def fig(value):
        return {"value": value, "source": "test"}

    edits = {
        "misspelt key": lambda s: s["interconnect"]["scale_out"].update(
            bandwith_per_direction=s["interconnect"]["scale_out"].pop("bandwidth_per_direction")),
        "scalar section": lambda s: s.update(compute=5),
        "list section": lambda s: s.update(memory=[1, 2]),
        "zero bandwidth": lambda s: s["memory"].update(hbm_bandwidth=fig("0 TB/s")),
        "zero peak": lambda s: s["compute"]["peak_flops"].update(bf16=fig("0 TFLOP/s")),
        "fractional devices": lambda s: s["system"].update(devices_per_node=fig("2.5")),
        "zero scale-up": lambda s: s["system"].update(scale_up_domain=fig("0")),
        "no source": lambda s: s["memory"]["hbm_capacity"].pop("source"),
        "empty source": lambda s: s["memory"]["hbm_capacity"].update(source=" "),
        "wrong unit": lambda s: s["memory"].update(hbm_bandwidth=fig("3 GB")),
        "no unit": lambda s: s["memory"].update(hbm_capacity=fig("80")),
        "negative": lambda s: s["memory"].update(l2_cache=fig("-50 MB")),
        "bad dtype": lambda s: s["compute"]["peak_flops"].update(bf17=fig("1 PFLOP/s")),
        "bad kind": lambda s: s.update(kind="fpga"),
        "missing hbm": lambda s: s["memory"].pop("hbm_bandwidth"),
        "no peaks": lambda s: s["compute"].update(peak_flops={}),
        "value not a number": lambda s: s["compute"]["peak_flops"].update(bf16=fig("fast")),
        "figure as list": lambda s: s["memory"].update(hbm_capacity=["80 GB"]),
        "unknown section": lambda s: s.update(cooling={"tdp": "700 W"}),
        "extra figure key": lambda s: s["memory"]["hbm_capacity"].update(sourc="x"),
        "bool figure": lambda s: s["system"].update(leaf_group=True),
        "zero oversubscription": lambda s: s["system"].update(oversubscription=fig("0")),
    }
    for name, edit in edits.items():
        yield (f"spec {name}",
               lambda d, e=edit: (write_graph(d), (d / "s.yaml").write_text(
                   yaml.safe_dump(_spec_doc(e)))),
               lambda d: ["estimate", str(d / "g.json"), "--hardware", str(d / "s.yaml")])
    raw = {"not YAML": "memory: [", "a list": "- 1\n- 2\n", "empty": "",
           "tabs": "name:\t\tx\n  bad", "deep": "[" * 5000 + "]" * 5000}
    for name, text in raw.items():
        yield (f"spec file {name}", lambda d, t=text: (write_graph(d),
                                                        (d / "s.yaml").write_text(t)),
               lambda d: ["estimate", str(d / "g.json"), "--hardware", str(d / "s.yaml")])
    yield ("spec unknown name", write_graph,
           lambda d: ["estimate", str(d / "g.json"), "--hardware", "h900"])


def _set_cases():
    for item in ["hbm_bandwidth=0TB/s", "peak_bf16=0TFLOP/s", "devices_per_node=0",
                 "devices_per_node=2.5", "scale_up_domain=0", "bandwith_per_direction=1GB/s",
                 "hbm_bandwidth=4.8", "hbm_bandwidth=-1TB/s", "peak_fp7=1PFLOP/s",
                 "hbm_bandwidth", "=3TB/s", "nic_bandwidth=fast", "clock=0GHz",
                 "oversubscription=0", "hbm_capacity=80 GB/s", "torus=4x4xq",
                 "nic_bandwidth=1e400Gb/s"]:
        yield (f"--set {item}", write_graph,
               lambda d, i=item: ["estimate", str(d / "g.json"), "--set", i])
    yield ("extract --estimate --set", lambda d: None,
           lambda d: ["extract", "--estimate", "--set", "scale_up_domain=0", "-n", "8"])


def _output_cases():
    """Unusable output paths, each refused before any work."""
    def with_dir(d, *names):
        write_graph(d)
        for n in names:
            (d / n).mkdir()

    def with_file(d, name):
        write_graph(d)
        (d / name).write_text("x")

    g = "{d}/g.json"
    cases = [
        ("estimate --trace dir", ["estimate", g, "--trace", "{d}/o"], "dir"),
        ("estimate --plot dir", ["estimate", g, "--plot", "{d}/o"], "dir"),
        ("estimate --trace missing parent", ["estimate", g, "--trace", "{d}/no/t.json"], None),
        ("replay --out dir", ["replay", g, "--out", "{d}/o"], "dir"),
        ("replay --out missing parent", ["replay", g, "--out", "{d}/no/b.py"], None),
        ("replay --out under a file", ["replay", g, "--out", "{d}/f/b.py"], "file"),
        ("rescale --out dir", ["rescale", g, "-n", "16", "--out", "{d}/o"], "dir"),
        ("anonymize --out dir", ["anonymize", g, "--out", "{d}/o"], "dir"),
        ("anonymize --out itself", ["anonymize", g, "--out", g], None),
        ("place --out dir", ["place", g, "--out", "{d}/o"], "dir"),
        ("import --out dir", ["import", "{d}/missing.et", "--out", "{d}/o"], "dir"),
        ("export json --out existing file", ["export", g, "--format", "json", "--out",
                                             "{d}/f"], "file"),
        ("export chakra --out existing file", ["export", g, "--out", "{d}/f"], "file"),
        ("export --out missing parent", ["export", g, "--out", "{d}/no/et"], None),
        ("extract --out dir", ["extract", "-n", "8", "--out", "{d}/o"], "dir"),
        ("extract --out missing parent", ["extract", "-n", "8", "--out", "{d}/no/g.json"],
         None),
        ("validate --plot dir", ["validate", g, "--trace", "{d}/g.json", "--plot", "{d}/o"],
         "dir"),
        ("calibrate --out not yaml", ["calibrate", "--trace", g, "--out", "{d}/c.txt"], None),
        ("calibrate --out dir", ["calibrate", "--trace", g, "--out", "{d}/o.yaml"], "dir"),
        ("sweep --out existing file", ["sweep", "--out", "{d}/f", "--devices", "8"], "file"),
    ]
    for name, argv, kind in cases:
        setup = ((lambda d: with_dir(d, "o", "o.yaml")) if kind == "dir" else
                 (lambda d: with_file(d, "f")) if kind == "file" else write_graph)
        yield (name, setup, lambda d, a=argv: [x.format(d=d) for x in a])


def _sweep_cases():
    docs = {
        "hardware number": {"hardware": 3}, "model list": {"model": ["a", "b"]},
        "schedule": {"schedule": ["zigzag"]}, "global batch": {"global_batch": 10**30},
        "devices huge": {"devices": [2**40]}, "devices string": {"devices": "8"},
        "remat": {"remat": "bogus"}, "what_if scalar": {"what_if": [3]},
        "misspelt axis": {"microbatchs": [1]}, "fsdp word": {"fsdp": ["yes"]},
        "too many configurations": {"devices": list(range(8, 8008, 8)),
                                    "micro_batch": list(range(1, 200))},
        "empty axis": {"devices": []}, "negative seed": {"seed": -1},
        "framework": {"framework": "torch"}, "pipeline_split": {"pipeline_split": "random"},
        "bad what_if unit": {"what_if": [{"nic_bandwidth": "fast"}]},
        "unknown model": {"model": "gpt-7"}, "unknown hardware": {"hardware": ["h100-sx"]},
        "old axis name": {"virtual": [2]}, "vp zero": {"vp": [0]},
        "budget too big": {"budget": 10**9}, "no devices": {"model": "tiny"},
    }
    for name, doc in docs.items():
        yield (f"sweep {name}", lambda d, x=doc: (d / "s.yaml").write_text(yaml.safe_dump(x)),
               lambda d: ["sweep", str(d / "s.yaml"), "--out", str(d / "out")])
    raw = {"not YAML": "devices: [", "list": "- 1", "scalar": "7"}
    for name, text in raw.items():
        yield (f"sweep file {name}", lambda d, t=text: (d / "s.yaml").write_text(t),
               lambda d: ["sweep", str(d / "s.yaml"), "--out", str(d / "out")])
    for flags in (["--executor", "bogus"], ["--devices", "8,abc"], ["--schedule", "zigzag"],
                  ["--remat", "bogus"], ["--what-if", "nic_bandwidth"], ["--workers", "0"],
                  ["--global-batch", str(10**12)]):
        yield (f"sweep {' '.join(flags)}", lambda d: None,
               lambda d, f=flags: ["sweep", "--out", str(d / "out"), *f])


# --- flags ------------------------------------------------------------------------------
def _flag_cases():
    g = "{d}/g.json"
    argvs = [
        ["extract", "--devices", "1000000000"], ["extract", "--devices", "0"],
        ["extract", "--devices", "-5"], ["extract", "--devices", "abc"],
        ["extract", "--remat", "bogus"], ["extract", "--devices-per-host", "0"],
        ["extract", "--framework", "mxnet"], ["extract", "--hardware", "h900", "-n", "8"],
        ["extract", "--mesh", "data=3", "-n", "8"], ["extract", "--mesh", "data", "-n", "8"],
        ["extract", "--passes", "no-such-pass", "-n", "8"],
        ["extract", "missing.py:step", "-n", "8"], ["extract", "{d}/g.json", "-n", "8"],
        ["extract", "--model", "gpt-7", "-n", "8"],
        ["export", g, "--format", "xml", "--out", "{d}/o"],
        ["export", g, "--prefix", "../x", "--out", "{d}/o"],
        ["export", g, "--prefix", "", "--out", "{d}/o"],
        ["export", g, "--annotate", "some", "--out", "{d}/o"],
        ["export", g, "--ranks", "5-2", "--out", "{d}/o"],
        ["export", g, "--ranks", "0-99", "--out", "{d}/o"],
        ["export", g, "--workers", "0", "--out", "{d}/o"],
        ["export", g, "--set", "hbm_bandwidth=0TB/s", "--out", "{d}/o"],
        ["rescale", g, "--devices", str(10**12), "--out", "{d}/r.json"],
        ["rescale", g, "--devices", "0", "--out", "{d}/r.json"],
        ["rescale", g, "--devices", "12", "--mesh", "data=5", "--out", "{d}/r.json"],
        ["place", g, "--algorithm", "random"], ["place", g, "--memory-limit", "0GB"],
        ["place", g, "--devices", str(10**9)], ["place", g, "--memory-limit", "lots"],
        ["estimate", g, "--algorithm", "telepathy"], ["estimate", g, "--bogus"],
        ["estimate"], ["anonymize", g, "--perturb", "abc", "--out", "{d}/a.json"],
        ["validate", g, "--trace", g, "--steps", "x-y"], ["nosuchcommand"],
        ["validate", "--model", "tiny", "--devices", str(10**10), "--trace", g],
        ["import", "{d}/nothing"],
    ]
    for argv in argvs:
        yield (" ".join(argv).replace("{d}/", "")[:60], write_graph,
               lambda d, a=argv: [x.format(d=d) for x in a])
    # a path with braces is a file, not module text
    yield ("extract a{b}.mlir (a file with braces)",
           lambda d: (d / "a{b}.mlir").write_text("garbage"),
           lambda d: ["extract", str(d / "a{b}.mlir"), "-n", "8"])


def _injection_cases():
    yield ("injection: export --prefix shell command", write_graph,
           lambda d: ["export", str(d / "g.json"), "--prefix", "x$(touch pwned)",
                      "--out", str(d / "et")])
    name = "g\nimport os; os.system('touch pwned')\n.json"
    yield ("injection: replay graph name with a newline",
           lambda d: write_graph(d, name=name),
           lambda d: ["replay", str(d / name), "--out", str(d / "bench.py")])


def all_cases() -> list:
    from hostile_file_cases import _chakra_cases, _trace_cases

    out = []
    for family in (_graph_cases, _spec_cases, _set_cases, _output_cases, _sweep_cases,
                   _chakra_cases, _trace_cases, _flag_cases, _injection_cases):
        out.extend(family())
    return out
