"""vramguard.last_oom(): the report of the last out-of-memory the installed
allocator raised, on any device, with advice ranked by what its numbers show.

The C core keeps the failure's record (what was asked for, the budget, the
device's answer) and the heap's state copied under its lock right after
(counters, fragmentation, live blocks by power of two). This module reads
that copy, adds what Python knows (the regions open at the failure, the
step boundaries and any leak, the lines holding memory when stacks are
recorded, a batch-size fit when one was noted) and builds the report.

Figures, one definition each (the summary's names):
  Live: allocated bytes (live blocks, as rounded by the allocator).
  Reserved: bytes held from the device. Cached: reserved - live.
  Cached free: reserved minus active bytes (a block freed but still in use
    by a stream is not free), in free blocks.
  Cached free in pieces: 1 - largest free block / cached free.
  Non-releasable memory: free blocks in segments that hold live blocks.
  Room: what more could have been reserved: the limit (the budget, else the
    device) minus reserved, no more than the device said was free.
  Short by: the request minus the most one request could have had (the
    largest free block, or the room).
  Activations: what the failing step added: the least that a scope open at
    the failure (the step under way, each region) had added since its start,
    plus the request: what batch size, autocast, checkpointing and
    accumulation act on. The least, because every such scope holds the
    failure, and a wider one holds what earlier code made too (a tensor from
    two cells before is not this step's activations).

The advice, built from these figures and ranked, is oom_advice.py's; the
report as text and HTML is oom_text.py's; what is noted for the next report
as it happens (the regions an out-of-memory left, a batch fit) is
oom_notes.py's.
"""
import sys

from .. import _core
from ..render.advice import non_releasable
from . import oom_text
from .oom_advice import advise
from .oom_card import card_of
from .oom_measure import current_cell, ipython_shell
from .oom_frames import codes_of, failing_exception, frame_dtypes, holds_wide_floats
from .oom_phase import failing_phase
from ..torch.mode_watch import autocast_dtype_of, grad_off_of
from .oom_notes import (  # what the next report adds, noted by find_max_batch and the regions
    built_report, clear_batch_fit, keep_built_report, lines_by_line, note_batch_fit, noted_fit, regions_noted_at,
)
from .._units import format_size

__all__ = ["OOMReport", "last_oom", "note_batch_fit", "clear_batch_fit"]


