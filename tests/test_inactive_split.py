"""inactive_split: free blocks that share their segment with others, the
memory empty_cache cannot give back. The heap keeps it as PyTorch's
allocator does (net changes when a block is taken or freed), so that
torch.cuda.memory_stats() shows the same numbers for the same sequence
(compared with the native allocator in tests/torch/test_torch_stats.py)."""
import functools

import vramguard

# These tests are about the segments policy's own mechanics (segments
# reserved, split, coalesced, shrunk, released), not the default's.
Heap = functools.partial(vramguard.Heap, policy="segments")

MiB = 1 << 20


def split_stats(heap, part):
    s = heap.stats()
    return (s[f"inactive_split.all.{part}"], s[f"inactive_split_bytes.all.{part}"],
            s[f"inactive_split.small_pool.{part}"], s[f"inactive_split.large_pool.{part}"])


def test_inactive_split_follows_pytorch():
    heap = Heap(1 << 30)
    a = heap.malloc(1000)              # a 2 MiB small segment: 1 KiB taken, the rest split off
    assert split_stats(heap, "current") == (1, 2 * MiB - 1024, 1, 0)
    b = heap.malloc(1000)              # from the remainder: it shrinks, still one block
    assert split_stats(heap, "current") == (1, 2 * MiB - 2048, 1, 0)
    heap.free(a)                       # a free block beside a live one
    assert split_stats(heap, "current") == (2, 2 * MiB - 1024, 2, 0)
    heap.check()
    heap.free(b)                       # everything merges: a whole segment, releasable
    assert split_stats(heap, "current") == (0, 0, 0, 0)
    assert split_stats(heap, "peak") == (2, 2 * MiB - 1024, 2, 0)
    assert split_stats(heap, "allocated") == (2, 2 * MiB, 2, 0)
    assert split_stats(heap, "freed") == (2, 2 * MiB, 2, 0)
    heap.check()


def test_whole_blocks_and_resets():
    heap = Heap(1 << 30)
    big = heap.malloc(20 * MiB)        # a segment of its own, nothing split off
    assert split_stats(heap, "current") == (0, 0, 0, 0)
    x = heap.malloc(3 * MiB)           # large pool: a packed segment, the rest split off
    s = heap.stats()
    seg = s["reserved_bytes.large_pool.current"] - 20 * MiB
    assert split_stats(heap, "current") == (1, seg - 3 * MiB, 0, 1)
    heap.reset_peaks()
    heap.reset_accumulated()
    assert split_stats(heap, "peak") == (1, seg - 3 * MiB, 0, 1)
    assert split_stats(heap, "allocated") == (0, 0, 0, 0)   # PyTorch's totals restart from 0
    assert split_stats(heap, "freed") == (0, 0, 0, 0)
    heap.free(x)
    heap.free(big)
    assert split_stats(heap, "current") == (0, 0, 0, 0)
    assert split_stats(heap, "freed") == (1, seg - 3 * MiB, 0, 1)
    heap.check()
