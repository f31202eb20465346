"""Small hand-made traces the tests share."""
from vramguard import Trace

MiB = 1 << 20


# Two streams, a small and two large allocations, an empty_cache and a
# synchronize: every op kind, in 8 ops.
def small_trace():
    t = Trace("small")
    a = t.alloc(1000, stream=0)
    b = t.alloc(3 * MiB, stream=1)
    t.free(a)
    c = t.alloc(100 * MiB)
    t.empty_cache()
    t.free(b)
    t.free(c)
    t.synchronize()
    return t
