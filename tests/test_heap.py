"""The extension's Heap on the simulated device: exact byte counts after
known sequences, each policy step with its counter, every bad input, and a
seeded random sequence of a million operations."""
import functools
import random

import pytest

import vramguard

# These tests are about the segments policy's own mechanics (segments
# reserved, split, coalesced, shrunk, released), not the default's.
Heap = functools.partial(vramguard.Heap, policy="segments")

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


def test_rounding_and_small_split():
    heap = Heap(GiB)
    a = heap.malloc(1000)
    s = heap.stats()
    assert s["requested_bytes.all.current"] == 1000
    assert s["allocated_bytes.small_pool.current"] == 1024
    assert s["reserved_bytes.small_pool.current"] == 2 * MiB
    assert s["reserved_bytes.large_pool.current"] == 0
    assert s["segment.all.current"] == 1
    assert s["num_splits"] == 1
    assert heap.block_size(a) == 1024
    assert vramguard.round_size(1) == 512 and vramguard.round_size(513) == 1024
    heap.check()


def test_coalesce_restores_one_idle_segment():
    heap = Heap(GiB)
    a, b, c = heap.malloc(1024), heap.malloc(1024), heap.malloc(4096)
    assert (b - a, c - b) == (1024, 1024)
    heap.free(b)
    s = heap.stats()
    assert s["fragmentation.free_blocks"] == 2
    assert s["fragmentation.free_bytes"] == 2 * MiB - 1024 - 4096
    assert s["fragmentation.largest_free_block"] == 2 * MiB - 2048 - 4096
    assert heap.malloc(600) == b  # best fit takes the hole
    for p in (b, a, c):
        heap.free(p)
    s = heap.stats()
    assert s["num_merges"] == s["num_splits"]
    assert s["fragmentation.free_blocks"] == 1
    assert s["fragmentation.largest_free_block"] == 2 * MiB
    segs = heap.segments()
    assert len(segs) == 1 and segs[0]["blocks"] == [
        {"address": a, "size": 2 * MiB, "requested": 0, "state": "free"}
    ]
    heap.check()


def test_large_requests_share_packed_segments_then_get_their_own():
    heap = Heap(GiB)
    a = heap.malloc(3 * MiB)
    b = heap.malloc(3 * MiB)
    assert b == a + 3 * MiB  # a 6 MiB segment packed for two
    heap.malloc(15 * MiB + 1)
    s = heap.stats()
    assert s["reserved_bytes.large_pool.current"] == 6 * MiB + 16 * MiB
    assert s["allocated_bytes.large_pool.current"] == 6 * MiB + 16 * MiB  # sub-MiB remainder kept
    assert s["requested_bytes.large_pool.current"] == 6 * MiB + 15 * MiB + 1
    assert s["num_device_alloc"] == 2
    heap.check()


def test_reuse_only_on_the_same_stream():
    heap = Heap(GiB)
    a = heap.malloc(64 * MiB, stream=1)
    heap.free(a)
    b = heap.malloc(64 * MiB, stream=2)
    assert b != a
    assert heap.malloc(64 * MiB, stream=1) == a
    s = heap.stats()
    assert (s["num_cache_hits"], s["num_cache_misses"]) == (1, 2)
    segs = {seg["address"]: seg["stream"] for seg in heap.segments()}
    assert segs == {a: 1, b: 2}


def test_record_stream_defers_reuse_until_the_stream_finishes():
    heap = Heap(GiB)
    a = heap.malloc(64 * MiB, stream=1)
    heap.record_stream(a, 7)
    heap.free(a)
    s = heap.stats()
    assert s["allocated_bytes.all.current"] == 0
    assert s["active_bytes.all.current"] == 64 * MiB
    assert s["num_deferred_frees"] == 1
    assert s["fragmentation.pending_blocks"] == 1
    assert heap.segments()[0]["blocks"][0]["state"] == "pending"
    b = heap.malloc(64 * MiB, stream=1)
    assert b != a
    heap.free(b)
    heap.complete_stream(7)
    assert heap.malloc(64 * MiB, stream=1) in (a, b)
    assert heap.stats()["active_bytes.all.current"] == 64 * MiB
    heap.check()


