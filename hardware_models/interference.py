"""How communication slows the compute it overlaps on the same GPU.

NCCL runs a collective as one CTA per channel, each resident on an SM for the collective's
whole length (NCCL docs, "NCCL_MIN_CTAS / NCCL_MAX_CTAS": the CTAs NCCL uses; one channel
per CTA), and moves its bytes through the GPU's HBM. A compute kernel beside it loses:

- SMs: the collective's channels. NCCL sizes them per call (src/enqueue.cc,
  topoGetAlgoInfo): a ring/tree collective takes one channel per 512 threads x 64 bytes
  (Simple protocol: 32 KiB) of its size, up to the communicator's channels
  (`communicator_channels`: two per NVLink inside one NVLink domain, up to NCCL's 32;
  16 across nodes); NVLS runs NCCL_NVLS_NCHANNELS = 16 channels. A GEMM or attention CTA needs
  the whole SM's shared memory, so it cannot share an SM with an NCCL CTA: its tiles run in
  waves over the SMs left, the tile still the one cuBLAS picked for the whole GPU
  (kernels.gemm_time `free`), so a one-wave GEMM of 128 tiles on an H100 (132 SMs) beside
  a 16-channel collective takes two waves, twice its time, and an eight-wave one takes
  nine. Other compute-bound work slows by the SMs' share. Memory-bound kernels' small
  CTAs co-reside with NCCL's.
- HBM bandwidth: the collective's local traffic at the rate it actually runs. HBM serves
  the kernel's loads and NCCL's without priority, so while together they ask for more
  than it delivers each gets its demand's share: a memory-bound kernel's memory time
  grows by 1 + the collective's traffic over HBM's achievable bandwidth, and so does the
  collective while such a kernel runs beside it (collective_slowdown). A ring
  reads its input and writes what it receives (and a reduction reads the local operand
  again): 2-3 local bytes per byte on the wire (HBM_BYTES_PER_WIRE_BYTE); NVLS's switch
  reads each GPU's buffer once and writes the result once (2 per byte of the buffer).
  Its rate is the wire bytes over the time the network model priced for it (a NIC-bound
  collective across nodes takes far less of HBM than an NVLink-bound one).

The kernel's work beside the collective takes the larger of its compute time on the SMs
left and its memory time at its share of HBM, so the factor moves smoothly from one
bound to the other; its floor (the grid's ramp, kernels.py) does not stretch. Measured:
Echo (arXiv 2412.12487) and Rashidi et al. (ISCA 2021, "Enabling Compute-Communication
Overlap in Distributed Deep Learning Training Platforms") report overlapped GEMMs slowed
by tens of percent by concurrent all-reduces for exactly these two reasons. Only GPUs with
the default models: TPUs and CPUs move collectives with DMA engines.
"""
from __future__ import annotations

import math

from flint.graph import TENSOR_CLASSES, Node, collective_size_bytes
from flint.hardware_models.spec import HardwareSpec

# Ring/tree channels of a communicator. Inside one NVLink domain NCCL's topology search
# gives two channels per NVLink of the GPU: 24 on an HGX A100 (12 NVLinks; 'Channel 23/24'
# in the NCCL_DEBUG=INFO log of NVIDIA/nccl-tests issue 100), 16 on an H800 (8 NVLinks;
# '16 coll channels', NVIDIA/nccl issue 892), up to MAXCHANNELS = 32 (NCCL
# src/include/device.h), which H100 and Blackwell (18 NVLinks) reach. Rule for other GPUs:
# the same, from the spec's `scale_up.links`. A communicator that spans nodes runs over
# the NICs with fewer: 16 (a two-node, 16-rank ring: 'Channel 01/16' in the log of
# NVIDIA/nccl issue 1538), also taken where a spec gives no link count.
NCCL_MAX_CHANNELS = 32
CHANNELS_PER_NVLINK = 2
NCCL_CHANNELS = 16
NVLS_CHANNELS = 16                 # NCCL docs: NCCL_NVLS_NCHANNELS, default 16
BYTES_PER_CHANNEL = 512 * 64       # Simple: NCCL_SIMPLE_MAX_NTHREADS x NCCL_SIMPLE_THREAD_THRESHOLD
HBM_BYTES_PER_WIRE_BYTE = {"all-reduce": 3.0, "reduce-scatter": 3.0}
NVLS_HBM_BYTES = 2.0               # per byte of the buffer
MAX_SHARE = 0.5                    # a collective never takes more than half of SMs or HBM


def communicator_channels(spec: HardwareSpec, domains: int) -> int:
    """The ring/tree channels of a communicator spanning `domains` NVLink domains."""
    if domains <= 1 and spec.scale_up_links and spec.scale_up_link == "nvlink":
        return min(NCCL_MAX_CHANNELS, CHANNELS_PER_NVLINK * int(spec.scale_up_links))
    return NCCL_CHANNELS


