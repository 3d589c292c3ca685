"""Property tests: fuzzed graph JSON, spec YAML, --set items, Chakra ETs and trace events.
The only outcomes allowed are a result or a FlintError (never another exception)."""
import copy
import json
import tempfile
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

from hostile_cases import GRAPH, SPEC
from hostile_file_cases import _comm_node, _comp_node, _et_bytes, _jax_event, _kernel

from flint.errors import FlintError

FUZZ = settings(max_examples=60, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) |
    st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12)


def leaf_paths(doc, prefix=()):
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield prefix + (k,)
            yield from leaf_paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield prefix + (i,)
            yield from leaf_paths(v, prefix + (i,))


GRAPH_PATHS = list(leaf_paths(GRAPH))
SPEC_PATHS = list(leaf_paths(SPEC))


def replaced(doc, path, value):
    doc = copy.deepcopy(doc)
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return doc


def only_result_or_flint_error(fn, *args):
    try:
        return fn(*args)
    except FlintError as e:
        assert str(e) and "\n" not in str(e).strip()
        return None


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(GRAPH_PATHS), json_values), min_size=1, max_size=3))
def test_fuzzed_graph_json_reads_and_estimates_or_is_refused(edits):
    from flint.graph import WorkloadGraph
    from flint.hardware_models.estimate import estimate

    doc = GRAPH
    for path, value in edits:
        try:
            doc = replaced(doc, path, value)
        except (KeyError, IndexError, TypeError):
            pass               # an earlier edit removed the path
    graph = only_result_or_flint_error(WorkloadGraph.from_json, json.loads(json.dumps(doc)))
    if graph is not None:
        only_result_or_flint_error(estimate, graph, "h100-sxm")


@FUZZ
@given(st.sampled_from(SPEC_PATHS), json_values)
def test_fuzzed_spec_yaml_loads_or_is_refused(path, value):
    from flint.hardware_models.estimate import estimate
    from flint.hardware_models.spec import load_spec
    from flint.graph import WorkloadGraph

    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "s.yaml"
        p.write_text(yaml.safe_dump(replaced(SPEC, path, value)))
        spec = only_result_or_flint_error(load_spec, str(p))
        if spec is not None:
            only_result_or_flint_error(estimate, WorkloadGraph.from_json(GRAPH), str(p))


@FUZZ
@given(st.sampled_from(["hbm_bandwidth", "peak_bf16", "devices_per_node", "scale_up_domain",
                        "nic_latency", "oversubscription", "torus", "fabric", "leaf_group",
                        "nccl_protocol", "switch_reduction",
                        "bandwith", ""]),
       st.text(max_size=16))
def test_fuzzed_what_if_applies_or_is_refused(key, value):
    from flint.hardware_models.spec import load_spec

    only_result_or_flint_error(load_spec, "h100-sxm", [f"{key}={value}"])


VALID_ET = _et_bytes(nodes=[_comp_node(num_ops={"int64_val": 10}), _comm_node(pg=None)])


@FUZZ
@given(st.one_of(
    st.binary(max_size=300),
    st.lists(st.tuples(st.integers(0, len(VALID_ET) - 1), st.integers(0, 255)), min_size=1,
             max_size=4).map(lambda flips: _flipped(VALID_ET, flips)),
    st.integers(0, len(VALID_ET)).map(lambda n: VALID_ET[:n])))
def test_fuzzed_chakra_et_imports_or_is_refused(data):
    from flint.frontends.chakra import import_chakra

    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "w.0.et"
        p.write_bytes(data)
        only_result_or_flint_error(import_chakra, p)


def _flipped(data: bytes, flips) -> bytes:
    out = bytearray(data)
    for at, value in flips:
        out[at] = value
    return bytes(out)


event_fields = st.fixed_dictionaries({}, optional={
    "ph": st.sampled_from(["X", "M", "i", 3]), "ts": json_values, "dur": json_values,
    "cat": st.sampled_from(["kernel", "cuda_runtime", "gpu_memcpy", None]),
    "name": json_values, "pid": json_values,
    "args": st.one_of(json_values, st.fixed_dictionaries({}, optional={
        "hlo_op": json_values, "hlo_module": json_values, "run_id": json_values,
        "correlation": json_values, "Collective name": json_values,
        "In msg nelems": json_values, "Out msg nelems": json_values})),
})


@FUZZ
@given(st.lists(st.one_of(event_fields, json_values,
                          st.just(_jax_event()), st.just(_kernel())), max_size=6))
def test_fuzzed_trace_events_read_or_are_refused(events):
    from flint.validate.kineto import nccl_kernels
    from flint.validate.load import read_trace

    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "t.json"
        p.write_text(json.dumps({"traceEvents": events}))
        only_result_or_flint_error(read_trace, p)
        only_result_or_flint_error(
            lambda: nccl_kernels({"traceEvents": __import__(
                "flint.validate.trace_events", fromlist=["x"]).read_trace_events(p)}))
