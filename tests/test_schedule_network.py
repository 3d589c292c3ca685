"""A device's collectives share its links one at a time, whichever stream issues
them (hardware_models/schedule.py): each takes the earliest free interval of the device's
network from when it could start."""
import pytest

from flint.cluster import Cluster
from flint.errors import FlintError
from flint.graph import Collective, Communicator, Node, NodeKind, WorkloadGraph
from flint.hardware_models.network import NetworkModel
from flint.hardware_models.schedule import simulate
from flint.hardware_models.spec import load_spec


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


def _tp_and_dp_graph() -> WorkloadGraph:
    """16 H100s, 2 nodes: a TP all-reduce inside node 0's NVLink domain and a DP
    reduce-scatter over one GPU per node (through the NIC), both issued at t = 0 on two
    streams of device 0, then a second DP reduce-scatter."""
    cluster = Cluster(16, (("data", 2), ("model", 8)), "h100-sxm")
    comms = [Communicator(0, "groups", "{{0,1,2,3,4,5,6,7},{8,9,10,11,12,13,14,15}}", 16, 2,
                          8, ("model",)),
             Communicator(1, "groups", "{{0,8},{1,9},{2,10},{3,11},{4,12},{5,13},{6,14},"
                          "{7,15}}", 16, 8, 2, ("data",))]

    def coll(i, kind, comm, stream):
        return Node(i, f"{kind}.{i}", NodeKind.COLLECTIVE, kind, "collective",
                    meta={"stream": stream},
                    collective=Collective(kind, comm, 64 << 20, 64 << 20, "bf16", None, True))

    nodes = [coll(0, "all-reduce", 0, "tp"), coll(1, "reduce-scatter", 1, "dp"),
             coll(2, "reduce-scatter", 1, "dp2")]
    return WorkloadGraph(cluster, nodes, comms, [], {})


def test_collectives_on_disjoint_links_run_at_once():
    from flint.hardware_models.cost_model import default_cost_model
    from flint.hardware_models.links import SCALE_OUT, SCALE_UP, collective_links

    g = _tp_and_dp_graph()
    links = collective_links(g, default_cost_model(g, "h100-sxm"))
    assert links == [frozenset({SCALE_UP}), frozenset({SCALE_OUT}), frozenset({SCALE_OUT})]
    tl = simulate(g, [0.5, 1.0, 1.0], links=links)
    # NVLink and the NIC: both at once; two over the NIC: one after the other
    assert tl.start[:2] == [0.0, 0.0] and tl.start[2] == 1.0
    # without link classes every collective of the device queues on one list
    assert simulate(g, [0.5, 1.0, 1.0]).start == [0.0, 0.5, 1.5]


def test_a_blocks_held_collectives_wait_only_on_their_own_links():
    g = _graph([("coll", "dp", [], []), ("compute", None, [], [])])
    # the block's TP collectives (0.2 s of NVLink) beside a 1 s reduction over the NIC
    tl = simulate(g, [1.0, 0.5], links=[frozenset({"scale-out"}), frozenset()],
                  holds=[0.0, {"scale-up": 0.2}])
    assert tl.finish[1] == 0.5
    # the same hold on every link (a number) waits for the reduction to end
    tl = simulate(g, [1.0, 0.5], links=[frozenset({"scale-out"}), frozenset()],
                  holds=[0.0, 0.2])
    assert tl.finish[1] == 1.2


def _two_per_node_graph() -> WorkloadGraph:
    """16 H100s in 2 nodes: TP 4 inside a node and DP 4 over two GPUs of each node
    (Megatron's rank order, TP fastest): the DP ring has hops inside the node and hops
    through the NIC, and its time is the NIC's."""
    cluster = Cluster(16, (("data", 4), ("model", 4)), "h100-sxm")
    tp = ",".join("{%s}" % ",".join(str(4 * g + r) for r in range(4)) for g in range(4))
    dp = ",".join("{%s}" % ",".join(str(r + 4 * d) for d in range(4)) for r in range(4))
    comms = [Communicator(0, "groups", "{%s}" % tp, 16, 4, 4, ("model",)),
             Communicator(1, "groups", "{%s}" % dp, 16, 4, 4, ("data",))]
    nodes = [Node(i, f"{kind}.{i}", NodeKind.COLLECTIVE, kind, "collective",
                  meta={"stream": stream},
                  collective=Collective(kind, comm, 64 << 20, 64 << 20, "bf16", None, True))
             for i, (kind, comm, stream) in enumerate([("all-reduce", 0, "tp"),
                                                       ("reduce-scatter", 1, "dp")])]
    return WorkloadGraph(cluster, nodes, comms, [], {})