def test_budget_shrinks_the_segment_then_refuses():
    heap = Heap(GiB, budget=4 * MiB)
    a = heap.malloc(3 * MiB)
    s = heap.stats()
    assert s["reserved_bytes.all.current"] == 4 * MiB
    assert s["num_shrunk_segments"] == 1 and s["num_budget_refusals"] == 1
    with pytest.raises(MemoryError) as err:
        heap.malloc(3 * MiB)
    e = err.value
    assert str(e).startswith("Simulated device out of memory. Tried to allocate 3.00 MiB.")
    assert "budget is 4.00 MiB" in str(e)
    assert e.requested_bytes == 3 * MiB and e.rounded_bytes == 3 * MiB
    assert e.budget_bytes == 4 * MiB and e.budget_refused is True
    assert e.reserved_bytes == 4 * MiB and e.allocated_bytes == 4 * MiB  # remainder kept in the block
    assert e.largest_free_block == 0 and e.free_blocks == 0
    assert e.device_total == GiB and e.device_free == GiB - 4 * MiB
    assert heap.stats()["num_ooms"] == 1
    heap.free(a)  # still usable after the OOM
    assert heap.malloc(3 * MiB) == a
    heap.check()


def test_release_same_stream_then_retry():
    heap = Heap(GiB, budget=40 * MiB)
    heap.free(heap.malloc(12 * MiB, stream=1))
    heap.malloc(30 * MiB, stream=1)
    s = heap.stats()
    assert s["num_stream_releases"] == 1
    assert s["num_alloc_retries"] == 1
    assert s["num_sync_all_streams"] == 0
    assert s["reserved_bytes.all.current"] == 30 * MiB


def test_sync_and_release_everything_then_retry():
    heap = Heap(GiB, budget=40 * MiB)
    heap.free(heap.malloc(30 * MiB, stream=1))
    heap.malloc(30 * MiB, stream=2)
    s = heap.stats()
    assert s["num_stream_releases"] == 0
    assert s["num_sync_all_streams"] == 1
    assert s["num_sync_releases"] == 1
    assert s["num_alloc_retries"] == 1
    assert s["num_device_free"] == 1


def test_gc_threshold_releases_the_oldest_idle_segment():
    heap = Heap(GiB, budget=100 * MiB, gc_threshold=0.5)
    a = heap.malloc(20 * MiB, stream=1)
    b = heap.malloc(20 * MiB, stream=2)
    heap.free(a)
    heap.free(b)
    heap.malloc(20 * MiB, stream=3)
    s = heap.stats()
    assert s["num_gc_releases"] == 1
    assert s["reserved_bytes.all.current"] == 40 * MiB
    assert heap.malloc(20 * MiB, stream=2) == b
    assert heap.gc_threshold == 0.5


def test_empty_cache_counts_and_returns_bytes():
    heap = Heap(GiB)
    ptrs = [heap.malloc(n) for n in (1000, 3 * MiB, 40 * MiB)]
    keep = heap.malloc(1000)
    for p in ptrs:
        heap.free(p)
    released = heap.empty_cache()
    assert released == 6 * MiB + 40 * MiB  # the small segment still holds `keep`
    s = heap.stats()
    assert s["reserved_bytes.all.current"] == 2 * MiB
    assert s["num_empty_cache"] == 1 and s["num_empty_cache_releases"] == 2
    heap.free(keep)
    assert heap.empty_cache() == 2 * MiB


def test_lowering_the_budget_releases_idle_segments():
    heap = Heap(GiB)
    a = heap.malloc(30 * MiB)
    heap.malloc(30 * MiB)
    heap.free(a)
    heap.budget = 40 * MiB
    assert heap.budget == 40 * MiB
    s = heap.stats()
    assert s["reserved_bytes.all.current"] == 30 * MiB
    assert s["num_budget_releases"] == 1
    heap.budget = None
    assert heap.budget is None


