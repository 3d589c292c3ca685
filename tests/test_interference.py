"""How compute and a collective on one GPU slow each other (hardware_models/interference.py):
a GEMM's tiles fill waves of the SMs NCCL leaves, memory-bound work and the collective
share HBM, and a layer-template block slows as its own kernels would."""
from __future__ import annotations

import pytest

from conftest import communicator
from flint.cluster import Cluster
from flint.graph import Collective, Node, NodeKind, WorkloadGraph
from flint.hardware_models.cost_model import default_cost_model
from flint.hardware_models.spec import load_spec


def test_overlap_slows_compute_on_gpus():
    from flint.hardware_models.cost_model import interference

    h100 = load_spec("h100-sxm")
    model = default_cost_model(WorkloadGraph(cluster=Cluster(8, (("data", 8),))), "h100-sxm")
    gemm = Node(0, "g", NodeKind.COMPUTE, "dot", "gemm", flops=2.0 * 8192 ** 3,
                operands=["bf16[8192,8192]"], outputs=["bf16[8192,8192]"],
                bytes_read=2 * 2 * 8192 ** 2, bytes_written=2 * 8192 ** 2)
    copy = Node(1, "c", NodeKind.MEMORY, "copy", "data_movement", bytes_read=1e9, bytes_written=1e9)
    ag = Node(2, "ag", NodeKind.COLLECTIVE, "all-gather", "collective",
              collective=Collective("all-gather", 0, 1e8, 8e8, "bf16"))
    # a GEMM's tiles (chosen for all 132 SMs) run in waves over the 116 NCCL leaves free:
    # 2048 tiles of 128x256 (128x128's 4096 in twice the waves tie: the larger tile) take
    # 16 waves alone, 18 beside a 16-channel collective
    c = model.compute
    floor = c.launch_overhead()
    assert c.compute_time(gemm, free=116) / c.compute_time(gemm) == pytest.approx(
        (18 * 128 + 2) / (16 * 128 + 2))
    assert model.overlap_slowdown(gemm, ag) == pytest.approx(
        (floor + c.compute_time(gemm, free=116)) / (floor + c.compute_time(gemm)))
    # a one-wave grid (132 tiles of 128x128) needs a second wave: about twice as long
    wave = Node(4, "w", NodeKind.COMPUTE, "dot", "gemm", flops=2.0 * 1408 * 1536 * 4096,
                operands=["bf16[1408,4096]"], outputs=["bf16[1408,1536]"])
    assert 1.9 < model.overlap_slowdown(wave, ag) < 2.0
    # a grid that fits in the SMs left does not slow at all
    small = Node(5, "s", NodeKind.COMPUTE, "dot", "gemm", flops=2.0 * 512 * 1024 * 4096,
                 operands=["bf16[512,4096]"], outputs=["bf16[512,1024]"])
    assert model.overlap_slowdown(small, ag) == pytest.approx(1.0)
    # memory-bound work and the collective share HBM without priority: the kernel's memory
    # time grows by 1 + the collective's traffic over HBM's bandwidth; its floor does not
    wire = 450e9 * 0.8
    hbm = h100.hbm_bandwidth * h100.hbm_fraction
    work, whole = c.bound(copy)[1], c.time(copy)
    assert whole > work
    assert model.overlap_slowdown(copy, ag) == pytest.approx(
        (whole - work + work * (1 + 2 * wire / hbm)) / whole)
    # and the collective, beside it, by its demand's share: 1 + its traffic over HBM's
    # bandwidth beside a kernel that streams all the time; beside a GEMM not at all
    assert model.comm_slowdown(ag, copy) == pytest.approx(work / whole + 2 * wire / hbm)
    assert model.comm_slowdown(ag, gemm) == 1.0
    tpu = default_cost_model(WorkloadGraph(cluster=Cluster(8, (("data", 8),))), "tpu-v5p")
    assert interference(tpu.spec, tpu.compute, tpu.network, gemm, ag) == 1.0
    # once the network has priced a collective, its HBM share is its own traffic at the
    # rate it ran, and a small one holds only the channels NCCL gives it (32 KiB each)
    comm = communicator("[1,8]<=[8]", 8)
    t = model.network.time(ag, comm)
    local = 2 * 7 / 8 * 8e8 / t
    assert model.overlap_slowdown(copy, ag) == pytest.approx(
        (whole - work + work * (1 + local / hbm)) / whole)
    tiny = Node(3, "ar", NodeKind.COLLECTIVE, "all-reduce", "collective",
                collective=Collective("all-reduce", 0, 64 * 1024, 64 * 1024, "bf16"))
    model.network.time(tiny, comm)
    assert model.overlap_slowdown(gemm, tiny) == pytest.approx(
        (floor + c.compute_time(gemm, free=130)) / (floor + c.compute_time(gemm)))
    assert model.overlap_slowdown(wave, tiny) > 1.9     # 2 channels: 130 SMs < 132 tiles


