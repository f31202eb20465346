"""find_max_batch(): the largest batch size whose step fits in memory.

Doubling from `start` until a step runs out of memory, then bisection
between the last batch that fitted and the first that did not, until they
are within `tolerance` of each other (1%: a few tries fewer than refining
to the unit, which moves the answer by less than the batch-to-batch noise
of a real step; tolerance=0 refines to the unit). Between
tries the failed step's memory is recovered (its frames cleared, garbage
collected, the cache emptied), so every try starts from the same heap.
Each try is logged (logger "vramguard") and kept in the result with its
peak, because a finder that retries silently leaves the user guessing.

With vramguard installed, the peaks of the tries that fitted give a
least-squares line, memory = fixed + per_sample x batch: what a batch
costs, for planning on another GPU. `budget` searches under a smaller
heap ("T4", "12GiB") and puts the device's budget back afterwards; a
budget larger than the device is said (the device is then the limit).

The search leaves the session's peaks as they were: each try's peak is a
probe's (report/peak_probe.py PeakProbe), not a reset of PyTorch's, and the
device's peaks saved before the first try are restored after the last
(_core.restore_device_peaks), so torch.cuda.max_memory_allocated() and the
summary's peaks read what they would had the search not run. The counters
count the tries (num_ooms, the totals): the out-of-memory errors the search
raised are noted (torch/search_ooms.py), and the summary says how many of
its errors were the search's.
"""
import gc
import importlib.util
import logging
import sys
from fractions import Fraction
from html import escape

from .._core import format_size
from .._search import bisect, double
from ..render.html import table
from ..render import words

logger = logging.getLogger("vramguard")

# limit=None still ends: start x 2^40 is past any memory a batch can take.
MAX_DOUBLINGS = 40
#: The search stops once the batch that fitted and the one that ran out of
#: memory are this close, relative to the one that fitted.
DEFAULT_TOLERANCE = 0.01


class Try:
    """One step: its batch size, whether it fitted, its peak of allocated
    bytes (None when not measured) and, for an OOM, the error's first line."""

    __slots__ = ("batch", "fits", "peak", "error")

    def __init__(self, batch, fits, peak=None, error=None):
        self.batch, self.fits, self.peak, self.error = batch, fits, peak, error

    def __repr__(self):
        peak = "" if self.peak is None else f", peak {format_size(self.peak)}"
        return f"Try(batch={self.batch}, {'fits' if self.fits else 'OOM'}{peak})"


class MemoryFit:
    """memory = fixed + per_sample x batch, least squares over the tries
    that fitted; residual: the root mean square of the misfit, in bytes.
    Exact (ints) when the points are on a line of whole bytes."""

    __slots__ = ("fixed", "per_sample", "residual", "points")

    def __init__(self, fixed, per_sample, residual, points):
        self.fixed, self.per_sample, self.residual, self.points = fixed, per_sample, residual, points

    def predict(self, batch):
        return self.fixed + self.per_sample * batch

    def __str__(self):
        fixed = int(round(self.fixed))
        sign = "-" if fixed < 0 else "+"
        return (f"memory = {format_size(int(round(self.per_sample)))} x batch {sign} {format_size(abs(fixed))}"
                f" (residual {format_size(int(round(self.residual)))}, {words.count(self.points, 'point')})")

    __repr__ = __str__


def _exact(value):
    return int(value) if value.denominator == 1 else float(value)


def fit_memory(points):
    """The least-squares MemoryFit of (batch, bytes) points, or None with
    fewer than two distinct batch sizes (no line through one point)."""
    points = [(Fraction(b), Fraction(m)) for b, m in points]
    if len({b for b, _ in points}) < 2:
        return None
    n = len(points)
    mean_b = sum(b for b, _ in points) / n
    mean_m = sum(m for _, m in points) / n
    spread = sum((b - mean_b) ** 2 for b, _ in points)
    per_sample = sum((b - mean_b) * (m - mean_m) for b, m in points) / spread
    fixed = mean_m - per_sample * mean_b
    square = sum((m - fixed - per_sample * b) ** 2 for b, m in points) / n
    return MemoryFit(_exact(fixed), _exact(per_sample), float(square) ** 0.5, n)


_STOP_NOTES = {
    "limit": " (the limit)",
    "cap": f" (the search's cap, start x 2^{MAX_DOUBLINGS}: no batch ran out of memory; pass limit=)",
}


