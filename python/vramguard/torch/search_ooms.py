"""The out-of-memory errors vramguard's own searches raised, per device:
find_max_batch's tries that ran out. The device's counters count them
(num_ooms, as PyTorch's would: each was raised), and the summary says how
many of its out-of-memory errors were the search's, so that a user does
not read them as their program's. A reset of the accumulated stats
(torch.cuda.reset_accumulated_memory_stats) clears them with num_ooms."""
import threading

__all__ = ["note", "count", "clear"]

_lock = threading.Lock()
_counts = {}  # device index -> out-of-memory errors a search raised


def note(device, n):
    if n > 0:
        with _lock:
            _counts[device] = _counts.get(device, 0) + n


def count(device):
    with _lock:
        return _counts.get(device, 0)


def clear(device):
    with _lock:
        _counts.pop(device, None)