def test_reset_peaks_keeps_current_values():
    heap = Heap(GiB)
    a = heap.malloc(50 * MiB)
    b = heap.malloc(1000)
    heap.free(a)
    heap.reset_peaks()
    s = heap.stats()
    assert s["allocated_bytes.all.peak"] == s["allocated_bytes.all.current"] == 1024
    assert s["allocated_bytes.all.allocated"] == 50 * MiB + 1024
    heap.free(b)


def test_device_fault_injection_is_ridden_over():
    heap = Heap(GiB)
    heap.fail_nth(1)
    p = heap.malloc(5 * MiB)
    s = heap.stats()
    assert s["num_device_alloc_failed"] == 1 and s["num_ooms"] == 0
    heap.free(p)
    heap.fail_random(1.0, 3)
    with pytest.raises(MemoryError):
        heap.malloc(500 * MiB)
    heap.fail_random(0.0)
    heap.malloc(500 * MiB)


def test_histogram_counts_live_blocks_per_class():
    heap = Heap(GiB)
    ptrs = [heap.malloc(1000) for _ in range(4)] + [heap.malloc(30 * MiB)]
    hist = heap.histogram()
    assert hist[0] == (1024, 4)
    assert len(hist) == 2 and hist[1][1] == 1 and hist[1][0] <= 30 * MiB
    for p in ptrs:
        heap.free(p)
    assert heap.histogram() == []


def test_stats_use_torch_key_names():
    s = Heap(GiB).stats()
    for key in (
        "allocated_bytes.all.current", "allocated_bytes.all.peak", "allocated_bytes.small_pool.allocated",
        "reserved_bytes.large_pool.peak", "reserved_bytes.all.freed", "requested_bytes.all.current",
        "active_bytes.all.current", "allocation.all.current", "segment.all.current", "active.all.peak",
        "num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free", "num_sync_all_streams",
    ):
        assert key in s, key
    assert s["device_total_bytes"] == GiB


# ---------------------------------------------------------------- bad input


def test_free_of_zero_is_a_no_op_and_malloc_zero_returns_zero():
    heap = Heap(GiB)
    heap.free(0)
    assert heap.malloc(0) == 0
    s = heap.stats()
    assert s["num_zero_allocs"] == 1 and s["reserved_bytes.all.current"] == 0


def test_unknown_double_and_interior_frees_raise_and_change_nothing():
    heap = Heap(GiB)
    a = heap.malloc(4096)
    before = heap.stats()
    for bad in (a + 512, 0xDEADBEEF000, 2**64 - 512):
        with pytest.raises(ValueError, match="not a live block"):
            heap.free(bad)
    heap.free(a)
    with pytest.raises(ValueError, match="already freed"):
        heap.free(a)
    with pytest.raises(ValueError, match="not a live block"):
        heap.record_stream(a, 3)
    after = heap.stats()
    assert after["num_invalid_frees"] == 4
    assert after["reserved_bytes.all.current"] == before["reserved_bytes.all.current"]
    heap.check()


@pytest.mark.parametrize(
    "size, error",
    [(-1, ValueError), (2**64, ValueError), (1.5, TypeError), ("1", TypeError), (None, TypeError)],
)
def test_bad_sizes(size, error):
    heap = Heap(GiB)
    with pytest.raises(error):
        heap.malloc(size)
    heap.check()


@pytest.mark.parametrize("size", [2**64 - 1, 2**63, 2**47 + 1, 2 * GiB])
def test_huge_sizes_are_an_oom_not_an_overflow(size):
    heap = Heap(GiB)
    with pytest.raises(MemoryError, match="Tried to allocate"):
        heap.malloc(size)
    assert heap.stats()["num_ooms"] == 1
    heap.check()


def test_oom_message_names_an_impossible_request():
    with pytest.raises(MemoryError) as err:
        Heap(GiB).malloc(2**64 - 1)
    assert "larger than any device can hold" in str(err.value)
    with pytest.raises(MemoryError) as err:
        Heap(GiB).malloc(2 * GiB)
    assert "larger than the whole device" in str(err.value)


