"""A device's collectives share its links one at a time, whichever stream issues
them (hardware_models/schedule.py): each takes the earliest free interval of the device's
network from when it could start."""
from flint.cluster import Cluster
from flint.graph import Collective, Communicator, Node, NodeKind, WorkloadGraph
from flint.hardware_models.schedule import simulate


def _graph(specs) -> WorkloadGraph:
    """specs: (kind, stream or None, inputs, control); collectives are 1 MiB all-gathers."""
    cluster = Cluster(2, (("fsdp", 2),), "h100-sxm")
    comms = [Communicator(0, "groups", "{{0,1}}", 2, 2, 1, ("fsdp",))]
    nodes = []
    for i, (kind, stream, inputs, control) in enumerate(specs):
        meta = {"stream": stream} if stream else {}
        if kind == "compute":
            nodes.append(Node(i, f"dot.{i}", NodeKind.COMPUTE, "dot", "gemm", inputs=inputs,
                              control=control, flops=1e12, meta=meta))
        else:
            nodes.append(Node(i, f"all-gather.{i}", NodeKind.COLLECTIVE, "all-gather",
                              "collective", inputs=inputs, control=control, meta=meta,
                              collective=Collective("all-gather", 0, 1 << 20, 2 << 20, "bf16",
                                                    None, True)))
    return WorkloadGraph(cluster, nodes, comms, [], {})


def test_collectives_of_two_streams_take_turns_on_the_network():
    g = _graph([("compute", None, [], []),                    # 0: 1.0 s
                ("coll", None, [0], []),                       # 1: collectives stream
                ("coll", "fsdp-all-gather", [], []),           # 2: own stream, at once
                ("coll", "fsdp-all-gather", [], [2]),          # 3: after 2
                ("coll", "fsdp-all-gather", [], [3])])         # 4: after 3
    tl = simulate(g, [1.0, 0.5, 0.4, 0.4, 0.5])
    assert tl.start[1] == 1.0                  # issued when the compute stream reaches it
    assert (tl.start[2], tl.start[3]) == (0.0, 0.4)   # earlier gaps of the network
    # 4 could start at 0.8 on its own stream, but [0.8, 1.3) overlaps collective 1
    assert tl.start[4] == 1.5 and tl.finish[4] == 2.0
    assert tl.critical_path[-2:] == [1, 4]     # it waited for collective 1


def test_one_stream_keeps_its_order_and_zero_time_takes_no_turn():
    g = _graph([("coll", None, [], []), ("coll", None, [], []),
                ("coll", "fsdp-all-gather", [], []), ("compute", None, [], [])])
    tl = simulate(g, [0.3, 0.2, 0.0, 0.1])
    assert (tl.start[0], tl.start[1]) == (0.0, 0.3)
    assert tl.start[2] == 0.0                  # no time on the network: never waits
