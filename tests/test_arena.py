"""The arena through Heap(policy="arena") on the simulated device: mapped
bytes after known sequences, the stats keys and summary in its terms, the
OOM it raises, the fallback to segments, policy names, and replays."""
import json
import random
import subprocess
import sys
import textwrap

import pytest

import vramguard
from vramguard import Heap, Trace, min_budget, replay

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


def test_policy_names():
    assert Heap(GiB, policy="arena").policy == "arena"
    assert Heap(GiB, policy="segments").policy == "segments"
    assert Heap(GiB, policy="torch").policy == "torch"
    assert Heap(GiB, policy="vramguard").policy == Heap(GiB).policy
    with pytest.raises(ValueError, match="'arena', 'segments' or 'torch'"):
        Heap(GiB, policy="expandable")


def test_arena_runs_where_the_device_has_pages():
    assert Heap(GiB, policy="arena").uses_arena is True
    assert Heap(GiB, policy="segments").uses_arena is False
    fallback = Heap(GiB, policy="arena", page_size=0)
    assert fallback.uses_arena is False
    p = fallback.malloc(3 * MiB)
    s = fallback.stats()
    assert s["arena"] is False and s["num_maps"] == 0 and s["num_device_alloc"] == 1
    fallback.free(p)
    fallback.check()


@pytest.mark.parametrize("page", [3 * MiB, 4 * MiB, 100, -1, "2MiB2"])
def test_bad_page_sizes_are_refused(page):
    with pytest.raises((ValueError, TypeError)):
        Heap(GiB, policy="arena", page_size=page)


def test_free_in_the_middle_then_bigger_reuses_the_merged_range():
    h = Heap(GiB, policy="arena")
    a, b, c = (h.malloc(3 * MiB) for _ in range(3))
    assert (b - a, c - b) == (3 * MiB, 3 * MiB)
    s = h.stats()
    assert s["reserved_bytes.all.current"] == 10 * MiB  # pages 0..4
    assert s["num_maps"] == 3 and s["num_mapped_pages"] == 5
    assert s["segment.all.current"] == 1 and s["num_range_reserves"] == 1
    h.free(a)
    h.free(b)
    assert h.malloc(6 * MiB) == a
    s = h.stats()
    assert s["reserved_bytes.all.current"] == 10 * MiB and s["num_maps"] == 3
    h.check()


def test_empty_cache_unmaps_whole_free_pages_only():
    h = Heap(GiB, policy="arena")
    a = h.malloc(MiB + 512)
    b = h.malloc(MiB + 512)  # shares page 0 with a
    h.free(a)
    assert h.empty_cache() == 0
    h.free(b)
    assert h.empty_cache() == 4 * MiB
    s = h.stats()
    assert s["reserved_bytes.all.current"] == 0
    assert s["num_unmaps"] == 1 and s["num_unmapped_pages"] == 2 and s["num_unmap_syncs"] == 1
    assert s["segment.all.current"] == 0 and s["num_range_releases"] == 1
    h.check()



