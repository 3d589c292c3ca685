"""How communication slows the compute it overlaps on the same GPU.

NCCL runs a collective as one CTA per channel, each resident on an SM for the collective's
whole length (NCCL docs, "NCCL_MIN_CTAS / NCCL_MAX_CTAS": the CTAs NCCL uses; one channel
per CTA), and moves its bytes through the GPU's HBM. A compute kernel beside it loses:

- SMs: the collective's channels. NCCL sizes them per call (src/enqueue.cc,
  topoGetAlgoInfo): a ring/tree collective takes one channel per 512 threads x 64 bytes
  (Simple protocol: 32 KiB) of its size, up to the communicator's channels (NCCL_CHANNELS
  below); NVLS runs NCCL_NVLS_NCHANNELS = 16 channels. A GEMM or attention CTA needs
  the whole SM's shared memory, so it cannot share an SM with an NCCL CTA: compute-bound
  work runs on the SMs left. Memory-bound kernels' small CTAs co-reside with NCCL's.
- HBM bandwidth: the collective's local traffic at the rate it actually runs. A ring
  reads its input and writes what it receives (and a reduction reads the local operand
  again): 2-3 local bytes per byte on the wire (HBM_BYTES_PER_WIRE_BYTE); NVLS's switch
  reads each GPU's buffer once and writes the result once (2 per byte of the buffer).
  Its rate is the wire bytes over the time the network model priced for it (a NIC-bound
  collective across nodes takes far less of HBM than an NVLink-bound one).

The kernel's time beside the collective is the larger of its compute time on the SMs
left and its memory time on the bandwidth left, so the factor moves smoothly from one
bound to the other. Measured: Echo (arXiv 2412.12487) and Rashidi et al. (ISCA 2021,
"Enabling Compute-Communication Overlap in Distributed Deep Learning Training Platforms")
report overlapped GEMMs slowed by tens of percent by concurrent all-reduces for exactly
these two reasons. Only GPUs with the default models: TPUs and CPUs move collectives
with DMA engines.
"""
from __future__ import annotations

import math

from flint.graph import Node, collective_size_bytes
from flint.hardware_models.spec import HardwareSpec

# Ring/tree channels of an NVSwitch node (the 'Channel xx/NN' lines of NCCL_DEBUG=INFO logs
# on DGX A100/H100 show 16-32; NCCL_MIN_NCHANNELS/NCCL_MAX_NCHANNELS bound it); taken as 16.
NCCL_CHANNELS = 16
NVLS_CHANNELS = 16                 # NCCL docs: NCCL_NVLS_NCHANNELS, default 16
BYTES_PER_CHANNEL = 512 * 64       # Simple: NCCL_SIMPLE_MAX_NTHREADS x NCCL_SIMPLE_THREAD_THRESHOLD
HBM_BYTES_PER_WIRE_BYTE = {"all-reduce": 3.0, "reduce-scatter": 3.0}
NVLS_HBM_BYTES = 2.0               # per byte of the buffer
MAX_SHARE = 0.5                    # a collective never takes more than half of SMs or HBM


def channels(comm: Node, algorithm: str) -> int:
    """The SMs NCCL's CTAs hold while `comm` runs."""
    if algorithm == "nvls":
        return NVLS_CHANNELS
    size = float(collective_size_bytes(comm))
    return max(1, min(NCCL_CHANNELS, math.ceil(size / BYTES_PER_CHANNEL)))


def local_hbm_rate(comm: Node, priced, fallback_wire: float) -> float:
    """Bytes/s of HBM traffic the collective makes on one GPU while it runs."""
    kind = comm.collective.type if comm.collective is not None else ""
    size = float(collective_size_bytes(comm))
    if priced is None or priced[1] <= 0:
        return fallback_wire * HBM_BYTES_PER_WIRE_BYTE.get(kind, 2.0)
    algorithm, seconds, ranks = priced
    if algorithm == "nvls":
        return NVLS_HBM_BYTES * size / seconds
    p = max(int(ranks), 1)
    wire = {"all-reduce": 2.0 * (p - 1) / p}.get(kind, (p - 1) / p) * size
    return HBM_BYTES_PER_WIRE_BYTE.get(kind, 2.0) * wire / seconds


def interference(spec: HardwareSpec, compute, network, node: Node, comm: Node) -> float:
    """How much slower `node` runs while `comm` is in flight on its GPU (>= 1)."""
    if spec.kind != "gpu" or not spec.cores or not hasattr(compute, "bound"):
        return 1.0
    if not (node.flops or node.bytes_read or node.bytes_written):
        return 1.0      # an imported node with only a recorded duration: already as it ran
    t_flops, t_bytes = compute.bound(node)
    alone = max(t_flops, t_bytes)
    if alone <= 0:
        return 1.0
    priced = _priced(network, comm)
    held = channels(comm, priced[0] if priced else "ring")
    sm_left = 1.0 - min(held / spec.cores, MAX_SHARE)
    wire = getattr(getattr(network, "up", None), "bandwidth", 0.0)
    local = local_hbm_rate(comm, priced, wire)
    achievable = spec.hbm_bandwidth * compute.figure("hbm_fraction")
    hbm_left = 1.0 - min(local / achievable, MAX_SHARE) if achievable else 1.0
    return max(t_flops / sm_left, t_bytes / hbm_left) / alone


def _priced(network, comm: Node):
    from flint.hardware_models.network import priced_key

    log = getattr(network, "priced", None)
    return log.get(priced_key(comm)) if isinstance(log, dict) else None