def test_a_block_and_a_collective_slow_each_other_as_its_own_kernels_would():
    """A layer-template block beside a collective slows as its own kernels would (a GEMM's
    tiles in waves over the SMs NCCL leaves, a memory-bound kernel at its share of HBM),
    weighted by their seconds, its waits not at all; the collective beside the block
    slows as it would beside each of those kernels."""
    from flint.hardware_models.composite import (BlockPrices, composite_comm_slowdown,
                                                 composite_slowdown)

    model = default_cost_model(WorkloadGraph(cluster=Cluster(8, (("data", 8),))), "h100-sxm")
    ag = Node(2, "ag", NodeKind.COLLECTIVE, "all-gather", "collective",
              collective=Collective("all-gather", 0, 1e8, 8e8, "bf16"))
    wave = Node(4, "w", NodeKind.COMPUTE, "dot", "gemm", flops=2.0 * 1408 * 1536 * 4096,
                operands=["bf16[1408,4096]"], outputs=["bf16[1408,1536]"])
    small = Node(5, "s", NodeKind.COMPUTE, "dot", "gemm", flops=2.0 * 512 * 1024 * 4096,
                 operands=["bf16[512,4096]"], outputs=["bf16[512,1024]"])
    stream = Node(6, "e", NodeKind.COMPUTE, "add", "elementwise", bytes_read=1e8,
                  bytes_written=5e7)
    prices = BlockPrices({"F:layer": 1.0},
                         {"F:layer": {"gemm": 0.8, "elementwise": 0.15, "collective": 0.05}},
                         {}, {"F:layer": ((wave, 0.6), (small, 0.2), (stream, 0.15))})
    block = Node(7, "F", NodeKind.COMPUTE, "composite", "composite",
                 meta={"composite": {"block": "F:layer", "scale": 1.0}})
    slow, comm = model.overlap_slowdown, model.comm_slowdown
    assert slow(wave, ag) > 1.9 and slow(small, ag) == pytest.approx(1.0)
    assert slow(stream, ag) > 1.1 and comm(ag, stream) > 1.1
    mixed = composite_slowdown(prices, slow)
    assert mixed(block, ag) == pytest.approx(
        0.6 * slow(wave, ag) + 0.2 * slow(small, ag) + 0.15 * slow(stream, ag) + 0.05)
    assert mixed(stream, ag) == slow(stream, ag)     # plain nodes as before
    beside = composite_comm_slowdown(prices, comm)
    assert beside(ag, block) == pytest.approx(0.6 + 0.2 + 0.15 * comm(ag, stream) + 0.05)


def test_nccl_channels_two_per_nvlink_inside_a_domain_and_16_across_nodes():
    """A communicator inside one NVLink domain runs two channels per NVLink, up to NCCL's
    32 (24 on A100, 32 on H100 and Blackwell); one across nodes runs 16; a spec without
    a link count keeps 16. A large collective holds them all, a small one one per 32 KiB."""
    from flint.hardware_models.interference import channels, communicator_channels

    assert communicator_channels(load_spec("a100-80gb-sxm"), 1) == 24
    assert communicator_channels(load_spec("h100-sxm"), 1) == 32
    assert communicator_channels(load_spec("gb200-nvl72"), 1) == 32
    assert communicator_channels(load_spec("h100-sxm"), 4) == 16
    assert communicator_channels(load_spec("mi300x"), 1) == 16
    big = Node(0, "ag", NodeKind.COLLECTIVE, "all-gather", "collective",
               collective=Collective("all-gather", 0, 1e8, 8e8, "bf16"))
    small = Node(1, "ar", NodeKind.COLLECTIVE, "all-reduce", "collective",
                 collective=Collective("all-reduce", 0, 96 * 1024, 96 * 1024, "bf16"))
    assert channels(big, "ring", 32) == 32 and channels(small, "ring", 32) == 3
    assert channels(big, "nvls", 32) == 16
    # priced by the network inside one node, an H100 all-gather leaves 100 SMs to a GEMM:
    # 2048 tiles of 128x256 in 16 waves alone take 21 beside it
    model = default_cost_model(WorkloadGraph(cluster=Cluster(8, (("data", 8),))), "h100-sxm")
    model.network.time(big, communicator("[1,8]<=[8]", 8))
    gemm = Node(2, "g", NodeKind.COMPUTE, "dot", "gemm", flops=2.0 * 8192 ** 3,
                operands=["bf16[8192,8192]"], outputs=["bf16[8192,8192]"])
    c = model.compute
    assert model.overlap_slowdown(gemm, big) == pytest.approx(
        (c.launch_overhead() + c.compute_time(gemm, free=100))
        / (c.launch_overhead() + c.compute_time(gemm)))
    assert c.compute_time(gemm, free=100) / c.compute_time(gemm) == pytest.approx(
        (21 * 128 + 2) / (16 * 128 + 2))