def test_a_group_that_spans_nodes_queues_on_the_nic_only_where_nvlink_is_far_faster():
    from flint.hardware_models.cost_model import default_cost_model
    from flint.hardware_models.links import BOTH, SCALE_OUT, SCALE_UP, collective_links

    g = _two_per_node_graph()
    model = default_cost_model(g, "h100-sxm")
    assert model.network.placement(g.communicators[1]).per_domain == 2
    # NIC 50 GB/s beside NVLink 450 GB/s: its NVLink hops use 11% of the link
    links = collective_links(g, model)
    assert links == [frozenset({SCALE_UP}), frozenset({SCALE_OUT})]
    tl = simulate(g, [0.5, 2.0], links=links)
    assert tl.start == [0.0, 0.0]
    # a scale-up link no faster than twice the NIC is a shared one: both queue on it
    slow = default_cost_model(g, "h100-sxm", ["scale_up_bandwidth=100GB/s"])
    assert collective_links(g, slow) == [frozenset({SCALE_UP}), BOTH]
    assert simulate(g, [0.5, 2.0], links=collective_links(g, slow)).start == [0.0, 0.5]


def test_tpu_collectives_queue_only_on_the_torus_links_they_use():
    """A TPU chip's links are two per torus dimension, full duplex, and named per chip:
    the two halves of a bidirectional windowed einsum (a permute forward, one back) and
    collectives over different dimensions use disjoint links; crossing slices is the DCN."""
    from flint.hardware_models.links import torus_links
    from flint.hardware_models.topology import topology_for

    topo = topology_for(load_spec("tpu-v5p", ["torus=4x4x4"]), 128)     # 2 slices of 64
    of = torus_links(topo)

    def pairs(step):
        spec = "{" + ",".join(f"{{{i},{(i // 4) * 4 + (i + step) % 4}}}" for i in range(64)) + "}"
        return Communicator(0, "pairs", spec, 128, 2, 64, ("model",))

    # rank 0 sends to 1 over its x+ link and hears from 3 over 3's (the wraparound)
    assert of(pairs(1)) == {"ici0+@0", "ici0+@3"}
    assert of(pairs(-1)) == {"ici0-@0", "ici0-@1"}
    x_ring = Communicator(1, "groups", "[32,4]<=[128]", 128, 4, 32, ("model",))
    yz = Communicator(2, "groups", "[8,16]<=[2,4,4,4]T(0,3,1,2)", 128, 16, 8, ("fsdp",))
    across = Communicator(3, "groups", "[64,2]<=[2,64]T(1,0)", 128, 2, 64, ("data",))
    assert of(x_ring) == of(pairs(1)) | of(pairs(-1))
    assert {n.split("@")[0] for n in of(yz)} == {"ici1+", "ici1-", "ici2+", "ici2-"}
    assert not of(yz) & of(x_ring)
    assert of(across) == {"dcn"}


def test_opposite_rings_over_a_plane_share_no_link():
    """A model axis of 16 on an 8x2 plane of an 8x8x8 slice: each ring of a
    bidirectional permute crosses a y link only on its wrap hop, each a different one,
    while the group's all-gather uses the links both rings use."""
    from flint.hardware_models.links import torus_links
    from flint.hardware_models.topology import topology_for

    of = torus_links(topology_for(load_spec("tpu-v5p"), 512))

    def ring(step):
        spec = "{" + ",".join(f"{{{i},{(i // 16) * 16 + (i + step) % 16}}}"
                              for i in range(512)) + "}"
        return Communicator(0, "pairs", spec, 512, 2, 512, ("model",))

    forward, back = of(ring(1)), of(ring(-1))
    assert not forward & back
    assert {n.split("@")[0] for n in forward} == {"ici0+", "ici1-"}   # 15 -> 0 goes y-
    gather = of(Communicator(1, "groups", "[32,16]<=[512]", 512, 16, 32, ("model",)))
    assert forward & gather and back & gather
    assert "ici1-@0" not in gather        # (0, 7) is no member: the folded ring's y link


