"""find_max_batch's search, fit and result, without PyTorch: a step that
runs out of memory above a threshold (the OOM test injected), and a probe
that reports a known peak per batch."""
import logging
import sys

import pytest

import vramguard
from vramguard.notebook import find_batch as _find_batch
from vramguard.notebook.find_batch import Try, fit_memory, search

MiB = 1 << 20


class FakeOOM(Exception):
    pass


@pytest.fixture(autouse=True)
def counted_collections(request, monkeypatch):
    """Without vramguard installed each try ends with a full garbage
    collection, whose cost is the size of the heap (pytest's: 0.1 to 0.2 s a
    try, seconds a search); these steps make no garbage, so the collections
    are counted instead, except where the collection is the subject."""
    if request.node.get_closest_marker("real_collections"):
        return None
    import types

    collections = []
    monkeypatch.setattr(_find_batch, "gc", types.SimpleNamespace(collect=lambda: collections.append(1)))
    return collections


def step_failing_above(threshold, calls):
    def step(batch):
        calls.append(batch)
        if batch > threshold:
            raise FakeOOM(f"out of memory at batch {batch}\nsecond line")

    return step


def is_fake_oom(exc):
    return isinstance(exc, FakeOOM)


class LinearProbe:
    """Peaks of fixed + per_sample x batch for the batch being tried (the
    step records which); recoveries counted."""

    def __init__(self, fixed, per_sample):
        self.fixed, self.per_sample = fixed, per_sample
        self.batch = None
        self.recoveries = 0

    def begin(self):
        pass

    def peak(self):
        return self.fixed + self.per_sample * self.batch

    def recover(self):
        self.recoveries += 1


@pytest.mark.parametrize("threshold, expected_calls", [
    (1, [1, 2]),
    (24, [1, 2, 4, 8, 16, 32, 24, 28, 26, 25]),
    (31, [1, 2, 4, 8, 16, 32, 24, 28, 30, 31]),
    (32, [1, 2, 4, 8, 16, 32, 64, 48, 40, 36, 34, 33]),
    (1000, [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 768, 896, 960, 992, 1008, 1000, 1004, 1002, 1001]),
])
def test_doubling_then_bisection(threshold, expected_calls):
    calls = []
    result = vramguard.find_max_batch(step_failing_above(threshold, calls), tolerance=0, is_oom=is_fake_oom,
                                      progress=False)
    assert result.largest == threshold
    assert calls == expected_calls
    assert [t.batch for t in result.tries] == expected_calls
    assert [t.fits for t in result.tries] == [b <= threshold for b in expected_calls]
    assert all(t.peak is None for t in result.tries)  # vramguard not installed: nothing measured
    assert result.fit is None


def test_start_and_limit():
    calls = []
    result = vramguard.find_max_batch(step_failing_above(100, calls), start=3, limit=20, is_oom=is_fake_oom,
                                      progress=False)
    assert calls == [3, 6, 12, 20]
    assert result.largest == 20
    assert "largest batch 20 (the limit)" in repr(result)
    calls.clear()
    result = vramguard.find_max_batch(step_failing_above(10, calls), start=3, limit=20, is_oom=is_fake_oom,
                                      progress=False)
    assert calls == [3, 6, 12, 9, 10, 11]
    assert result.largest == 10
    calls.clear()
    result = vramguard.find_max_batch(step_failing_above(100, calls), start=5, limit=5, is_oom=is_fake_oom,
                                      progress=False)
    assert calls == [5] and result.largest == 5


def test_nothing_fits():
    calls = []
    result = vramguard.find_max_batch(step_failing_above(3, calls), start=4, is_oom=is_fake_oom, progress=False)
    assert result.largest is None
    assert calls == [4]
    assert result.tries[0].error == "out of memory at batch 4"
    assert repr(result).splitlines()[0] == "find_max_batch: not even batch 4 fits: pass a smaller start (start=4 now)"
    result = vramguard.find_max_batch(step_failing_above(0, calls), is_oom=is_fake_oom, progress=False)
    assert repr(result).splitlines()[0] == (
        "find_max_batch: not even batch 1 fits: the step runs out of memory at any batch size")


