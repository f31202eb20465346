"""PeakProbe: a peak of allocated bytes over a stretch of code that no
report shows, for the cell meter (notebook/ipython.py) and find_max_batch
(notebook/find_batch.py)."""
from .tracked_heaps import RegionFrame, tracked_heap

__all__ = ["PeakProbe"]


class PeakProbe:
    """A peak of allocated bytes over a stretch of code, as a region keeps
    one, but invisible: no row in regions(), not among its open regions nor
    the OOM report's. For the cell meter and find_max_batch, which must not
    reset the peaks torch.cuda.max_memory_allocated() reports. close() it:
    an open probe costs every region boundary a compare."""

    def __init__(self, device=None):
        self._target = tracked_heap(device)
        with self._target.lock:
            self._frame = RegionFrame("<probe>", self._target.fold(), shown=False)
            self._target.open.append(self._frame)
        self.live_at_start = self._frame.live_at_entry

    def close(self):
        """(peak, live now); the probe stops following the heap."""
        target, frame = self._target, self._frame
        with target.lock:
            live = target.fold()
            if frame in target.open:
                target.open.remove(frame)
        return frame.peak, live
