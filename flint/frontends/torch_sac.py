"""Selective activation checkpointing in a traced step: the recompute that SAC policies ask for.

`torch.utils.checkpoint` with a `context_fn` from `create_selective_checkpoint_contexts`
(torchtitan's "selective op" activation checkpointing, any user's policy) decides per op
whether its output is saved for the backward or recomputed. Eagerly, the recompute runs
when the backward unpacks the region's saved tensors. Under a proxy mode (make_fx, which
Flint's capture uses, and AOTAutograd) torch does not recompute: it saves every output
and tags each op's graph node with its policy (`node.meta["recompute"]`), leaving the
recompute to the partitioner that follows (AOTAutograd's min-cut partitioner re-runs the
nodes tagged PREFER_RECOMPUTE / MUST_RECOMPUTE in the backward graph). Flint's capture has
no partitioner, so this pass does its part: every forward value a backward op reads that
comes from a recompute-tagged op (through the detach and view nodes autograd puts between)
is computed again just before its first backward reader, and that reader reads the copy.
The forward value then dies in the forward, as under SAC, and the copies cost their time
in the backward. Ops that write their inputs are never copied (their outputs stay saved).
"""
from __future__ import annotations

import torch

from flint.frontends.torch_regions import REGION
from flint.passes.aten_cost import op_name

BACKWARD_REGION = REGION + "backward"
# single-input nodes that only re-describe a value (autograd's detach of a saved tensor,
# views): transparent between a recompute-tagged op and its backward reader
_TRANSPARENT = frozenset({
    "detach", "alias", "view", "_unsafe_view", "reshape", "t", "transpose", "permute",
    "expand", "slice", "select", "squeeze", "unsqueeze", "as_strided"})


def _policy_recomputes(node) -> bool:
    policy = node.meta.get("recompute")
    return policy is not None and getattr(policy, "name", "") in (
        "PREFER_RECOMPUTE", "MUST_RECOMPUTE")


def _writes_inputs(node) -> bool:
    schema = getattr(node.target, "_schema", None)
    return bool(schema) and any(a.alias_info is not None and a.alias_info.is_write
                                for a in schema.arguments)


def _phases(graph: torch.fx.Graph) -> dict:
    """node -> True inside the backward range (`flint::backward` record_function)."""
    regions, stack, inside = {}, [], {}
    for n in graph.nodes:
        name = op_name(n.target) if n.op == "call_function" else ""
        if name.startswith("_record_function_enter"):
            regions[n] = str(n.args[0])
            stack.append(regions[n])
        elif name.startswith("_record_function_exit") and n.args:
            label = regions.get(n.args[0])
            if label in stack:
                del stack[len(stack) - 1 - stack[::-1].index(label)]
        inside[n] = BACKWARD_REGION in stack
    return inside


def _regions(graph: torch.fx.Graph, backward: dict) -> dict:
    """node -> its checkpointed region (an int) for the forward nodes a SAC policy tagged,
    and for the detach / view nodes over them. A region is a run of consecutive tagged
    nodes: the ops of one checkpoint call dispatch one after the other, and the module
    ranges Flint opens around every module call (and FSDP's hooks) put untagged nodes
    between the calls of successive blocks. (SAC's own detaches of the values it keeps are
    untagged and do not end a run.) Two checkpoint calls back to back in one module's
    forward, with no op between them, read as one region."""
    region, current, open_run = {}, 0, False
    for n in graph.nodes:
        if n.op != "call_function" or backward.get(n, False):
            continue
        if n.meta.get("recompute") is not None:
            if not open_run:
                current += 1
                open_run = True
            region[n] = current
        elif op_name(n.target) in _TRANSPARENT and n.args and n.args[0] in region:
            region[n] = region[n.args[0]]
        else:
            open_run = False
    return region


def rematerialize_selective(gm: torch.fx.GraphModule) -> int:
    """Apply the SAC policies' recompute to `gm` in place (see the module docstring);
    returns how many nodes were recomputed (0 when the step uses no SAC policy)."""
    graph = gm.graph
    if not any(_policy_recomputes(n) for n in graph.nodes):
        return 0
    backward = _phases(graph)
    region = _regions(graph, backward)

    def needs(node, within=None) -> bool:
        """Whether `node` is recomputed for a reader in region `within` (None: a backward
        op): a value of another region is that region's output, saved as this one's input."""
        if not isinstance(node, torch.fx.Node) or node not in region or _writes_inputs(node):
            return False
        if within is not None and region[node] != within:
            return False
        if _policy_recomputes(node):
            return True
        return op_name(node.target) in _TRANSPARENT and needs(node.args[0], region[node])

    copies: dict = {}

    def copy_of(node, before):
        if node in copies:
            return copies[node]
        r = region[node]
        with graph.inserting_before(before):
            new = graph.node_copy(node, lambda a: copy_of(a, before) if needs(a, r) else a)
        new.meta = dict(node.meta)
        new.meta.pop("recompute", None)
        copies[node] = new
        return new

    for n in list(graph.nodes):
        if not backward.get(n, False) or n.op != "call_function":
            continue
        if any(needs(a) for a in n.all_input_nodes):
            n.args = torch.fx.node.map_arg(n.args, lambda a: copy_of(a, n) if needs(a) else a)
            n.kwargs = torch.fx.node.map_arg(n.kwargs,
                                             lambda a: copy_of(a, n) if needs(a) else a)
    graph.lint()
    gm.recompile()
    return sum(1 for c in copies if _policy_recomputes(c))