def test_tpu_collectives_in_flight_together_run_at_once_on_disjoint_links():
    """libtpu's async collectives are DMAs, not one stream's queue: two the program has in
    flight together run at once where their links are disjoint, in turn where they share
    one; a GPU program's XLA collectives keep their one stream's order."""
    def graph(platform):
        cluster = Cluster(4, (("model", 4),), "tpu-v5p", platform)
        comms = [Communicator(0, "pairs", "{{0,1},{1,2},{2,3},{3,0}}", 4, 2, 4, ("model",))]
        nodes = [Node(i, f"collective-permute.{i}", NodeKind.COLLECTIVE, "collective-permute",
                      "collective", collective=Collective("collective-permute", 0, 1 << 20,
                                                          1 << 20, "bf16", None, True))
                 for i in range(3)]
        return WorkloadGraph(cluster, nodes, comms, [], {})

    links = [frozenset({"ici0+@0"}), frozenset({"ici0-@0"}), frozenset({"ici0+@0"})]
    assert simulate(graph("tpu"), [1.0, 1.0, 1.0], links=links).start == [0.0, 0.0, 1.0]
    assert simulate(graph("gpu"), [1.0, 1.0, 1.0], links=links).start == [0.0, 1.0, 2.0]


def test_tpu_torus_slices_and_dimension_wise_collectives():
    from flint.hardware_models.topology import topology_for

    v5p = load_spec("tpu-v5p")
    topo = topology_for(v5p, 4096)
    assert topo.torus == (16, 16, 16) and all(topo.wraps)
    assert topology_for(v5p, 12288).scale_up_domain == 6144      # 2 slices over DCN
    assert topology_for(load_spec("tpu-v5e"), 8).torus == (2, 4)
    with pytest.raises(FlintError, match="does not fit"):
        topology_for(load_spec("tpu-v5p", ["torus=4x4x8"]), 100)
    with pytest.raises(FlintError, match="whole h100-sxm nodes"):
        topology_for(load_spec("h100-sxm"), 12)
    net = NetworkModel(v5p, Cluster(4096, (("data", 256), ("model", 16))))
    s = 1 << 30
    node = Node(0, "ar", NodeKind.COLLECTIVE, "all-reduce", "collective",
                collective=Collective("all-reduce", 0, s, s, "bf16"))
    x_ring = Communicator(0, "groups", "[256,16]<=[4096]", 4096, 16, 256, ("model",))
    assert net.placement(x_ring).grid == ((16, True),)
    link = 600e9 * 0.8 / 6                                 # one ICI link, one direction
    expect = 2 * (15 / 16 * s / (2 * link) + 15 * v5p.scale_up_latency)
    assert net.time(node, x_ring) == pytest.approx(expect)
    everyone = Communicator(1, "groups", "[1,4096]<=[4096]", 4096, 4096, 1, ("data", "model"))
    assert net.placement(everyone).grid == ((16, True),) * 3
    # Each dimension's links carry a third of the data at once (jax-ml/scaling-book: an
    # AllGather over n axes has n axes' bandwidth): a third of one dimension's ring, and
    # each part shrinks 16x before it reaches its second and third dimension.
    busiest = 15 / 16 * s / 3 * (1 + 1 / 16 + 1 / 256) / (2 * link)
    hops = 3 * 15 * v5p.scale_up_latency
    assert net.time(node, everyone) == pytest.approx(2 * (busiest + hops))
    assert net.time(node, everyone) < 0.4 * net.time(node, x_ring)
    # an open dimension (4 long, no wraparound link) runs a one-link ring: its links, not
    # the wrapping dimension's, bound a 2-D group of a 4x4 v5e slice
    v5e = load_spec("tpu-v5e")
    small = NetworkModel(v5e, Cluster(16, (("data", 16),)))
    grid16 = Communicator(0, "groups", "[1,16]<=[16]", 16, 16, 1, ("data",))
    assert small.placement(grid16).grid == ((4, False), (4, False))
    v5e_link = 200e9 * 0.8 / 4
    open_dim = 3 / 4 * s / 2 * (1 + 1 / 4) / v5e_link
    assert small.time(node, grid16) == pytest.approx(2 * (open_dim + 6 * v5e.scale_up_latency))


