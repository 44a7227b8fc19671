"""A simulation of PyTorch's CUDA caching allocator: what it RESERVES (cudaMalloc'd segments) for a stream of
allocations and frees, besides what is allocated.

NVML's "used memory" (the BERT-large rows of transformers' perf_train_gpu_one page) counts the CUDA context and every
segment the allocator holds; the allocator never gives a segment back unless an allocation fails (or
`torch.cuda.empty_cache()`). This module replays an ordered list of events

    ("alloc", id, nbytes)   ("free", id)

through the allocator's rules and reports the peak allocated and the peak reserved bytes. One device, one stream, the
default settings (no PYTORCH_CUDA_ALLOC_CONF: max_split_size unlimited, no roundup_power2_divisions, no expandable
segments), as torch 1.10 ran them.

The rules, from c10/cuda/CUDACachingAllocator.cpp (the stored copy read here is pytorch/pytorch at commit 001074d;
the tag v1.10.0 could not be read through the tools this was written with, and the functions below are those that
1.10 already had - round_size, get_allocation_size, should_split, get_free_block, free_block/try_merge_blocks,
malloc's search -> cudaMalloc -> release_cached_blocks -> cudaMalloc order - with the later options at their
defaults):

- constants: kMinBlockSize = 512, kSmallSize = 1 MiB, kSmallBuffer = 2 MiB, kMinLargeAlloc = 10 MiB,
  kLargeBuffer = 20 MiB, kRoundLarge = 2 MiB;
- `round_size`: a request is rounded up to a multiple of 512 (at least 512);
- `get_pool`: a rounded size <= 1 MiB goes to the small pool, anything larger to the large pool;
- `get_free_block`: the smallest free block of the pool whose size is >= the request (`pool.blocks.lower_bound`,
  blocks ordered by (stream, size, address): `BlockComparatorSize`);
- `get_allocation_size`: without a fitting free block, cudaMalloc a segment of 2 MiB (small requests), 20 MiB
  (requests > 1 MiB and < 10 MiB), or the request rounded up to a multiple of 2 MiB (>= 10 MiB);
- `should_split`: the block found (or the new segment) is split when what remains is >= 512 bytes (small pool) or
  > 1 MiB (large pool); the remainder goes back to the pool as a free block, otherwise the whole block is handed out
  (and counts as allocated: `stats.allocated_bytes` adds `block->size`);
- `free_block` / `try_merge_blocks`: a freed block merges with its free neighbours in the same segment;
- `malloc`: if cudaMalloc fails (the device is full), `release_cached_blocks` cudaFrees every cached segment that is
  whole (not split: a free block with no prev and no next), then cudaMalloc is tried again; only then is it an OOM.
  A `capacity` (bytes the allocator may reserve) makes that happen here; without one cudaMalloc never fails.

Addresses: each new segment starts above every earlier one (cudaMalloc's addresses are the driver's; only the order of
equal-sized free blocks depends on them, the tie `BlockComparatorSize` breaks by address).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

K_MIN_BLOCK_SIZE = 512
K_SMALL_SIZE = 1048576
K_SMALL_BUFFER = 2097152
K_MIN_LARGE_ALLOC = 10485760
K_LARGE_BUFFER = 20971520
K_ROUND_LARGE = 2097152


def round_size(size: int) -> int:
    """`round_size`: at least kMinBlockSize, a multiple of it."""
    if size < K_MIN_BLOCK_SIZE:
        return K_MIN_BLOCK_SIZE
    return K_MIN_BLOCK_SIZE * ((size + K_MIN_BLOCK_SIZE - 1) // K_MIN_BLOCK_SIZE)


def allocation_size(size: int) -> int:
    """`get_allocation_size`: the segment cudaMalloc'd for a rounded request no cached block fits."""
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return K_ROUND_LARGE * ((size + K_ROUND_LARGE - 1) // K_ROUND_LARGE)


@dataclass(eq=False)
class Block:
    size: int
    addr: int
    small: bool
    allocated: bool = False
    prev: "Block | None" = None
    next: "Block | None" = None

    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None


class OutOfMemory(Exception):
    pass


@dataclass
class Allocator:
    capacity: int | None = None          # bytes the allocator may reserve; None: cudaMalloc never fails
    allocated: int = 0
    reserved: int = 0
    peak_allocated: int = 0
    peak_reserved: int = 0
    segments: int = 0
    cuda_mallocs: int = 0
    retries: int = 0                     # release_cached_blocks calls (cudaMalloc failed once)
    _next_addr: int = 0
    _pools: dict = field(default_factory=lambda: {True: [], False: []})   # small? -> sorted [(size, addr, block)]
    _live: dict = field(default_factory=dict)                             # id -> Block

    # the pools: std::set<Block*> ordered by (size, address) (one stream)
    def _insert(self, block: Block) -> None:
        bisect.insort(self._pools[block.small], (block.size, block.addr, id(block), block))

    def _erase(self, block: Block) -> None:
        pool = self._pools[block.small]
        i = bisect.bisect_left(pool, (block.size, block.addr, id(block)))
        assert pool[i][3] is block
        del pool[i]

    def _get_free_block(self, size: int, small: bool) -> Block | None:
        pool = self._pools[small]
        i = bisect.bisect_left(pool, (size,))
        if i == len(pool):
            return None
        block = pool[i][3]
        del pool[i]
        return block

    def _cuda_malloc(self, nbytes: int, small: bool) -> Block | None:
        if self.capacity is not None and self.reserved + nbytes > self.capacity:
            return None
        block = Block(nbytes, self._next_addr, small)
        self._next_addr += nbytes
        self.reserved += nbytes
        self.segments += 1
        self.cuda_mallocs += 1
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        return block

    def _release_cached_blocks(self) -> None:
        """`release_blocks` on both pools: cudaFree every free block that is a whole segment."""
        for small in (False, True):
            for entry in list(self._pools[small]):
                block = entry[3]
                if not block.is_split():
                    self._erase(block)
                    self.reserved -= block.size
                    self.segments -= 1

    def malloc(self, key, nbytes: int) -> None:
        if nbytes == 0:           # a zero-byte storage: the allocator is not called
            return
        assert key not in self._live, key
        size = round_size(nbytes)
        small = size <= K_SMALL_SIZE
        block = self._get_free_block(size, small)
        if block is None:
            alloc_size = allocation_size(size)
            block = self._cuda_malloc(alloc_size, small)
            if block is None:
                self.retries += 1
                self._release_cached_blocks()
                block = self._cuda_malloc(alloc_size, small)
                if block is None:
                    raise OutOfMemory(f"{nbytes} B: {self.allocated} allocated, {self.reserved} reserved")
        remaining = block.size - size
        if (remaining >= K_MIN_BLOCK_SIZE) if small else (remaining > K_SMALL_SIZE):   # should_split
            rest = Block(remaining, block.addr + size, small, prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            self._insert(rest)
        block.allocated = True
        self._live[key] = block
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)

    def free(self, key) -> None:
        block = self._live.pop(key, None)
        if block is None:         # a zero-byte storage
            return
        block.allocated = False
        self.allocated -= block.size
        for neighbour in (block.prev, block.next):          # try_merge_blocks
            if neighbour is None or neighbour.allocated:
                continue
            self._erase(neighbour)
            if neighbour is block.prev:
                block.addr = neighbour.addr
                block.prev = neighbour.prev
                if block.prev is not None:
                    block.prev.next = block
            else:
                block.next = neighbour.next
                if block.next is not None:
                    block.next.prev = block
            block.size += neighbour.size
        self._insert(block)


@dataclass(frozen=True)
class Replay:
    peak_allocated: int      # the allocator's allocated_bytes peak (block sizes: rounded, unsplit remainders in)
    peak_reserved: int       # the reserved_bytes peak: what NVML sees besides the context
    peak_requested: int      # the sum of the storages' own nbytes at its peak (MemTracker's figure)
    reserved_at_end: int
    segments: int
    retries: int


def replay(events, capacity: int | None = None) -> Replay:
    """Replay ("alloc", id, nbytes) / ("free", id) events in order."""
    allocator = Allocator(capacity=capacity)
    live = {}
    requested = peak_requested = 0
    for event in events:
        if event[0] == "alloc":
            _, key, nbytes = event
            allocator.malloc(key, nbytes)
            live[key] = nbytes
            requested += nbytes
            peak_requested = max(peak_requested, requested)
        elif event[0] == "free":
            allocator.free(event[1])
            requested -= live.pop(event[1])
        else:
            raise ValueError(f"unknown event {event!r}")
    return Replay(allocator.peak_allocated, allocator.peak_reserved, peak_requested, allocator.reserved,
                  allocator.segments, allocator.retries)
