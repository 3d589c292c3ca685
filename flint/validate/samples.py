"""Measured points for calibration: one per joined op (per execution), from a trace with
its graph, or from NCCL kernels of a PyTorch trace (sizes and group from their metadata)."""
from __future__ import annotations

import statistics
from collections import defaultdict

from flint.cluster import Cluster
from flint.graph import Collective, Communicator, Node, NodeKind, WorkloadGraph
from flint.hardware_models.network import NetworkModel
from flint.hardware_models.spec import HardwareSpec
from flint.validate.calibrate import CollectiveSample, ComputeSample
from flint.validate.measured import MeasuredTrace


def samples_from_graph(graph: WorkloadGraph, trace: MeasuredTrace,
                       exclude=()) -> tuple[list[ComputeSample], list[CollectiveSample]]:
    median = trace.op_times()
    # A collective's kernel time includes waiting for peers: on accelerators that is skew,
    # and the fastest instance is the transfer. Host CPU "devices" are threads sharing the
    # cores: there the wait is the cost of sharing and part of every step, so the typical
    # (median) instance is what the step pays.
    fastest = median if graph.cluster.platform == "cpu" else trace.op_times(min)
    compute, colls, seen = [], [], set()
    for n in graph.nodes:
        key = n.meta.get("wrapped_name", n.name)
        name = key if key in median else n.name
        if name not in median or n.id in seen or any(p and p in name for p in exclude):
            continue
        seen.add(n.id)
        if n.collective is not None:
            if n.kind == NodeKind.COLLECTIVE:
                colls.append(CollectiveSample(n, graph.communicator(n), graph.cluster,
                                              fastest[name] / n.repeat))
        else:
            compute.append(ComputeSample(n, median[name] / n.repeat))
    return compute, colls


_NCCL_TYPES = {"allreduce": "all-reduce", "allgather": "all-gather",
               "reduce_scatter": "reduce-scatter", "reducescatter": "reduce-scatter",
               "all_to_all": "all-to-all", "alltoall": "all-to-all"}


def samples_from_nccl(path) -> list[CollectiveSample]:
    """The fastest kernel per (collective, size, group) of a Kineto trace's NCCL kernels."""
    from flint.validate.kineto import nccl_kernels, read_kineto

    groups: dict[tuple, list] = defaultdict(list)
    for k in nccl_kernels(read_kineto(path), str(path)):
        kind = _NCCL_TYPES.get(k.collective.lower())
        if kind and k.group_size > 1:
            groups[(kind, k.in_bytes, k.out_bytes, k.group_size)].append(k.duration_s)
    out = []
    for (kind, b_in, b_out, size), times in sorted(groups.items()):
        cluster = Cluster(size, (("data", size),))
        comm = Communicator(0, "groups", "{{" + ",".join(map(str, range(size))) + "}}",
                            size, size, 1, ("data",))
        node = Node(0, kind, NodeKind.COLLECTIVE, kind, "collective",
                    collective=Collective(kind, 0, b_in, b_out, "f32"))
        out.append(CollectiveSample(node, comm, cluster, min(times)))
    return out


def collective_error(samples: list[CollectiveSample], spec: HardwareSpec) -> float:
    """Median |predicted / measured - 1| of collective samples under `spec`."""
    errs = []
    for s in samples:
        errs.append(abs(NetworkModel(spec, s.cluster).time(s.node, s.comm) / s.seconds - 1))
    return statistics.median(errs) if errs else 0.0
