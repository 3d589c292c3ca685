"""Lower a traced aten graph (torch.fx, from make_fx) into the WorkloadGraph.

One Flint node per aten op that does work. Views, `getitem`, allocations and profiler
markers are folded away: whoever uses them depends on what they depended on. Data
dependencies are the op's tensor arguments plus, for every argument, the last op that
wrote its storage in place (optimizer updates, FSDP2's copy-outs, `out=` arguments, as the
op schemas' alias annotations say).

Collectives: DTensor's functional collectives (`_c10d_functional.*`, completed by
`wait_tensor`) and FSDP2's in-place c10d calls (`c10d._allgather_base_`, ...; complete when
their output is first read). Both are asynchronous with an overlap window up to that point.
FSDP2's parameter all-gathers and their copy-ins run on FSDP2's own streams, issued by the
host ahead of the compute stream (meta `stream`), one all-gather ahead: each copy-in waits
for the previous all-gather's copy-out (FSDP2's rate limit), so layer i+1's all-gather
overlaps layer i's compute in the forward and the backward alike.
The group a collective names is expanded to every rank's group by the mesh dimensions
rank 0's group spans, and written in XLA's iota syntax so it costs nothing per rank.

Meta per node: `phase` (forward / backward / optimizer), `scope` (module path of the
forward op), `layer` (e.g. layers.3), `aten` (the op, for joining profiler traces).
"""
from __future__ import annotations

import math
import re

import numpy as np
import torch

from flint.cluster import Cluster
from flint.graph import Collective, Node, NodeKind, WorkloadGraph
from flint.passes import aten_cost as ac
from flint.passes.lower_collectives import CommunicatorTable

FUNCTIONAL = {"all_reduce": "all-reduce", "all_reduce_coalesced": "all-reduce",
              "all_gather_into_tensor": "all-gather",
              "all_gather_into_tensor_coalesced": "all-gather",
              "reduce_scatter_tensor": "reduce-scatter",
              "reduce_scatter_tensor_coalesced": "reduce-scatter",
              "all_to_all_single": "all-to-all", "broadcast": "collective-broadcast"}
IN_PLACE = {"_allgather_base_": "all-gather", "allgather_": "all-gather",
            "allgather_into_tensor_coalesced_": "all-gather",
            "_reduce_scatter_base_": "reduce-scatter", "reduce_scatter_": "reduce-scatter",
            "reduce_scatter_tensor_coalesced_": "reduce-scatter",
            "allreduce_": "all-reduce", "allreduce_coalesced_": "all-reduce",
            "alltoall_base_": "all-to-all", "alltoall_": "all-to-all",
            "broadcast_": "collective-broadcast"}
FSDP_STREAM = "fsdp-all-gather"
# torch dtype -> HLO primitive type name (flint.hlo.shapes.DTYPE_BITS sizes them). Complex
# (rotary embeddings as torchtitan and Meta's Llama write them) and FP8 travel end to end;
# a packed FP4 pair is one byte, as its storage is.
DTYPES = {torch.bfloat16: "bf16", torch.float32: "f32", torch.float16: "f16",
          torch.float64: "f64", torch.int64: "s64", torch.int32: "s32", torch.int16: "s16",
          torch.int8: "s8", torch.uint8: "u8", torch.bool: "pred",
          torch.complex64: "c64", torch.complex128: "c128", torch.uint16: "u16",
          torch.uint32: "u32", torch.uint64: "u64",
          **{getattr(torch, name): hlo for name, hlo in (
              ("float8_e4m3fn", "f8e4m3fn"), ("float8_e5m2", "f8e5m2"),
              ("float8_e4m3fnuz", "f8e4m3fnuz"), ("float8_e5m2fnuz", "f8e5m2fnuz"),
              ("float8_e8m0fnu", "f8e8m0fnu"), ("float4_e2m1fn_x2", "u8"))
             if hasattr(torch, name)}}
_LAYER = re.compile(r"^(.*?\b(?:layers|blocks|h|layer)\.\d+)")


def lower_fx(gm: torch.fx.GraphModule, cluster: Cluster, groups: dict,
             fuse: bool = True) -> WorkloadGraph:
    """Contract: nodes in program order with dense ids and backward-pointing deps; every
    collective's communicator covers all ranks; unknown aten ops are costed conservatively
    and counted in meta["unknown_ops"]. With `fuse`, passes.fuse.FusePointwise runs after."""
    graph = _Lowerer(gm, cluster, groups).run()
    if fuse:
        from flint.passes.fuse import FusePointwise

        graph = FusePointwise().run(graph)
    return graph


