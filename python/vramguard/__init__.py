"""vramguard: a caching allocator for GPU memory that explains itself.

On any machine:
    heap = vramguard.Heap(15 * 2**30)       # a simulated 15 GiB device
    p = heap.malloc(1 << 20); heap.free(p)
    print(vramguard.format_summary(heap.stats()))
"""
from ._core import Heap, format_size, round_size
from ._summary import format_summary
from ._units import parse_size

__version__ = "0.1.0"

__all__ = ["Heap", "format_size", "format_summary", "parse_size", "round_size"]