def channels(comm: Node, algorithm: str, most: int = NCCL_CHANNELS) -> int:
    """The SMs NCCL's CTAs hold while `comm` runs, of a communicator with `most`."""
    if algorithm == "nvls":
        return NVLS_CHANNELS
    size = float(collective_size_bytes(comm))
    return max(1, min(most, math.ceil(size / BYTES_PER_CHANNEL)))


def local_hbm_rate(comm: Node, priced, fallback_wire: float) -> float:
    """Bytes/s of HBM traffic the collective makes on one GPU while it runs."""
    kind = comm.collective.type if comm.collective is not None else ""
    size = float(collective_size_bytes(comm))
    if priced is None or priced[1] <= 0:
        return fallback_wire * HBM_BYTES_PER_WIRE_BYTE.get(kind, 2.0)
    algorithm, seconds, ranks = priced[:3]
    if algorithm == "nvls":
        return NVLS_HBM_BYTES * size / seconds
    p = max(int(ranks), 1)
    wire = {"all-reduce": 2.0 * (p - 1) / p}.get(kind, (p - 1) / p) * size
    return HBM_BYTES_PER_WIRE_BYTE.get(kind, 2.0) * wire / seconds


def interference(spec: HardwareSpec, compute, network, node: Node, comm: Node) -> float:
    """How much slower `node` runs while `comm` is in flight on its GPU (>= 1)."""
    if not _gpu_model(spec, compute) or not _has_work(node):
        return 1.0
    t_flops, t_bytes = compute.bound(node)
    alone = max(t_flops, t_bytes)
    if alone <= 0:
        return 1.0
    priced = _priced(network, comm)
    most = communicator_channels(spec, priced[3]) if priced else NCCL_CHANNELS
    held = min(channels(comm, priced[0] if priced else "ring", most),
               int(spec.cores * MAX_SHARE))
    if node.op_class in TENSOR_CLASSES and t_flops > 0:
        # tensor-core CTAs take the SMs left in waves of the tiles chosen for the whole GPU
        beside = compute.compute_time(node, free=int(spec.cores) - held)
    else:
        beside = t_flops / (1.0 - held / spec.cores)
    share = _hbm_share(spec, compute, network, comm, priced)
    # the kernel's floor (its grid's ramp, kernels.py) does not stretch, only its work
    whole = compute.time(node)
    return (whole - alone + max(beside, t_bytes * (1.0 + share))) / whole if whole > 0 else 1.0


def collective_slowdown(spec: HardwareSpec, compute, network, comm: Node, node: Node) -> float:
    """How much slower `comm` moves while compute `node` runs beside it on its GPU (>= 1):
    HBM serves the kernel's loads and NCCL's alike, so while the two together ask for more
    than HBM delivers (the kernel's average demand, its memory time over its time, plus
    the collective's local traffic) the collective gets its demand's share of it. A GEMM
    (little HBM traffic for its time) leaves it alone; a memory-bound kernel slows it by
    1 + its local traffic over HBM's achievable bandwidth. Measured on the shared MaxText
    H100 trace (flint/validate/overlap.py, collective_table): the 140 MiB FSDP all-gathers
    run 1.1x their fastest beside GEMMs, 1.4x beside memory-bound fusions."""
    if not _gpu_model(spec, compute) or not _has_work(node):
        return 1.0
    _, t_bytes = compute.bound(node)
    whole = compute.time(node)
    if t_bytes <= 0 or whole <= 0:
        return 1.0
    share = _hbm_share(spec, compute, network, comm, _priced(network, comm))
    return max(1.0, t_bytes / whole + share)


def _hbm_share(spec: HardwareSpec, compute, network, comm: Node, priced) -> float:
    """The collective's local HBM traffic over the bandwidth HBM achieves."""
    wire = getattr(getattr(network, "up", None), "bandwidth", 0.0)
    local = local_hbm_rate(comm, priced, wire)
    achievable = spec.hbm_bandwidth * compute.figure("hbm_fraction")
    return min(local / achievable, MAX_SHARE) if achievable else 0.0


def _gpu_model(spec: HardwareSpec, compute) -> bool:
    return spec.kind == "gpu" and bool(spec.cores) and hasattr(compute, "bound")


def _has_work(node: Node) -> bool:
    # an imported node with only a recorded duration ran as it ran: already contended
    return bool(node.flops or node.bytes_read or node.bytes_written)


def _priced(network, comm: Node):
    from flint.hardware_models.network import priced_key

    log = getattr(network, "priced", None)
    return log.get(priced_key(comm)) if isinstance(log, dict) else None
