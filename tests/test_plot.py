"""vramguard.plot and ReplayResult.plot draw what the replay found: the
curves' points are the replay's samples, and the marks sit at the ops
where things happened."""
import pytest

matplotlib = pytest.importorskip("matplotlib", reason="matplotlib is the optional plot extra")
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import vramguard  # noqa: E402
from vramguard import Heap, Trace  # noqa: E402

MiB = 1 << 20


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _step_trace():
    """Two 64 MiB steps with an empty_cache between them, then a 300 MiB tensor."""
    t = Trace("steps")
    for _ in range(2):
        a = t.alloc(64 * MiB)
        b = t.alloc(64 * MiB)
        t.free(a)
        t.free(b)
        t.empty_cache()
    t.alloc(300 * MiB)
    return t


def _line(ax, label):
    (line,) = [ln for ln in ax.get_lines() if ln.get_label() == label]
    return line


def test_result_plot_draws_the_replay_samples():
    result = vramguard.replay(_step_trace(), budget=None, policy="torch")
    ax = result.plot()
    reserved = _line(ax, "reserved (torch)")
    assert list(reserved.get_xdata()) == [p[0] for p in result.curve]
    assert list(reserved.get_ydata()) == [p[3] for p in result.curve]
    assert max(reserved.get_ydata()) == result.peak_reserved_bytes
    assert list(_line(ax, "allocated").get_ydata()) == [p[2] for p in result.curve]
    assert "fits" in ax.get_title()


def test_budget_and_first_oom_are_marked():
    trace = _step_trace()
    result = vramguard.replay(trace, budget="256MiB")
    assert not result.fits
    ax = vramguard.plot(result)
    assert list(_line(ax, "budget 256.00 MiB").get_ydata()) == [256 * MiB, 256 * MiB]
    assert list(_line(ax, "first OOM").get_xdata()) == [result.first_oom] * 2
    assert "does not fit" in ax.get_title()


def test_a_trace_is_replayed_with_its_empty_caches_marked():
    trace = _step_trace()
    ax = vramguard.plot(trace, budget="1GiB")
    empty = [ln for ln in ax.get_lines() if tuple(ln.get_xdata()) in {(4, 4), (9, 9)}]
    assert len(empty) == 2
    assert _line(ax, "empty_cache").get_xdata()[0] == 4


def test_regions_are_shaded_and_named():
    ax = vramguard.plot(_step_trace(), regions=[("step 1", 0, 4), ("step 2", 5, 9)])
    assert [t.get_text() for t in ax.texts if t.get_text().startswith("step")] == ["step 1", "step 2"]
    assert len(ax.patches) + len(ax.collections) >= 3  # the live fill and the two spans


def test_the_last_recording_is_plotted():
    heap = Heap("4GiB")
    with vramguard.record(heap):
        p = heap.malloc(100 * MiB)
        heap.free(p)
    ax = vramguard.plot()
    assert max(_line(ax, "allocated").get_ydata()) == 100 * MiB


def test_plot_refuses_a_replay_without_samples():
    result = vramguard.replay(_step_trace(), samples=0)
    with pytest.raises(ValueError, match="samples > 0"):
        result.plot()


@pytest.mark.parametrize("source", [[], {}, 3, b"trace.vgtrace"])
def test_plot_refuses_what_is_not_a_trace(source):
    with pytest.raises(TypeError) as error:
        vramguard.plot(source)
    assert str(error.value) == ("plot() takes a ReplayResult, a Trace, a path to a trace or None (the last "
                                f"recording), not {type(source).__name__}")


def test_plotting_an_empty_trace_says_it_is_empty():
    with pytest.raises(ValueError) as error:
        vramguard.plot(Trace("nothing"))
    assert str(error.value) == "nothing to plot: the trace 'nothing' is empty (no allocations or frees)"
    with pytest.raises(ValueError, match="is empty"):
        vramguard.replay(Trace("nothing")).plot()
