"""vramguard: a caching allocator for GPU memory that explains itself.

With PyTorch and a GPU, before anything touches the GPU:
    vramguard.install(budget="T4")      # or "15GiB"; presets: vramguard.PRESETS
    ...train...
    print(vramguard.summary())

On any machine:
    heap = vramguard.Heap(15 * 2**30)       # a simulated 15 GiB device
    p = heap.malloc(1 << 20); heap.free(p)
    print(vramguard.format_summary(heap.stats()))

The modules are in layers, each importing only those below it
(tests/test_layers.py): _core, _presets, _units; render/; torch/;
trace/; report/; notebook/; phantom/; then cli.py, integrations.py and
this module, which exports the public API.
"""
from ._core import Heap, format_size, round_size
from .report.demo import example_trace
from .dryrun import DryRunResult, dryrun
from .notebook.find_batch import BatchSearch, find_max_batch
from .trace.importer import load_trace
from .notebook.ipython import meter
from .report.oom import OOMReport, last_oom
from .report.plot import plot
from .report.regions import regions, reset_regions, track
from .report.steps import LeakWarning, leak_check, step
from ._presets import PRESETS, GpuPreset
from .notebook.recover import Recovered, recover
from .trace.record import record, start_recording, stop_recording
from .trace.snapshot import dump_snapshot, snapshot
from .trace import memory_history as _memory_history  # noqa: F401  (it registers torch.cuda's memory history stand-ins)
from . import integrations  # its callbacks import their libraries only when asked for
from .report.replay_report import available_policies
from .trace.replay import FirstOOM, LiveSet, ReplayResult, live_at_peak, min_budget, replay
from .trace.stacks import MAX_STACK_DEPTH, StackTable, format_frame, live_by_line
from .render.summary import format_summary
from .report.summary import summary
from .torch.install import (
    VramguardError, empty_cache, install, is_installed, is_oom, reset_peaks, stats,
)
from .trace.format import Trace, TraceFormatError, save_trace
from ._units import parse_budget, parse_size
from ._version import __version__


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