def test_oom_message_names_fragmentation():
    heap = Heap(GiB, budget=40 * MiB)
    ptrs = [heap.malloc(5 * MiB) for _ in range(8)]  # two 20 MiB segments (4 x 5 MiB)
    for p in ptrs[::2]:
        heap.free(p)  # 20 MiB free in 5 MiB holes
    with pytest.raises(MemoryError) as err:
        heap.malloc(8 * MiB)
    assert "fragmentation" in str(err.value)
    assert err.value.free_bytes == 20 * MiB and err.value.largest_free_block == 5 * MiB


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"capacity": 0}, ValueError),
        ({"capacity": -5}, ValueError),
        ({"capacity": "lots"}, ValueError),
        ({"capacity": [1]}, TypeError),
        ({"capacity": GiB, "budget": 0}, ValueError),
        ({"capacity": GiB, "budget": -1}, ValueError),
        ({"capacity": GiB, "gc_threshold": 1.5}, ValueError),
        ({"capacity": GiB, "gc_threshold": 0}, ValueError),
        ({"capacity": GiB, "gc_threshold": "half"}, TypeError),
        ({"capacity": GiB, "policy": "fastest"}, ValueError),
    ],
)
def test_bad_constructor_arguments(kwargs, error):
    with pytest.raises(error):
        Heap(**kwargs)


def test_bad_settings_and_sim_controls():
    heap = Heap(GiB)
    with pytest.raises(ValueError):
        heap.budget = 0
    with pytest.raises(ValueError):
        heap.gc_threshold = 2.0
    with pytest.raises(ValueError):
        heap.fail_random(1.5)
    with pytest.raises(ValueError):
        heap.complete_stream(-1)
    assert heap.budget is None and heap.gc_threshold is None


# ---------------------------------------------------------------- random


def test_a_million_random_operations_keep_every_invariant():
    rng = random.Random(20261121)
    heap = Heap(8 * GiB, budget=6 * GiB)
    live = []
    ooms = 0
    sizes = [
        lambda: rng.randint(1, 64 * KiB),
        lambda: rng.randint(1, MiB),
        lambda: rng.randint(MiB, 16 * MiB),
        lambda: rng.randint(16 * MiB, 128 * MiB),
    ]
    weights = [50, 20, 20, 10]
    malloc, free, record = heap.malloc, heap.free, heap.record_stream
    for i in range(1_000_000):
        r = rng.random()
        if live and (r < 0.5 or len(live) > 800):
            p = live.pop(rng.randrange(len(live)))
            if r < 0.05:
                record(p, 10 + (i % 3))
            free(p)
        else:
            size = rng.choices(sizes, weights)[0]()
            try:
                live.append(malloc(size, i % 4))
            except MemoryError:
                ooms += 1
        if i % 997 == 0:
            heap.complete_stream(10 + (i % 3))
        if i % 50_000 == 0:
            heap.check()
    s = heap.stats()
    assert s["num_ooms"] == ooms
    assert s["reserved_bytes.all.peak"] <= 6 * GiB
    print(
        f"\n1M ops: {s['allocation.all.allocated']} allocs, hits {s['num_cache_hits']}, "
        f"misses {s['num_cache_misses']}, splits {s['num_splits']}, merges {s['num_merges']}, "
        f"device allocs {s['num_device_alloc']}, frees {s['num_device_free']}, retries "
        f"{s['num_alloc_retries']}, ooms {ooms}, deferred {s['num_deferred_frees']}, peak reserved "
        f"{vramguard.format_size(s['reserved_bytes.all.peak'])}, peak allocated "
        f"{vramguard.format_size(s['allocated_bytes.all.peak'])}"
    )
    for p in live:
        free(p)
    heap.synchronize()
    heap.empty_cache()
    s = heap.stats()
    assert s["allocated_bytes.all.current"] == 0
    assert s["active.all.current"] == 0
    assert s["reserved_bytes.all.current"] == 0
    assert s["requested_bytes.all.allocated"] == s["requested_bytes.all.freed"]
    heap.check()