def test_a_synchronous_gradient_reduction_is_priced_once_not_also_in_its_block():
    """libtpu reduces gradients with synchronous all-reduces on the compute stream. The
    layered graph runs each as a collective node of its own, so the R block standing for
    the reduction's compute (casts, scaling) must not count the collective's time too:
    counted in both, a TPU FSDP step paid its gradient all-reduces twice."""
    from flint.hardware_models.composite import price_blocks

    cluster = Cluster(2, (("fsdp", 2),), "tpu-v5e")
    comms = [Communicator(0, "groups", "{{0,1}}", 2, 2, 1, ("fsdp",))]
    nodes = [Node(0, "dot", NodeKind.COMPUTE, "dot", "gemm", flops=1e12,
                  meta={"block": "B:0"}),
             Node(1, "all-reduce", NodeKind.COLLECTIVE, "all-reduce", "collective", inputs=[0],
                  collective=Collective("all-reduce", 0, 1 << 30, 1 << 30, "bf16", "add"),
                  meta={"block": "R:0"}),
             Node(2, "scale", NodeKind.COMPUTE, "multiply", "elementwise", inputs=[1],
                  meta={"block": "R:0"})]
    template = WorkloadGraph(cluster, nodes, comms, [], {})
    seconds = {0: 2e-3, 1: 50e-3, 2: 1e-3}
    prices = price_blocks(template, lambda n: seconds[n.id], None, None)
    assert prices.seconds["R:0"] == pytest.approx(1e-3)          # the scaling alone
    assert prices.by_class["R:0"] == {"elementwise": pytest.approx(1e-3)}
    assert prices.seconds["B:0"] == pytest.approx(2e-3)


def test_a_blocks_collectives_on_disjoint_links_run_at_once_as_in_the_step():
    """A block's price comes from the same schedule as the step's: collectives queue per
    device and link class. Two collectives of different streams on disjoint links (an FSDP2
    all-gather over the NIC beside a tensor-parallel collective on NVLink; a permute forward
    and one back on a torus) overlap inside a block as they do between blocks; one queue
    for all of a block's collectives had made them take turns."""
    from flint.hardware_models.composite import price_blocks

    g = _graph([("coll", "fsdp-all-gather", [], []),   # 0: 30 ms on its own stream
                ("coll", None, [], []),                 # 1: 30 ms on the collectives stream
                ("compute", None, [0, 1], [])])         # 2: 5 ms, needs both
    for node in g.nodes:
        node.meta["block"] = "F:0"
    seconds = {0: 30e-3, 1: 30e-3, 2: 5e-3}
    one_queue = price_blocks(g, lambda n: seconds[n.id], None, None)
    assert one_queue.seconds["F:0"] == pytest.approx(65e-3)
    directions = {0: frozenset({"scale-out"}), 1: frozenset({"scale-up"})}
    prices = price_blocks(g, lambda n: seconds[n.id], None, lambda n: directions[n.id])
    assert prices.seconds["F:0"] == pytest.approx(35e-3)
    # and each holds its own links for its 30 ms, the one on FSDP2's stream too: what a
    # layered graph's collectives queue behind, as in the step's own schedule
    assert prices.network["F:0"] == {"scale-out": pytest.approx(30e-3),
                                     "scale-up": pytest.approx(30e-3)}


def test_the_compiled_slice_is_the_slice_the_cost_model_prices():
    """libtpu compiles a job on the slice the cost model prices (topology_for): the most
    cubic shape of dimensions 1, 2 or a multiple of 4 (v4-384, 192 chips: 4x4x12, which a
    power-of-two torus cannot be), and a job beyond the largest slice is split where the
    cost model splits it (v5p: 16x16x24 = 6144 chips, not the Pod's 8960)."""
    from flint.frontends.targets import TPU_TARGETS, slice_shape
    from flint.hardware_models.topology import topology_for

    assert slice_shape("tpu-v4", 192) == (4, 4, 12)
    for hardware, chips in (("tpu-v4", 192), ("tpu-v4", 4096), ("tpu-v5e", 64),
                            ("tpu-v5p", 128), ("tpu-v5p", 6144)):
        assert slice_shape(hardware, chips) == tuple(sorted(
            topology_for(load_spec(hardware), chips).torus))
    assert TPU_TARGETS["tpu-v5p"][3] == topology_for(load_spec("tpu-v5p"), 12288).scale_up_domain
    with pytest.raises(FlintError, match="no tpu-v5e torus slice"):
        slice_shape("tpu-v5e", 24 * 16)
