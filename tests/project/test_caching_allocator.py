"""tests/support/caching_allocator.py: the CUDA caching allocator's reserve on hand-made event lists, each figure
derived by hand from the allocator's rules (the module's docstring cites them)."""

from __future__ import annotations

import pytest
from caching_allocator import OutOfMemory, replay

MiB = 1048576


def alloc(key, nbytes):
    return ("alloc", key, nbytes)


def free(key):
    return ("free", key)


def test_a_request_between_1_and_10_mib_reserves_a_20_mib_segment():
    r = replay([alloc("a", 3 * MiB // 2)])
    assert (r.peak_allocated, r.peak_reserved, r.segments) == (3 * MiB // 2, 20 * MiB, 1)


def test_two_6_mib_blocks_share_one_segment():
    # the first splits the 20 MiB segment (14 MiB left, > 1 MiB); the second is cut from that remainder
    r = replay([alloc("a", 6 * MiB), alloc("b", 6 * MiB)])
    assert (r.peak_allocated, r.peak_reserved, r.segments) == (12 * MiB, 20 * MiB, 1)
    # a fourth 6 MiB block does not fit the 2 MiB left after three: a second segment
    r = replay([alloc(k, 6 * MiB) for k in "abcd"])
    assert (r.peak_allocated, r.peak_reserved, r.segments) == (24 * MiB, 40 * MiB, 2)


def test_a_freed_segment_is_reused_not_reserved_again():
    r = replay([alloc("a", 20 * MiB), free("a"), alloc("b", 20 * MiB), free("b"), alloc("c", 15 * MiB)])
    assert (r.peak_reserved, r.segments, r.reserved_at_end) == (20 * MiB, 1, 20 * MiB)


def test_large_requests_round_to_2_mib_and_a_remainder_of_1_mib_is_not_split():
    # 19.5 MiB: a 20 MiB segment; the 0.5 MiB left is not > 1 MiB, so the whole block is allocated
    r = replay([alloc("a", 39 * MiB // 2)])
    assert (r.peak_requested, r.peak_allocated, r.peak_reserved) == (39 * MiB // 2, 20 * MiB, 20 * MiB)
    # 11 MiB + 1 B: rounded to 512 B, then to a 12 MiB segment; 1 MiB - 512 B left: not split
    r = replay([alloc("a", 11 * MiB + 1)])
    assert (r.peak_allocated, r.peak_reserved) == (12 * MiB, 12 * MiB)


def test_small_requests_round_to_512_and_pack_into_2_mib_segments():
    r = replay([alloc(i, 100) for i in range(4096)])           # 4096 x 512 B = exactly one 2 MiB segment
    assert (r.peak_requested, r.peak_allocated, r.peak_reserved, r.segments) == (409600, 2 * MiB, 2 * MiB, 1)
    r = replay([alloc(i, 100) for i in range(4097)])
    assert (r.peak_reserved, r.segments) == (4 * MiB, 2)
    # the small pool and the large pool do not share: a 1 MiB + 1 B request does not use a small segment's room
    r = replay([alloc("s", 512), alloc("l", MiB + 1)])
    assert r.peak_reserved == 22 * MiB


def test_best_fit_takes_the_smallest_free_block_that_fits():
    # free blocks of 30 and 12 MiB (two segments); a 12 MiB request takes the 12 MiB one, so a 30 MiB request
    # still fits without a new segment
    events = [alloc("a", 30 * MiB), alloc("b", 12 * MiB), free("a"), free("b"), alloc("c", 12 * MiB),
              alloc("d", 30 * MiB)]
    r = replay(events)
    assert (r.peak_reserved, r.segments) == (42 * MiB, 2)


def test_a_freed_block_too_small_for_a_later_request_stays_reserved():
    # 12 MiB freed, 14 MiB asked: a second segment; 26 MiB reserved for 14 MiB allocated
    r = replay([alloc("a", 12 * MiB), free("a"), alloc("b", 14 * MiB)])
    assert (r.peak_allocated, r.peak_reserved, r.reserved_at_end) == (14 * MiB, 26 * MiB, 26 * MiB)


def test_freed_neighbours_merge_within_a_segment():
    # two 6 MiB blocks and the 8 MiB remainder merge back into the whole 20 MiB block, which a 19 MiB request takes
    events = [alloc("a", 6 * MiB), alloc("b", 6 * MiB), free("a"), free("b"), alloc("c", 19 * MiB)]
    r = replay(events)
    assert (r.peak_reserved, r.segments) == (20 * MiB, 1)
    # freed in the other order (b first: merges with the remainder; then a: with both)
    events = [alloc("a", 6 * MiB), alloc("b", 6 * MiB), free("b"), free("a"), alloc("c", 19 * MiB)]
    assert replay(events).peak_reserved == 20 * MiB
    # while a is held, b's 6 MiB and the 8 MiB remainder merge into 14 MiB: too small for 19 MiB
    events = [alloc("a", 6 * MiB), alloc("b", 6 * MiB), free("b"), alloc("c", 19 * MiB)]
    assert replay(events).peak_reserved == 40 * MiB


def test_cached_segments_are_released_only_when_cudamalloc_fails():
    events = [alloc("a", 20 * MiB), free("a"), alloc("b", 24 * MiB)]
    assert (replay(events).peak_reserved, replay(events).retries) == (44 * MiB, 0)
    r = replay(events, capacity=30 * MiB)    # 20 + 24 > 30: the whole free 20 MiB segment is cudaFreed, then 24 fits
    assert (r.peak_reserved, r.reserved_at_end, r.retries) == (24 * MiB, 24 * MiB, 1)
    # a split segment (part of it in use) is not released: out of memory
    events = [alloc("a", 12 * MiB), alloc("k", 6 * MiB), free("a"), alloc("b", 24 * MiB)]
    with pytest.raises(OutOfMemory):
        replay(events, capacity=40 * MiB)