@pytest.mark.parametrize("threshold, exact_tries, tolerant_tries, tolerant_answer", [
    (1000, 20, 17, 1000),          # 1,008 failed, 1,000 fitted: within 1%, 3 tries fewer
    (231_872, 36, 25, 231_424),    # the figure seen in a notebook: 11 tries fewer, 0.19% under the largest
    (24, 10, 10, 24),              # small answers: 1% of them is under one, refined to the unit as before
])
def test_the_search_stops_within_the_tolerance(threshold, exact_tries, tolerant_tries, tolerant_answer):
    exact = vramguard.find_max_batch(step_failing_above(threshold, []), tolerance=0, is_oom=is_fake_oom,
                                     progress=False)
    tolerant = vramguard.find_max_batch(step_failing_above(threshold, []), is_oom=is_fake_oom, progress=False)
    assert (exact.largest, len(exact.tries)) == (threshold, exact_tries)
    assert (tolerant.largest, len(tolerant.tries)) == (tolerant_answer, tolerant_tries)
    assert threshold - tolerant.largest <= 0.01 * tolerant.largest
    assert tolerant.first_failed - tolerant.largest <= max(1, int(0.01 * tolerant.largest))
    headline = repr(tolerant).splitlines()[0]
    if tolerant.first_failed - tolerant.largest > 1:
        assert headline == (f"find_max_batch: largest batch {tolerant_answer} (batch {tolerant.first_failed} ran out "
                            f"of memory: the answer is within 1%; tolerance=0 finds the exact largest)")
    else:
        assert headline == f"find_max_batch: largest batch {tolerant_answer}"
    assert repr(exact).splitlines()[0] == f"find_max_batch: largest batch {threshold}"


@pytest.mark.parametrize("tolerance", [-0.1, 1, 1.5, "1%", True, float("nan")])
def test_a_bad_tolerance_is_refused(tolerance):
    with pytest.raises(ValueError) as caught:
        vramguard.find_max_batch(lambda b: None, tolerance=tolerance, progress=False)
    assert str(caught.value) == ("find_max_batch: tolerance must be a fraction in [0, 1) (0.01: within 1%; 0: "
                                 f"to the unit), got {tolerance!r}")


def test_no_limit_still_ends(counted_collections):
    calls = []
    result = vramguard.find_max_batch(lambda b: calls.append(b), start=1, is_oom=is_fake_oom, progress=False)
    assert result.largest == 1 << _find_batch.MAX_DOUBLINGS
    assert len(calls) == _find_batch.MAX_DOUBLINGS + 1
    assert len(counted_collections) == len(calls)  # one after each try


def test_stopping_at_the_cap_says_so(caplog):
    """Without a limit, a step that never runs out stops at start x 2^40:
    the result and the log say it is the cap, not a measured maximum."""
    caplog.set_level(logging.INFO, logger="vramguard")
    result = vramguard.find_max_batch(lambda b: None, start=3, is_oom=is_fake_oom, progress=False)
    assert result.largest == 3 << 40 and result.stopped_at == "cap"
    assert repr(result).splitlines()[0] == (
        f"find_max_batch: largest batch {3 << 40} (the search's cap, start x 2^40: "
        "no batch ran out of memory; pass limit=)")
    last = caplog.records[-1]
    assert last.levelno == logging.WARNING
    assert last.getMessage() == f"find_max_batch: stopped at batch {3 << 40}" + _find_batch._STOP_NOTES["cap"]


def test_stopping_at_the_limit_is_logged_and_an_oom_is_no_stop(caplog):
    caplog.set_level(logging.INFO, logger="vramguard")
    result = vramguard.find_max_batch(lambda b: None, start=3, limit=20, is_oom=is_fake_oom, progress=False)
    assert result.stopped_at == "limit"
    assert caplog.records[-1].getMessage() == "find_max_batch: stopped at batch 20 (the limit)"
    caplog.clear()
    result = vramguard.find_max_batch(step_failing_above(10, []), start=3, is_oom=is_fake_oom, progress=False)
    assert result.largest == 10 and result.stopped_at is None
    assert repr(result).splitlines()[0] == "find_max_batch: largest batch 10"
    assert "stopped at" not in caplog.text