def test_free_pieces_are_the_mapped_stretches_of_free_blocks():
    """fragmentation.free_blocks counts the pieces cached free memory is
    in: an unmapped stretch of a free block holds none, and a free block
    with a hole unmapped in its middle is two pieces."""
    h = Heap(GiB, policy="arena")
    kept = [h.malloc(2 * MiB) for _ in range(3)]  # pages 0-2, the rest of the range unmapped
    frag = {k: v for k, v in h.stats().items() if k.startswith("fragmentation.free")}
    assert frag == {"fragmentation.free_bytes": 0, "fragmentation.free_blocks": 0}
    h.free(kept.pop())
    assert h.empty_cache() == 2 * MiB  # the free tail is wholly unmapped again
    assert h.stats()["fragmentation.free_blocks"] == 0

    h = Heap(GiB, policy="arena")
    a, b, c = (h.malloc(3 * MiB) for _ in range(3))  # 0-9 MiB
    d = h.malloc(3 * MiB // 2)  # 9-10.5 MiB: pages 0-5 mapped
    h.free(b)
    h.free(c)  # one free block, 3-9 MiB
    assert h.empty_cache() == 4 * MiB  # pages 2 and 3 (4-8 MiB): the block keeps 3-4 and 8-9
    s = h.stats()
    assert s["fragmentation.free_bytes"] == 2 * MiB + 3 * MiB // 2
    assert s["fragmentation.free_blocks"] == 3  # 3-4, 8-9 and the tail's 10.5-12 MiB
    assert s["fragmentation.largest_free_block"] == 3 * MiB // 2
    for p in (a, d):
        h.free(p)
    h.check()

def test_budget_pressure_unmaps_and_synchronizes_once():
    h = Heap(GiB, budget=8 * MiB, policy="arena")
    a = h.malloc(3 * MiB)
    b = h.malloc(MiB + 512)
    h.free(a)
    c = h.malloc(4 * MiB, stream=9)
    s = h.stats()
    assert s["reserved_bytes.all.current"] == 8 * MiB
    assert s["num_unmaps"] == 1 and s["num_unmapped_pages"] == 1
    assert s["num_unmap_syncs"] == 1 and s["num_budget_refusals"] == 1
    for p in (b, c):
        h.free(p)
    h.check()


def test_oom_speaks_of_the_arena():
    h = Heap(4 * MiB, policy="arena")
    a = h.malloc(2 * MiB)
    b = h.malloc(2 * MiB)
    h.free(a)
    with pytest.raises(MemoryError) as err:
        h.malloc(6 * MiB)
    e = err.value
    assert e.arena is True and e.ranges == 1 and e.unmapped_bytes == 2 * MiB
    assert e.reserved_bytes == 2 * MiB and e.largest_free_range == 12 * MiB
    assert e.largest_allocatable == 2 * MiB  # the 4 MiB device, 2 MiB live
    assert ("arena: 2.00 MiB mapped in 1 range, 2.00 MiB unmapped so far; the largest block that could be "
            "allocated now is 2.00 MiB.") in str(e)
    assert "free range" not in str(e) and "12.00 MiB" not in str(e)
    h.free(b)
    h.check()


def test_an_oom_no_step_can_fit_comes_at_once():
    # 6 MiB live and 3 MiB asked pass the 8 MiB budget: straight to the last
    # step's unmapping (none: the cached page is the fit's), no retry
    h = Heap(GiB, budget=8 * MiB, policy="arena")
    a = h.malloc(6 * MiB)
    h.free(h.malloc(MiB + 512))
    with pytest.raises(MemoryError):
        h.malloc(3 * MiB)
    s = h.stats()
    assert s["num_ooms"] == 1 and s["num_oom_fast_fails"] == 1
    assert s["num_unmap_syncs"] == 0 and s["num_unmaps"] == 0 and s["num_alloc_retries"] == 0
    assert s["reserved_bytes.all.current"] == 8 * MiB
    assert "OOMs 1, at once 1" in vramguard.format_summary(s, verbose=True)
    assert "| So far: 1 out-of-memory error " in vramguard.format_summary(s)
    h.free(a)
    h.check()


def test_oom_report_counts_an_idle_ranges_mapped_bytes_only():
    # a device heap, as the installed allocator has: simulated devices are
    # set before first use, so in a fresh interpreter
    script = textwrap.dedent("""
        import json
        import vramguard
        from vramguard import _core
        GiB = 1 << 30
        _core.simulate_devices(GiB)
        _core.use_arena(True)
        h = _core.device_heap(0)
        try:
            h.malloc(2 * GiB)
        except MemoryError:
            pass
        r = vramguard.last_oom()
        print("@@" + json.dumps([_core.last_oom()["idle_segment_bytes"], r.available, r.short_by,
                                 str(r).splitlines()[1]]))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    idle, available, short_by, line = json.loads(proc.stdout.split("@@")[-1])
    assert (idle, available, short_by) == (0, GiB, GiB)  # the idle range has nothing mapped
    assert line == "Short by: 1.00 GiB (the most one request could have had: 1.00 GiB)"


def test_device_error_on_map_is_itself():
    h = Heap(GiB, policy="arena")
    h.fail_device(1)
    with pytest.raises(RuntimeError) as err:
        h.malloc(MiB)
    assert err.value.failed_call == "cuMemMap"
    s = h.stats()
    assert s["num_device_errors"] == 1 and s["num_ooms"] == 0
    h.check()


def test_steady_loop_maps_nothing_after_step_one():
    h = Heap(GiB, budget=300 * MiB, policy="arena")
    sizes = [3 * MiB, 700 * KiB, 12 * MiB + 512, 4 * KiB, 40 * MiB, 1536, 9 * MiB]

    def step():
        ptrs = [h.malloc(n, stream=i % 2) for i, n in enumerate(sizes)]
        for p in reversed(ptrs):
            h.free(p)

    step()
    first = h.stats()
    for _ in range(10):
        step()
    last = h.stats()
    assert last["num_maps"] == first["num_maps"] > 0
    assert last["num_unmaps"] == 0
    h.check()


def test_stats_and_summary_in_the_arenas_terms():
    h = Heap(GiB, policy="arena")
    p = h.malloc(5 * MiB)
    s = h.stats()
    assert s["arena"] is True and s["page_size"] == 2 * MiB
    assert s["fragmentation.free_bytes"] == MiB
    assert s["fragmentation.largest_free_block"] == MiB
    assert s["fragmentation.largest_free_range"] == 4 * GiB - 5 * MiB
    assert s["fragmentation.largest_allocatable"] == GiB - 6 * MiB  # the device less the mapped pages
    assert s["inactive_split_bytes.all.current"] == 0
    text = vramguard.format_summary(s)
    assert "Largest block that could be allocated now: 1018.00 MiB" in text
    assert "address space" not in text and "4.00 GiB" not in text
    assert "Mapped memory" in text and "Ranges" in text and "Non-releasable memory" not in text
    # the free MiB shares a page with live blocks: empty_cache() cannot unmap it
    assert "| Non-releasable (free bytes in pages with live tensors): 1.00 MiB " in text
    assert "Memory: arena, 2.00 MiB pages; 1 range reserved, 0 released" in text
    assert "maps 1 (3 pages), unmaps 0 (0 pages), syncs before unmapping 0" in vramguard.format_summary(s, verbose=True)
    assert "syncs before unmapping" not in text
    assert s["num_unmap_skips"] == 0 and "unmap batches cut short 0" in vramguard.format_summary(s, verbose=True)
    (seg,) = h.segments()
    assert (seg["size"], seg["mapped"], seg["allocated"]) == (4 * GiB, 6 * MiB, 5 * MiB)
    segments = vramguard.format_summary(Heap(GiB, policy="segments").stats(), verbose=True)
    assert "Memory: segments" in segments and "Reserved memory" in segments
    budgeted = Heap(GiB, budget=512 * MiB, policy="segments")
    budgeted.free(budgeted.malloc(100 * MiB))  # a wholly free segment, released for a request
    assert budgeted.stats()["fragmentation.largest_allocatable"] == 512 * MiB
    assert "Largest block that could be allocated now: 512.00 MiB" in vramguard.format_summary(budgeted.stats())
    h.free(p)


def test_seeded_random_sequence_holds_every_invariant():
    rng = random.Random(7)
    h = Heap(512 * MiB, budget=256 * MiB, gc_threshold=0.7, policy="arena")
    h.fail_random(0.02, 7)
    live = {}
    for i in range(3000):
        slot = rng.randrange(48)
        if slot in live:
            h.free(live.pop(slot))
        elif rng.random() < 0.02:
            h.empty_cache()
        else:
            size = rng.choice([rng.randrange(1, MiB), rng.randrange(MiB, 24 * MiB)])
            try:
                live[slot] = h.malloc(size, stream=rng.randrange(3))
            except MemoryError:
                pass
        if i % 50 == 0:
            h.check()
    for p in live.values():
        h.free(p)
    h.empty_cache()
    assert h.stats()["reserved_bytes.all.current"] == 0
    h.check()


def test_replay_and_min_budget_accept_the_arena():
    t = Trace("fragmenting")
    keep = []
    for i in range(8):  # 24 MiB blocks, every other freed, then a 48 MiB one
        keep.append(t.alloc(24 * MiB))
    for ident in keep[::2]:
        t.free(ident)
    t.alloc(48 * MiB)
    arena = min_budget(t, "arena")
    segments = min_budget(t, "segments")
    assert arena == t.peak_live() == 192 * MiB
    assert segments >= arena
    result = replay(t, policy="arena")
    # no budget, no pressure: the freed pages stay mapped, the 48 MiB maps more
    assert result.fits and result.peak_reserved_bytes == 240 * MiB