def shape_str(t: torch.Tensor) -> str:
    return f"{hlo_dtype(t.dtype)}[{','.join(map(str, t.shape))}]"


def hlo_dtype(dtype: torch.dtype) -> str:
    """The HLO name of a torch dtype; one with no HLO twin (complex32) is sized as the
    unsigned integer of its width, so bytes stay right and nothing downstream fails."""
    name = DTYPES.get(dtype)
    if name is None:
        bits = dtype.itemsize * 8
        name = {8: "u8", 16: "u16", 32: "u32", 64: "u64"}.get(bits, "u8")
    return name


def _storage(t: torch.Tensor):
    """The storage a tensor views, or None for one without storage (no aliasing to track)."""
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):
        return None


class _Lowerer:
    def __init__(self, gm, cluster: Cluster, groups: dict):
        self.gm, self.cluster, self.groups = gm, cluster, groups
        self.nodes: list[Node] = []
        self.stands_for: dict = {}        # fx node -> Flint ids it stands for
        self.writer: dict = {}            # storage -> Flint id of its last in-place writer
        self.pending: dict = {}           # storage -> async collective id awaiting a reader
        self.closed: list[int] = []       # collectives the op being lowered reads first
        self.copy_out: dict = {}          # FSDP2 all-gather id -> its first reader
        self.last_gather: int | None = None   # the latest FSDP2 all-gather
        self.waiting: dict = {}           # fx node of a functional collective -> Flint id
        self.comms = CommunicatorTable(cluster)
        self.regions: dict = {}           # enter-node -> region name
        self.stack: list[str] = []
        self.unknown: dict[str, int] = {}

    def run(self) -> WorkloadGraph:
        for n in self.gm.graph.nodes:
            if n.op == "call_function":
                self._call(n)
            elif n.op in ("placeholder", "get_attr"):
                self.stands_for[n] = []
        _inherit_layers(self.nodes)
        meta = {"unknown_ops": dict(sorted(self.unknown.items())), "module": "train_step",
                "compiler_notes": []}
        g = WorkloadGraph(self.cluster, self.nodes, self.comms.all(), [], meta)
        g.check()
        return g

    # --- walking ------------------------------------------------------------------
    def _call(self, n) -> None:
        name = ac.op_name(n.target)
        if name in ac.HOST:
            self._region(n, name)
            self.stands_for[n] = []
            return
        if name == "getitem":
            # an element of an op's tuple result reads nothing: it stands for the op (and
            # must not close an in-place collective's window on the collective's own output)
            self.stands_for[n] = list(self.stands_for.get(n.args[0], []))
            return
        deps = self._deps(n)
        if "_c10d_functional" in str(n.target) and name == "wait_tensor":
            self.stands_for[n] = self.waiting.pop(n.args[0], deps)
            return
        cls = ac.op_class(name)
        if name == "_to_copy" and _to_float8(n):
            # a saturating cast to FP8 is arithmetic on each element, which Inductor
            # fuses with the scaling before it (torchao's Float8 casts), not a copy
            cls = "elementwise"
        if cls == "elementwise" and _scalar_only(n):
            cls = "view"     # 0-d bookkeeping (optimizer step counters): host arithmetic
        if cls == "view" or name == "getitem":
            self.stands_for[n] = deps
            return
        if "_c10d_functional" in str(n.target) and name in FUNCTIONAL:
            ins, outs = self._io(n)
            nid = self._collective(n, FUNCTIONAL[name], deps, ins, outs)
            self.waiting[n] = [nid]
        elif str(n.target).startswith("c10d.") and name in IN_PLACE:
            # c10d's in-place signatures: (output(s), input(s), group, ...), except
            # allreduce_/broadcast_ which reduce their one tensor list in place.
            outs = ac.tensors(n.args[0].meta.get("val") if isinstance(n.args[0], torch.fx.Node)
                              else [a.meta.get("val") for a in _flat(n.args[0])
                                    if isinstance(a, torch.fx.Node)])
            ins = outs
            if IN_PLACE[name] not in ("all-reduce", "collective-broadcast"):
                ins = ac.tensors([a.meta.get("val") for a in _flat(n.args[1])
                                  if isinstance(a, torch.fx.Node)])
            nid = self._collective(n, IN_PLACE[name], deps, ins, outs)
            if IN_PLACE[name] == "all-gather":
                self._prefetch(nid)
            for key in filter(None, map(_storage, outs)):
                self.pending[key] = nid
                self.writer[key] = nid
        else:
            nid = self._compute(n, name, cls, deps)
        for coll in self.closed:
            self.copy_out[coll] = nid
        self.closed = []
        self.stands_for[n] = [nid]
        for key in filter(None, map(_storage, self._written(n))):
            self.writer[key] = nid

    def _deps(self, n) -> list[int]:
        out: set[int] = set()
        for a in _read_args(n):
            out.update(self.stands_for.get(a, []))
            for t in ac.tensors(a.meta.get("val")):
                key = _storage(t)
                if key is None:
                    continue
                if key in self.writer:
                    out.add(self.writer[key])
                if key in self.pending:        # first reader of an in-place collective
                    coll = self.pending.pop(key)
                    self._close_window(coll)
                    self.closed.append(coll)
        return sorted(out)

    def _written(self, n) -> list[torch.Tensor]:
        schema = getattr(n.target, "_schema", None)
        if schema is None:
            return []
        out = []
        for i, arg in enumerate(schema.arguments):
            if arg.alias_info is not None and arg.alias_info.is_write:
                value = n.kwargs.get(arg.name, n.args[i] if i < len(n.args) else None)
                for v in _flat(value):
                    if isinstance(v, torch.fx.Node):
                        out.extend(ac.tensors(v.meta.get("val")))
        return out

    def _region(self, n, name: str) -> None:
        if name.startswith("_record_function_enter"):
            label = str(n.args[0])
            self.regions[n] = label
            self.stack.append(label)
        else:
            label = self.regions.get(n.args[0])
            if label in self.stack:
                del self.stack[len(self.stack) - 1 - self.stack[::-1].index(label)]

    def _tags(self) -> dict:
        phase = ("optimizer" if "flint::optimizer" in self.stack else
                 "backward" if "flint::backward" in self.stack else "forward")
        scope = next((s[len("flint::module::"):] for s in reversed(self.stack)
                      if s.startswith("flint::module::")), "")
        m = _LAYER.match(scope)
        return {"phase": phase, "scope": scope, "layer": m.group(1) if m else scope.split(".")[0]}

    # --- nodes --------------------------------------------------------------------
    def _io(self, n):
        ins, seen = [], set()
        for a in _fx_args(n):
            for t in ac.tensors(a.meta.get("val")):
                if id(t) not in seen:
                    seen.add(id(t))
                    ins.append(t)
        outs = ac.tensors(n.meta.get("val"))
        if not outs:
            outs = self._written(n)
        return ins, outs

    def _compute(self, n, name: str, cls: str, deps: list[int]) -> int:
        ins, outs = self._io(n)
        args = [a.meta.get("val") if isinstance(a, torch.fx.Node) else a for a in n.args]
        named = _named(n, args)
        if cls == "unknown":
            self.unknown[name] = self.unknown.get(name, 0) + 1
        flops, trans = ac.cost(name, args, named, n.meta.get("val"))
        kind = NodeKind.MEMORY if cls == "data_movement" else NodeKind.COMPUTE
        meta = {**self._tags(), "aten": f"aten::{name}"}
        if cls == "unknown":
            meta["unknown_op"] = True
        if cls == "attention" and name != "scaled_dot_product_attention":
            meta["attention"] = ac.attention_meta(name, args, named)
        return self._add(Node(len(self.nodes), n.name, kind, name, cls, inputs=deps,
                              flops=flops, transcendentals=trans,
                              bytes_read=float(sum(ac.nbytes(t) for t in ins)),
                              bytes_written=float(sum(ac.nbytes(t) for t in outs)),
                              outputs=[shape_str(t) for t in outs],
                              operands=[shape_str(t) for t in ins], meta=meta))

    def _collective(self, n, kind: str, deps: list[int], sources, outs) -> int:
        comm = self.comms.get("groups", iota_groups(self._group(n.args), self.cluster))
        dtype = hlo_dtype(sources[0].dtype) if sources else "f32"
        coll = Collective(kind, comm.id, sum(ac.nbytes(t) for t in sources),
                          sum(ac.nbytes(t) for t in (outs or sources)), dtype,
                          "add" if kind in ("all-reduce", "reduce-scatter") else None,
                          is_async=True)
        meta = {**self._tags(), "aten": str(n.target), "async": True}
        return self._add(Node(len(self.nodes), n.name, NodeKind.COLLECTIVE, kind, "collective",
                              inputs=deps, bytes_read=float(coll.bytes_in),
                              bytes_written=float(coll.bytes_out),
                              outputs=[shape_str(t) for t in outs],
                              operands=[shape_str(t) for t in sources], collective=coll,
                              meta=meta))

    def _add(self, node: Node) -> int:
        self.nodes.append(node)
        return node.id

    def _prefetch(self, gather: int) -> None:
        """An FSDP2 parameter all-gather (its input made by FSDP2's `all_gather_copy_in`)
        and its copy-in go on FSDP2's all-gather stream; the copy-in waits for the previous
        all-gather's copy-out (one all-gather in flight ahead of the compute)."""
        node = self.nodes[gather]
        copy_ins = [i for i in node.inputs if self.nodes[i].op == "all_gather_copy_in"]
        if not copy_ins:
            return
        # and the copies of the sharded parameters into its input buffer
        copy_ins += [d for i in copy_ins for d in self.nodes[i].inputs
                     if self.nodes[d].op in ("_foreach_copy_", "copy_")]
        for i in (gather, *copy_ins):
            self.nodes[i].meta["stream"] = FSDP_STREAM
        previous = self.copy_out.get(self.last_gather)
        if previous is not None:
            for i in copy_ins:
                self.nodes[i].control = sorted(set(self.nodes[i].control) | {previous})
        self.last_gather = gather

    def _close_window(self, coll_id: int) -> None:
        last = len(self.nodes) - 1
        c = self.nodes[coll_id].collective
        if c.window is None and last > coll_id:
            c.window = (coll_id + 1, last)

    def _group(self, args) -> list[int]:
        for a in args:
            key = a.target if isinstance(a, torch.fx.Node) and a.op == "get_attr" else a
            if isinstance(key, str) and key in self.groups:
                return list(self.groups[key])
        return list(range(self.cluster.devices))