def test_default_oom_test_is_vramguards():
    """Without is_oom, a RuntimeError saying 'out of memory' is an OOM (what
    vramguard raises without its shim), any other error propagates."""
    def step(batch):
        if batch > 5:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")

    assert vramguard.find_max_batch(step, progress=False).largest == 5

    def broken(batch):
        if batch > 2:
            raise ValueError("a bug in the step")

    with pytest.raises(ValueError, match="a bug in the step"):
        vramguard.find_max_batch(broken, progress=False)


def test_each_try_is_logged(caplog):
    with caplog.at_level(logging.INFO, logger="vramguard"):
        vramguard.find_max_batch(step_failing_above(2, []), is_oom=is_fake_oom, progress=False)
    assert [r.getMessage() for r in caplog.records] == [
        "find_max_batch: batch 1 fits",
        "find_max_batch: batch 2 fits",
        "find_max_batch: batch 4 runs out of memory",
        "find_max_batch: batch 3 runs out of memory",
    ]


def test_fit_from_the_peaks_and_the_result_table():
    probe = LinearProbe(fixed=96 * MiB, per_sample=3 * MiB)

    def step(batch):
        probe.batch = batch
        if batch > 20:
            raise FakeOOM("out of memory")

    largest, tries = search(step, 1, None, is_fake_oom, probe)
    assert largest == 20
    assert probe.recoveries == len(tries) == 10
    result = _find_batch.BatchSearch(largest, tries, fit_memory([(t.batch, t.peak) for t in tries if t.fits]))
    assert result.fit.fixed == 96 * MiB and result.fit.per_sample == 3 * MiB and result.fit.residual == 0.0
    assert result.fit.predict(20) == 156 * MiB
    assert result.peaks[16] == 144 * MiB
    assert repr(result) == "\n".join([
        "find_max_batch: largest batch 20",
        "  memory = 3.00 MiB x batch + 96.00 MiB (residual 0 bytes, 6 points)",
        "     batch  result          peak",
        "         1  fits       99.00 MiB",
        "         2  fits      102.00 MiB",
        "         4  fits      108.00 MiB",
        "         8  fits      120.00 MiB",
        "        16  fits      144.00 MiB",
        "        32  OOM       192.00 MiB",
        "        24  OOM       168.00 MiB",
        "        20  fits      156.00 MiB",
        "        22  OOM       162.00 MiB",
        "        21  OOM       159.00 MiB",
    ])
    html = result._repr_html_()
    assert html.startswith("<div><b>find_max_batch: largest batch 20</b>")
    assert ">OOM</td>" in html and html.count("<tr>") == len(tries) + 1
    assert "3.00 MiB x batch + 96.00 MiB" in html


def test_fit_least_squares_and_residual():
    assert fit_memory([(4, 100)]) is None
    assert fit_memory([(4, 100), (4, 120)]) is None
    fit = fit_memory([(1, 10), (2, 20), (3, 40)])
    assert fit.per_sample == 15 and fit.fixed == pytest.approx(-20 / 3)
    assert str(fit) == "memory = 15 bytes x batch - 7 bytes (residual 2 bytes, 3 points)"
    # residuals +5/3, -10/3, +5/3: mean square 50/9
    assert fit.residual == pytest.approx((50 / 9) ** 0.5)
    assert fit.points == 3


@pytest.mark.parametrize("kwargs, error, message", [
    ({"step_fn": None}, TypeError, "step_fn must be callable"),
    ({"step_fn": 3}, TypeError, "step_fn must be callable"),
    ({"start": 0}, ValueError, "start must be a whole number >= 1, got 0"),
    ({"start": -2}, ValueError, "start must be a whole number >= 1, got -2"),
    ({"start": 1.5}, ValueError, "start must be a whole number >= 1, got 1.5"),
    ({"start": True}, ValueError, "start must be a whole number >= 1, got True"),
    ({"start": 8, "limit": 4}, ValueError, r"limit must be a whole number >= start \(8\), got 4"),
    ({"limit": 0}, ValueError, r"limit must be a whole number >= start \(1\), got 0"),
    ({"limit": "64"}, ValueError, r"limit must be a whole number >= start \(1\), got '64'"),
])
def test_bad_inputs(kwargs, error, message):
    args = {"step_fn": lambda b: None, **kwargs}
    with pytest.raises(error, match=message):
        vramguard.find_max_batch(**args, progress=False)