def ceiling(start, limit):
    """The largest batch a search tries."""
    return limit if limit is not None else start << MAX_DOUBLINGS


class BatchSearch:
    """find_max_batch()'s answer: `largest` batch that fitted (None: not
    even `start`), every try in order, the memory fit (None unless two
    sizes fitted with their peaks measured) and the budget searched under."""

    def __init__(self, largest, tries, fit, budget=None, limit=None, start=1, tolerance=0.0, over_device=None):
        self.largest, self.tries, self.fit, self.budget, self.limit = largest, tries, fit, budget, limit
        self.start, self.tolerance = start, tolerance
        self.over_device = over_device  # the sentence when the budget is larger than the device

    @property
    def first_failed(self):
        """The smallest batch above `largest` that ran out of memory, or None."""
        failed = [t.batch for t in self.tries if not t.fits and (self.largest is None or t.batch > self.largest)]
        return min(failed) if failed else None

    @property
    def stopped_at(self):
        """Why the search stopped short of an OOM: "limit" (largest is the
        limit), "cap" (no limit, and nothing ran out of memory up to
        start x 2^MAX_DOUBLINGS: largest is that cap, not a measured
        maximum), or None (a batch ran out of memory)."""
        if self.largest is None or self.largest != ceiling(self.start, self.limit):
            return None
        return "limit" if self.limit is not None else "cap"

    @property
    def peaks(self):
        """{batch: peak bytes} of every measured try."""
        return {t.batch: t.peak for t in self.tries if t.peak is not None}

    def _under(self):
        if self.over_device:
            return f" on the device ({self.over_device})"
        return f" under a budget of {format_size(self.budget)}" if self.budget else ""

    def _precision(self):
        """Where the search stopped short of the unit: how close it is."""
        failed = self.first_failed
        if self.largest is None or failed is None or failed - self.largest <= 1:
            return ""
        return (f" (batch {failed} ran out of memory: the answer is within {self.tolerance:.0%}; "
                f"tolerance=0 finds the exact largest)")

    def _headline(self):
        under = self._under()
        if self.largest is None:
            first = self.tries[0].batch if self.tries else "?"
            if first == 1:
                return f"find_max_batch: not even batch 1 fits{under}: the step runs out of memory at any batch size"
            return f"find_max_batch: not even batch {first} fits{under}: pass a smaller start (start={first} now)"
        return (f"find_max_batch: largest batch {self.largest}{_STOP_NOTES.get(self.stopped_at, '')}"
                f"{self._precision()}{under}")

    def _rows(self):
        for t in self.tries:
            peak = "-" if t.peak is None else format_size(t.peak)
            yield str(t.batch), "fits" if t.fits else "OOM", peak

    def __repr__(self):
        lines = [self._headline()]
        if self.fit is not None:
            lines.append(f"  {self.fit}")
        lines.append(f"  {'batch':>8}  {'result':<6}  {'peak':>12}")
        lines.extend(f"  {b:>8}  {r:<6}  {p:>12}" for b, r, p in self._rows())
        return "\n".join(lines)

    def _repr_html_(self):
        fit = f"<div>{escape(str(self.fit))}</div>" if self.fit is not None else ""
        return (f"<div><b>{escape(self._headline())}</b>{fit}"
                f"{table(['batch', 'result', 'peak'], self._rows())}</div>")


# ------------------------------------------------------------------ probes


class _Unmeasured:
    """Without vramguard installed: no peaks; recovery is garbage collection."""

    def begin(self):
        pass

    def peak(self):
        return None

    def recover(self):
        gc.collect()


class _HeapProbe:
    """The device's peak of allocated bytes per try, kept by a probe (the
    regions' interval peak), so that PyTorch's peaks are not reset. Between tries the
    cache is emptied, so that each try starts as a fresh run would; garbage
    is collected only when the try left more allocated than it found (a
    step's tensors in a reference cycle): a full collection costs about
    half a second with PyTorch loaded, more than most steps."""

    def __init__(self, device):
        self.device = device
        self.allocated_before = 0
        self.probe = None

    def _allocated(self):
        from ..torch import install as _torch

        return _torch.stats(self.device)["allocated_bytes.all.current"]

    def begin(self):
        from ..report.peak_probe import PeakProbe

        self.allocated_before = self._allocated()
        self.probe = PeakProbe(self.device)

    def peak(self):
        probe, self.probe = self.probe, None
        return probe.close()[0] if probe is not None else None

    def recover(self):
        from ..torch import install as _torch
        from .recover import recover

        if self._allocated() > self.allocated_before:
            recover()
        else:
            _torch.empty_cache()