def _inherit_layers(nodes: list[Node]) -> None:
    """Backward and optimizer ops run outside module calls; give each the layer of the
    first of its inputs that has one (a backward op reads its forward op's saved tensors,
    or the gradient flowing from the op before it in the same layer)."""
    for node in nodes:
        if node.meta.get("layer") or node.meta.get("phase") == "forward":
            continue
        for d in node.inputs:
            layer = nodes[d].meta.get("layer")
            if layer:
                node.meta["layer"] = layer
                break


def iota_groups(ranks: list[int], cluster: Cluster) -> str:
    """XLA iota replica groups for the mesh dimensions rank 0's group spans (every rank's
    group along those dimensions); explicit groups if the group is not such a slice."""
    sizes = [s for _, s in cluster.mesh]
    coords = np.array(np.unravel_index(np.asarray(sorted(ranks)), sizes))
    dims = [d for d in range(len(sizes)) if len(set(coords[d])) > 1]
    size = math.prod(sizes[d] for d in dims)
    if size == len(ranks) and len(set(ranks)) == len(ranks):
        keep = [d for d in range(len(sizes)) if d not in dims]
        perm = keep + dims
        n = cluster.devices
        spec = f"[{n // size},{size}]<=[{','.join(map(str, sizes))}]"
        if perm != list(range(len(sizes))):
            spec += f"T({','.join(map(str, perm))})"
        from flint.hlo.replica_groups import parse_replica_groups

        if sorted(parse_replica_groups(spec, n)[0].tolist()) == sorted(ranks):
            return spec
    return "{{" + ",".join(map(str, ranks)) + "}}"