def test_budget_needs_vramguard_installed():
    with pytest.raises(vramguard.VramguardError, match=r"budget=...\) needs vramguard installed"):
        vramguard.find_max_batch(lambda b: None, budget="T4", progress=False)


def test_try_repr():
    assert repr(Try(8, True, 3 * MiB)) == "Try(batch=8, fits, peak 3.00 MiB)"
    assert repr(Try(16, False)) == "Try(batch=16, OOM)"


@pytest.mark.real_collections
def test_a_failed_steps_locals_are_freed_before_the_next_try():
    """The OOM's traceback holds the failed step's frame; its locals (the
    step's tensors) must be gone before the next try, even when something
    read frame.f_locals (a traceback formatter does: Python < 3.13 keeps
    that snapshot in the frame, and frame.clear() alone leaves it)."""
    import weakref

    class Activation:
        pass

    held = []

    def step(batch):
        held.append(weakref.ref(activation := Activation()))
        assert all(ref() is None for ref in held[:-1]), "an earlier try's locals are still alive"
        if batch > 4:
            raise FakeOOM(f"out of memory ({activation})")

    def reads_locals(exc):
        tb = exc.__traceback__
        while tb is not None:
            tb.tb_frame.f_locals  # noqa: B018  the snapshot, as a formatter makes it
            tb = tb.tb_next
        return isinstance(exc, FakeOOM)

    result = vramguard.find_max_batch(step, is_oom=reads_locals, progress=False)
    assert result.largest == 4
    assert len(held) == 6 and all(ref() is None for ref in held)


def test_a_tqdm_progress_bar_when_tqdm_is_installed(monkeypatch):
    import types

    bars = []

    class Bar:
        def __init__(self, **kwargs):
            self.kwargs, self.updates, self.postfixes, self.closed = kwargs, 0, [], False
            bars.append(self)

        def update(self, n):
            self.updates += n

        def set_postfix_str(self, text):
            self.postfixes.append(text)

        def close(self):
            self.closed = True

    auto = types.ModuleType("tqdm.auto")
    auto.tqdm = Bar
    monkeypatch.setitem(sys.modules, "tqdm", types.ModuleType("tqdm"))
    monkeypatch.setitem(sys.modules, "tqdm.auto", auto)
    vramguard.find_max_batch(step_failing_above(2, []), is_oom=is_fake_oom)
    assert len(bars) == 1
    bar = bars[0]
    assert bar.kwargs == {"desc": "find_max_batch", "unit": "try"}
    assert bar.updates == 4 and bar.closed
    assert bar.postfixes == ["batch 1: fits", "batch 2: fits", "batch 4: OOM", "batch 3: OOM"]
    vramguard.find_max_batch(step_failing_above(2, []), is_oom=is_fake_oom, progress=False)
    assert len(bars) == 1

    def broken(batch):
        raise ValueError("a bug")

    with pytest.raises(ValueError):
        vramguard.find_max_batch(broken, is_oom=is_fake_oom)
    assert bars[-1].closed  # closed on the way out too


def test_without_tqdm_no_bar(monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm.auto raises ImportError
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    assert vramguard.find_max_batch(step_failing_above(2, []), is_oom=is_fake_oom).largest == 2


def test_no_text_bar_is_printed_into_a_notebook_without_widgets(monkeypatch):
    """tqdm draws a bar in a terminal and, with ipywidgets, in a notebook;
    in a notebook kernel without ipywidgets it would print its text bar
    into the cell line by line: none then."""
    import importlib.util
    import types

    from vramguard.notebook import find_batch

    pytest.importorskip("tqdm", reason="tqdm is not installed")
    bar = find_batch._progress_bar(True)
    assert bar is not None
    bar.close()
    assert find_batch._progress_bar(False) is None
    monkeypatch.setitem(sys.modules, "ipykernel", types.ModuleType("ipykernel"))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ipywidgets" else real(name, *a))
    assert find_batch._progress_bar(True) is None