class OOMReport:
    """What was asked for, what was live (by size class, by region, by
    line), what was cached and in how many pieces, the budget, and advice.
    str() is the text; a notebook shows it as HTML."""

    def __init__(self, record, regions=(), lines=None, steps=None, fit=None, dtypes=None, failed_batches=(),
                 fitted_batches=(), phase=None, autocast_dtype=None, card=None, grad_off=None):
        """dtypes: {dtype name: bytes} of the failing frames' CUDA tensors
        (oom_frames.frame_dtypes), None when unknown; failed_batches and
        fitted_batches: batch sizes measured to run out of memory and to fit
        (find_max_batch); phase: where the failing call was (oom_phase),
        None when not known; autocast_dtype: the dtype of the CUDA autocast
        region the error left (torch/mode_watch.py), None when none was
        seen; card: (name, compute capability) the advice is for, None when
        not known."""
        r = record
        self.seq = r["seq"]
        self.device = r["device"]
        self.requested = r["requested"]
        self.rounded = r["rounded"]
        self.budget = r["budget"]
        self.device_total = r["device_total"]
        self.device_free = r["device_free"]
        self.budget_refused = r["budget_refused"]
        self.limit = self.budget or self.device_total
        self.limit_name = "the budget" if self.budget else "the device"
        self.live = r["allocated"]
        self.reserved = r["reserved"]
        self.cached = max(self.reserved - self.live, 0)
        self.free_bytes = r["free_bytes"]
        self.largest_free_block = r["largest_free_block"]
        self.free_blocks = r["free_blocks"]
        self.segments = r["segments"]
        self.stats = dict(r["stats"])
        self.stats["fragmentation.external"] = (1 - self.largest_free_block / self.free_bytes) if self.free_bytes else 0.0
        self.stats["fragmentation.unused"] = (1 - self.live / self.reserved) if self.reserved else 0.0
        self.arena = bool(r["arena"])
        self.non_releasable = non_releasable(self.stats, self.arena)
        self.live_blocks = sum(row[2] for row in r["live_by_class"])
        self.live_by_class = sorted(r["live_by_class"], key=lambda row: -row[3])
        self.live_by_region = [(name, self.live - entry, peak) for name, entry, peak in regions]
        self.live_by_line = lines
        self.steps = steps
        self.fit = fit
        self.failed_batches = tuple(failed_batches)
        self.dtypes = dtypes
        self.wide_floats = holds_wide_floats(dtypes)
        self.fitted_batches = tuple(fitted_batches)
        self.phase = phase
        self.autocast_dtype = autocast_dtype
        self.grad_off = grad_off
        self.card = card
        self.cell = current_cell(ipython_shell())  # the IPython cell running as the report is made, or None
        room = max(self.limit - self.reserved, 0)
        if self.device_total and not self.budget_refused:
            room = min(room, self.device_free)
        self.room = room
        # The allocator's own figure, the message's "largest block that could
        # be allocated now": the largest free block, or the room and what a
        # retry releases (idle segments; under the arena, free pages).
        self.available = r["largest_allocatable"]
        self.short_by = max(self.rounded - self.available, 0)
        self.activations = self._activations()
        # the advice, ranked, and [(what, why)] of the advice left out, and why
        self.advice, self.not_advised = advise(self)

    # -------------------------------------------------------------- figures

    def _scopes(self):
        """[(name, bytes added since it began)] of the scopes open at the
        failure: the step under way, then each region."""
        scopes = [("the step under way", max(self.live - self.steps[1], 0))] if self.steps is not None else []
        return scopes + [(f"region {name!r}", max(added, 0)) for name, added, _ in self.live_by_region]

    def failing_scope(self):
        """The scope that added the least: the tightest around the failure."""
        scopes = self._scopes()
        return min(scopes, key=lambda scope: scope[1]) if scopes else None

    def _activations(self):
        scope = self.failing_scope()
        return scope[1] + self.rounded if scope is not None else None

    @property
    def leak(self):
        return self.steps[4] if self.steps is not None else None

    @property
    def fragmentation_is_cause(self):
        """The request would have fit had the cached free bytes been one piece."""
        return self.free_bytes + self.room >= self.rounded > self.available

    @property
    def too_big(self):
        return bool(self.limit) and self.rounded > self.limit

    # -------------------------------------------------------------- text

    def headline(self):
        return oom_text.headline(self)

    def __str__(self):
        return oom_text.report_text(self)

    def __repr__(self):
        return str(self)

    def _repr_html_(self):
        return oom_text.report_html(self)

    # -------------------------------------------------------------- measuring the remedies

    def measure_remedies(self, cell=None, out=None, steps=None, timeout=None):
        """Measures the standard remedies on this session's cells (up to
        `cell`, default the one this report was made in) on a phantom of
        this card, in a CPU subprocess: the table and the cheapest change
        that fits, shown in the cell as they come (oom_measure.py). `steps`
        and `timeout` stop each run early, as the dry run's do. Returns a
        MeasuredRemedies."""
        from .oom_measure import measure_remedies

        return measure_remedies(self, cell, out, steps=steps, timeout=timeout)

    def measure_line(self):
        """The call or the dry-run command that measures the remedies on
        this program."""
        from .oom_dryrun import command_line

        if self.cell is not None:  # an IPython session: its own cells, no path needed
            return ("Measure the remedies on this session's cells, without a GPU: "
                    "vramguard.last_oom().measure_remedies()")

        name = None
        torch = sys.modules.get("torch")  # an out-of-memory came from it: it is imported
        try:
            name = torch.cuda.get_device_name(self.device) if torch is not None else None
        except Exception:  # the device cannot say: the total names the card
            pass
        return command_line(name, self.device_total)


# ------------------------------------------------------------------ last_oom()


def _regions_for(record):
    from . import regions as _regions

    noted = regions_noted_at(record["seq"], record["device"])
    if noted:
        return noted[::-1]  # noted as they were left: innermost first
    return _regions.open_regions(record["device"])


def _fit_for(exc):
    """(fit, failed batches, fitted batches) when the noted fit was measured
    on the step that failed (its code is in the failure's traceback), or
    noted with no step; (None, (), ()) otherwise."""
    fit, scoped, code, failed, fitted = noted_fit()
    if fit is None or (scoped and (code is None or code not in codes_of(exc))):
        return None, (), ()
    return fit, failed, fitted


def last_oom(exc=None):
    """The report of the last out-of-memory the installed allocator raised
    (any device), or None when there was none. The same object until the
    next one (what it shows by line is read the first time).

    exc: the out-of-memory error, when the caller has it (default: the one
    being handled, else the last uncaught one): its frames tell which step
    failed and the dtypes of its tensors."""
    from . import steps as _steps

    record = _core.last_oom()
    if record is None:
        return None
    built = built_report(record["seq"])
    if built is not None:
        return built
    failing = failing_exception(exc)
    if failing is not None and f"Tried to allocate {format_size(record['requested'])}" not in str(failing):
        failing = None  # another out-of-memory's exception: its frames say nothing of this one
    fit, failed, fitted = _fit_for(failing)
    report = OOMReport(record, _regions_for(record), lines_by_line(record["device"]),
                       _steps.step_figures(record["device"]), fit, frame_dtypes(failing), failed, fitted,
                       failing_phase(failing), autocast_dtype_of(failing), card_of(record), grad_off_of(failing))
    keep_built_report(record["seq"], report)
    return report
