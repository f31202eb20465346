"""vramguard: a caching allocator for GPU memory that explains itself.

With PyTorch and a GPU, before anything touches the GPU:
    vramguard.install(budget="T4")      # or "15GiB"; presets: vramguard.PRESETS
    ...train...
    print(vramguard.summary())

On any machine:
    heap = vramguard.Heap(15 * 2**30)       # a simulated 15 GiB device
    p = heap.malloc(1 << 20); heap.free(p)
    print(vramguard.format_summary(heap.stats()))
"""
from ._core import Heap, format_size, round_size
from ._demo import example_trace
from ._dryrun import DryRunResult, dryrun
from ._find_batch import BatchSearch, find_max_batch
from ._import import load_trace
from ._ipython import meter
from ._oom_report import OOMReport, last_oom
from ._plot import plot
from ._regions import LeakWarning, leak_check, regions, reset_regions, step, track
from ._presets import PRESETS, GpuPreset
from ._recover import Recovered, recover
from ._record import record, start_recording, stop_recording
from ._snapshot import dump_snapshot, snapshot
from . import integrations  # its callbacks import their libraries only when asked for
from ._report import available_policies
from ._replay import FirstOOM, LiveSet, ReplayResult, live_at_peak, min_budget, replay
from ._stacks import MAX_STACK_DEPTH, StackTable, format_frame, live_by_line
from ._summary import format_summary
from ._torch import (
    VramguardError, empty_cache, install, is_installed, is_oom, reset_peaks, stats, summary,
)
from ._trace import Trace, TraceFormatError, save_trace
from ._units import parse_budget, parse_size

__version__ = "0.1.0"

__all__ = [
    "VramguardError", "empty_cache", "install", "is_installed", "is_oom", "reset_peaks", "stats",
    "summary",
    "BatchSearch", "Recovered", "find_max_batch", "meter", "recover",
    "FirstOOM", "GpuPreset", "Heap", "LiveSet", "PRESETS", "ReplayResult", "Trace", "TraceFormatError",
    "example_trace", "format_size", "format_summary", "live_at_peak", "load_trace", "min_budget", "parse_budget",
    "parse_size", "plot", "record", "replay", "round_size", "save_trace", "start_recording", "stop_recording",
    "dump_snapshot", "snapshot",
    "MAX_STACK_DEPTH", "StackTable", "format_frame", "live_by_line",
    "LeakWarning", "OOMReport", "last_oom", "leak_check", "regions", "reset_regions", "step", "track",
    "available_policies", "DryRunResult", "dryrun",
]
