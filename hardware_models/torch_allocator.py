"""PyTorch's CUDA caching allocator replayed over a torch graph's buffer lifetimes.

A PyTorch run holds what its caching allocator has reserved from the driver, not what
its live tensors add up to. The allocator's rules (c10/cuda/CUDACachingAllocator.cpp):
every request is rounded up to 512 bytes (kMinBlockSize); requests up to 1 MiB
(kSmallSize) are carved out of 2 MiB segments (kSmallBuffer), requests between 1 and
10 MiB out of 20 MiB segments (kLargeBuffer), larger ones get a segment of their own size
rounded up to 2 MiB (kRoundLarge); a free block is reused for the smallest request it fits
(best fit), split when the rest is worth keeping (>= 512 bytes in the small pool, > 1 MiB
in the large), coalesced with free neighbours, and kept cached rather than returned. Blocks
belong to the stream that allocated them: memory freed on one stream is not handed to
another (FSDP2's all-gather stream keeps its own blocks), and a tensor a side stream uses
is held until that stream's work is done (`record_stream`: in program order, until the
collective that reads it, which is one of its consumers).

Without memory pressure the allocator keeps every segment it ever reserved; under
pressure it first releases the segments that hold no live block (release_cached_blocks)
and retries. So what a device must hold is, at each moment, the segments that hold a live
block (`needed`): live tensors plus the rounding and the free pieces of their segments.
Its peak is the OOM verdict of a torch graph (hardware_models/memory.py); its excess over
the live tensors is the allocator's fragmentation.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field

MIN_BLOCK = 512
SMALL_SIZE = 1 << 20
SMALL_BUFFER = 2 << 20
LARGE_BUFFER = 20 << 20
MIN_LARGE_ALLOC = 10 << 20
ROUND_LARGE = 2 << 20


def round_size(n: int) -> int:
    return max(MIN_BLOCK, -(-int(n) // MIN_BLOCK) * MIN_BLOCK)


def segment_size(n: int) -> int:
    if n <= SMALL_SIZE:
        return SMALL_BUFFER
    if n < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-n // ROUND_LARGE) * ROUND_LARGE


@dataclass
class _Pool:
    """Free blocks of one (stream, small|large) pool: (size, segment, offset) sorted."""

    free: list = field(default_factory=list)
    segments: list = field(default_factory=list)    # per segment: {offset: (size, free?)}


@dataclass
class CachingAllocator:
    reserved: int = 0
    allocated: int = 0
    needed: int = 0                      # segments holding at least one live block
    peak_reserved: int = 0
    peak_allocated: int = 0
    peak_needed: int = 0
    pools: dict = field(default_factory=dict)
    live: dict = field(default_factory=dict)   # (pool key, segment) -> live blocks

    def malloc(self, nbytes: int, stream: str = "compute") -> tuple:
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        pool = self.pools.setdefault((stream, small), _Pool())
        k = bisect.bisect_left(pool.free, (size, -1, -1))
        if k < len(pool.free):
            block_size, seg, off = pool.free.pop(k)
        else:
            block_size, seg, off = segment_size(size), len(pool.segments), 0
            pool.segments.append({0: [block_size, True]})
            self.reserved += block_size
        blocks = pool.segments[seg]
        rest = block_size - size
        if rest >= (MIN_BLOCK if small else SMALL_SIZE + 1):
            blocks[off] = [size, False]
            blocks[off + size] = [rest, True]
            bisect.insort(pool.free, (rest, seg, off + size))
        else:
            blocks[off] = [block_size, False]
            size = block_size
        self.allocated += size
        key = (stream, small, seg)
        if not self.live.get(key):
            self.needed += sum(b[0] for b in blocks.values())
        self.live[key] = self.live.get(key, 0) + 1
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.peak_needed = max(self.peak_needed, self.needed)
        return (stream, small, seg, off)

    def free(self, handle: tuple) -> None:
        stream, small, seg, off = handle
        pool = self.pools[(stream, small)]
        blocks = pool.segments[seg]
        size = blocks[off][0]
        self.allocated -= size
        blocks[off][1] = True
        # coalesce with the free neighbour after, then before
        nxt = off + size
        if nxt in blocks and blocks[nxt][1]:
            pool.free.remove((blocks[nxt][0], seg, nxt))
            size += blocks.pop(nxt)[0]
        prev = max((o for o in blocks if o < off), default=None)
        if prev is not None and blocks[prev][1] and prev + blocks[prev][0] == off:
            pool.free.remove((blocks[prev][0], seg, prev))
            size += blocks[prev][0]
            del blocks[off]
            off = prev
        blocks[off] = [size, True]
        bisect.insort(pool.free, (size, seg, off))
        key = (stream, small, seg)
        self.live[key] -= 1
        if not self.live[key]:
            self.needed -= sum(b[0] for b in blocks.values())


def replay(graph) -> CachingAllocator:
    """The caching allocator after serving `graph`'s
    buffers: its arguments for the whole step, each node's outputs from the node until
    its last consumer, on the stream the producing node runs on; an in-place kernel
    (buffers.reuses_operand_buffer) writes into an operand of its output's size that dies
    at it, and that block lives on as its output instead of a new one."""
    from flint.hardware_models.buffers import last_uses, leaf_bytes, reuses_operand_buffer
    from flint.hardware_models.schedule import stream_of

    alloc = CachingAllocator()
    for _, nbytes in graph.meta.get("arguments", ()):
        if nbytes:
            alloc.malloc(int(nbytes))
    last = last_uses(graph)
    streams = [stream_of(n) for n in graph.nodes]
    frees: dict[int, list] = {}
    owned: dict[int, list] = {}         # node -> its outputs' (bytes, block handle)
    for i, node in enumerate(graph.nodes):
        sizes = [b for b in leaf_bytes(node.outputs) if b]
        taken = _taken_over(i, node, sizes, owned, last) \
            if len(sizes) == 1 and node.meta.get("aten") and reuses_operand_buffer(node) \
            else None
        if taken is not None:
            frees[i].remove(taken[1])
            mine = [taken]
        else:
            mine = [(b, alloc.malloc(b, streams[i])) for b in sizes]
        owned[i] = mine
        frees.setdefault(last[i], []).extend(h for _, h in mine)
        for h in frees.pop(i, ()):
            alloc.free(h)
    return alloc


def _taken_over(i: int, node, sizes: list, owned: dict, last: list):
    """The (bytes, handle) of an operand block an in-place kernel writes into: one of its
    output's size whose owner dies at this node; None when there is none."""
    for j in node.inputs:
        if last[j] != i:
            continue
        for k, (b, handle) in enumerate(owned.get(j, ())):
            if b == sizes[0]:
                return owned[j].pop(k)
    return None
