"""A CUDA graph whose capture fails at its end.

PyTorch before 2.15 tells the allocator that allocation to a graph's pool
is over (endAllocateToPool) only after cudaStreamEndCapture succeeds. When
the capture fails there (a synchronize or another call a capture refuses,
then capture_end raises cudaErrorStreamCaptureInvalidated), the allocator
is left counting a capture as underway for the rest of the process: its
frees wait for events it may not query, empty_cache releases nothing, and
the pool's filter is asked about every later allocation. PyTorch's own
allocator keeps the same stale begin. install() ends it, through PyTorch's
own call, when capture_end raises with the graph's pool still begun; where
PyTorch has ended it already (2.15), nothing is done.

The graph's pool is known only after a successful capture (pool() raises
otherwise), so capture_begin notes which pool its begin opened."""
import functools

from .. import _core


def end_pool_after_failed_capture(torch):
    """Wraps torch.cuda.graphs.CUDAGraph's capture_begin and capture_end, once."""
    cls = getattr(getattr(torch.cuda, "graphs", None), "CUDAGraph", None)
    end = getattr(torch._C, "_cuda_endAllocateToPool", None)
    if cls is None or end is None or getattr(cls.capture_end, "_vramguard", False):
        return
    begin_original, end_original = cls.capture_begin, cls.capture_end

    @functools.wraps(begin_original)
    def capture_begin(self, *args, **kwargs):
        before = _begun()
        result = begin_original(self, *args, **kwargs)
        opened = [key for key, n in _begun().items() if n > before.get(key, 0)]
        # Two captures begun at once in two threads: which is whose is unknown.
        self._vramguard_begun = opened[0] if len(opened) == 1 else None
        return result

    @functools.wraps(end_original)
    def capture_end(self):
        try:
            return end_original(self)
        except BaseException:
            begun = getattr(self, "_vramguard_begun", None)
            if begun is not None and _begun().get(begun, 0) > 0:
                device, pool = begun
                end(device, pool)
            raise
        finally:
            self._vramguard_begun = None

    capture_begin._vramguard = capture_end._vramguard = True
    cls.capture_begin, cls.capture_end = capture_begin, capture_end


def _begun():
    """{(device, pool id): begins not yet ended}."""
    return {(p["device"], tuple(p["id"])): p["begun"] for p in _core.private_pools()}