# ------------------------------------------------------------------ search


def _check_arguments(step_fn, start, limit, tolerance):
    if not callable(step_fn):
        raise TypeError(f"find_max_batch: step_fn must be callable (step_fn(batch)), got {step_fn!r}")
    if isinstance(start, bool) or not isinstance(start, int) or start < 1:
        raise ValueError(f"find_max_batch: start must be a whole number >= 1, got {start!r}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < start):
        raise ValueError(f"find_max_batch: limit must be a whole number >= start ({start}), got {limit!r}")
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not 0 <= tolerance < 1:
        raise ValueError(f"find_max_batch: tolerance must be a fraction in [0, 1) (0.01: within 1%; 0: to the "
                         f"unit), got {tolerance!r}")


def _attempt(step_fn, batch, oom_test, probe):
    from .recover import clear_exception_frames

    probe.begin()
    try:
        step_fn(batch)
    except Exception as exc:
        if not oom_test(exc):
            probe.peak()  # closes the try's probe: it would stay open for good
            raise
        lines = str(exc).splitlines()
        result = Try(batch, False, probe.peak(), lines[0] if lines else type(exc).__name__)
        clear_exception_frames(exc)  # the step's locals: its tensors
    else:
        result = Try(batch, True, probe.peak())
    probe.recover()
    return result


def close_enough(good, bad, tolerance):
    """True once the batch that fitted (`good`) and the one that did not
    (`bad`) are within `tolerance` of `good`, or adjacent."""
    return bad - good <= max(1, int(tolerance * good))


def search(step_fn, start, limit, oom_test, probe, on_try=lambda t: None, tolerance=0.0):
    """(largest batch that fits or None, the tries in order)."""
    tries = []

    def fits(batch):
        t = _attempt(step_fn, batch, oom_test, probe)
        tries.append(t)
        on_try(t)
        return t.fits

    good, bad = double(fits, start, ceiling(start, limit))
    if good is not None and bad is not None:
        good, bad = bisect(lambda batch: not fits(batch), good, bad,
                           close=lambda good, bad: close_enough(good, bad, tolerance))
    return good, tries


def _progress_bar(enabled):
    """tqdm's bar where it draws as a bar: a terminal, or a notebook with
    ipywidgets. In a notebook kernel without ipywidgets tqdm would print
    its text bar into the cell line by line: no bar there (each try is
    logged, and the result lists them)."""
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    if "ipykernel" in sys.modules and importlib.util.find_spec("ipywidgets") is None:
        return None
    return tqdm(desc="find_max_batch", unit="try")


def _reporter(bar):
    def on_try(t):
        peak = "" if t.peak is None else f", peak {format_size(t.peak)}"
        logger.info("find_max_batch: batch %d %s%s", t.batch, "fits" if t.fits else "runs out of memory", peak)
        if bar is not None:
            bar.update(1)
            bar.set_postfix_str(f"batch {t.batch}: {'fits' if t.fits else 'OOM'}")

    return on_try


class _SearchBudget:
    """The device's budget set for the search, the one before put back;
    over_device: the sentence when the budget is larger than the device."""

    def __init__(self, budget, device):
        from ..torch import install as _torch

        self.nbytes, self.fraction = _torch.parse_budget_setting(budget)
        self.device = device
        self.before = None
        self.over_device = None

    def __enter__(self):
        from .. import _core

        self.before = _core.device_heap(self.device).budget
        _core.set_device_budget(self.device, self.nbytes, self.fraction)
        budget = _core.device_heap(self.device).budget
        self.over_device = _over_device_sentence(budget, self.device)
        if self.over_device:
            logger.warning("find_max_batch: %s", self.over_device)
        return budget

    def __exit__(self, *exc):
        from .. import _core

        _core.set_device_budget(self.device, self.before or 0, 0.0)
        return False


def _over_device_sentence(budget, device):
    import torch

    from ..torch.budget_over_device import over_device

    properties = torch.cuda.get_device_properties(device)
    return over_device(budget, properties.total_memory, getattr(properties, "name", None))


class _SessionPeaks:
    """The device's peaks saved before the search and restored after it:
    the tries' peaks are the search's, not the session's. The out-of-memory
    errors raised meanwhile are noted as the search's (search_ooms.py)."""

    def __init__(self, device):
        self.device = device
        self.saved = None
        self.ooms = 0

    def __enter__(self):
        from .. import _core

        heap = _core.device_heap(self.device)  # the heap exists, so there are peaks to save
        self.saved = _core.save_device_peaks(self.device)
        self.ooms = heap.stats()["num_ooms"]
        return self

    def __exit__(self, *exc):
        from .. import _core
        from ..torch import search_ooms

        if self.saved is not None:
            _core.restore_device_peaks(self.device, self.saved)
            search_ooms.note(self.device, _core.device_heap(self.device).stats()["num_ooms"] - self.ooms)
        return False


def _run(step_fn, start, limit, oom_test, probe, bar, tolerance, search_budget, index):
    """search() under the search's budget, with the session's peaks kept:
    (largest, tries, the budget searched under or None)."""
    import contextlib

    with contextlib.ExitStack() as stack:
        if index is not None:
            stack.enter_context(_SessionPeaks(index))
        searched_under = stack.enter_context(search_budget) if search_budget is not None else None
        largest, tries = search(step_fn, start, limit, oom_test, probe, _reporter(bar), tolerance)
    return largest, tries, searched_under


def find_max_batch(step_fn, start=1, limit=None, budget=None, *, tolerance=DEFAULT_TOLERANCE, is_oom=None,
                   device=None, progress=True):
    """The largest batch size for which step_fn(batch) runs without running
    out of memory: doubling from `start`, then bisection.

    step_fn(batch): one training (or inference) step at that batch size;
        it should drop its tensors when it returns.
    limit: the largest batch worth trying (None: no limit).
    budget: search as if the GPU were smaller: any budget install()
        accepts ("T4", "12GiB", 0.5); the device's budget is put back after.
        One larger than the device is said: the device is then the limit.
    tolerance: stop once the batch that fitted and the one that ran out of
        memory are within this fraction of the first (default 0.01: the
        answer is within 1% of the largest; 0: exact, a few tries more).
    is_oom: the test for an out-of-memory error (default vramguard.is_oom);
        any other exception stops the search and propagates.
    device: the device whose peaks are read (default: the current one).
    progress: a tqdm.auto progress bar when tqdm is installed.

    The device's peaks (torch.cuda.max_memory_allocated(), the summary's)
    are left as they were before the search.

    Returns a BatchSearch: .largest, .tries, .peaks, .fit (memory = fixed +
    per_sample x batch, from the tries that fitted)."""
    from ..torch import install as _torch

    _check_arguments(step_fn, start, limit, tolerance)
    oom_test = is_oom if is_oom is not None else _torch.is_oom
    if budget is not None and not _torch.is_installed():
        raise _torch.VramguardError("find_max_batch(budget=...) needs vramguard installed: call vramguard.install() first")
    if _torch.is_installed():
        index = _torch.device_index(device)
        probe = _HeapProbe(index)
    else:
        index, probe = None, _Unmeasured()
    try:
        search_budget = _SearchBudget(budget, index) if budget is not None else None
    except (ValueError, TypeError) as exc:  # the user's call and the message, not the parser's frames
        raise _torch.public_error(exc) from None
    bar = _progress_bar(progress)
    try:
        largest, tries, searched_under = _run(step_fn, start, limit, oom_test, probe, bar, tolerance,
                                              search_budget, index)
    finally:
        if bar is not None:
            bar.close()
    fit = fit_memory([(t.batch, t.peak) for t in tries if t.fits and t.peak is not None])
    if fit is not None and fit.fixed >= 0 and fit.per_sample > 0:
        from ..report.oom import note_batch_fit

        # The next OOM report's "largest batch that fits", for a failure in
        # this step only, never at a batch measured to fail.
        note_batch_fit(fit.fixed, fit.per_sample, step=step_fn, failed=[t.batch for t in tries if not t.fits],
                       fitted=[t.batch for t in tries if t.fits])
    result = BatchSearch(largest, tries, fit, budget=searched_under or None, limit=limit, start=start,
                         tolerance=tolerance, over_device=search_budget.over_device if search_budget else None)
    if result.stopped_at is not None:  # the cap is no measured maximum: a warning
        level = logging.WARNING if result.stopped_at == "cap" else logging.INFO
        logger.log(level, "find_max_batch: stopped at batch %d%s", largest, _STOP_NOTES[result.stopped_at])
    return result