def _to_float8(n) -> bool:
    out = n.meta.get("val")
    return isinstance(out, torch.Tensor) and out.dtype.itemsize == 1 and \
        out.dtype.is_floating_point


def _scalar_only(n) -> bool:
    values = [a.meta.get("val") for a in _fx_args(n)] + [n.meta.get("val")]
    ts = [t for v in values for t in ac.tensors(v)]
    return bool(ts) and all(t.dim() == 0 for t in ts)


def _read_args(n) -> list:
    """The fx nodes `n` reads: its arguments less the buffers an out= variant only writes
    (`out=`: FSDP2's split_with_sizes_copy refilling the unsharded parameters). What was
    in those buffers before is overwritten, not read, so the node that wrote it last is
    neither waited for nor kept alive by the write (FSDP2 frees the parameters after the
    forward and gathers them again for the backward)."""
    written = n.kwargs.get("out")
    if written is None or not getattr(n.target, "_schema", None):
        return _fx_args(n)
    skip = {id(a) for a in _flat(written) if isinstance(a, torch.fx.Node)}
    return [a for a in _fx_args(n) if id(a) not in skip]


def _fx_args(n) -> list:
    return [a for a in _flat(list(n.args) + list(n.kwargs.values()))
            if isinstance(a, torch.fx.Node)]


def _flat(x) -> list:
    if isinstance(x, (list, tuple)):
        return [y for v in x for y in _flat(v)]
    return [x]


def _named(n, args) -> dict:
    schema = getattr(n.target, "_schema", None)
    out = dict(n.kwargs)
    if schema is not None:
        for i, arg in enumerate(schema.arguments[:len(args)]):
            out.setdefault(arg.name, args[i])
    return out
