"""Regions (several max_memory_allocated counters at once) and steps (leaks
across training steps), on the simulated device: exact byte counts after
known sequences."""
import subprocess
import sys
import textwrap
import threading
import warnings

import pytest

import vramguard
from vramguard import Heap, LeakWarning, _core
from vramguard.report import leak_rule, tracked_heaps

MiB, GiB = 1 << 20, 1 << 30


def steps(heap, n, live_growth=0, one_off_at=None, one_off=0, temp=40 * MiB):
    """n training steps: a temporary of `temp`, `live_growth` kept per
    step, `one_off` kept once at step `one_off_at`; step() after each.
    Returns the warnings step() gave and what was kept."""
    kept = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(n):
            t = heap.malloc(temp)
            if live_growth:
                kept.append(heap.malloc(live_growth))
            if i == one_off_at:
                kept.append(heap.malloc(one_off))
            heap.free(t)
            vramguard.step(heap)
    return [w for w in caught if issubclass(w.category, LeakWarning)], kept


# ---------------------------------------------------------------- the interval peak


def test_take_interval_is_the_peak_since_the_last_take():
    heap = Heap(GiB)
    assert _core.take_interval(heap) == (0, 0, 0)
    a = heap.malloc(10 * MiB)
    b = heap.malloc(30 * MiB)
    heap.free(b)
    assert _core.take_interval(heap) == (40 * MiB, 10 * MiB, 40 * MiB)
    assert _core.take_interval(heap) == (10 * MiB, 10 * MiB, 40 * MiB)  # a new interval starts at current
    heap.reset_peaks()  # the stats' peaks are another counter
    c = heap.malloc(5 * MiB)
    heap.free(c)
    heap.free(a)
    assert _core.take_interval(heap) == (15 * MiB, 0, 45 * MiB)
    heap.check()


def test_take_interval_refuses_what_is_not_a_heap():
    with pytest.raises(TypeError, match="expected a vramguard Heap"):
        _core.take_interval(object())


# ---------------------------------------------------------------- regions


def test_nested_regions_each_keep_their_own_peak():
    heap = Heap(GiB)
    base = heap.malloc(100 * MiB)
    with vramguard.track("outer", device=heap):
        a = heap.malloc(10 * MiB)
        with vramguard.track("inner", device=heap):
            b = heap.malloc(30 * MiB)
            heap.free(b)
        heap.reset_peaks()  # the global peak restarts; the regions' do not
        c = heap.malloc(5 * MiB)
        heap.free(c)
        with vramguard.track("inner", device=heap):
            d = heap.malloc(2 * MiB)
        heap.free(a)
    table = vramguard.regions(heap)
    assert [r.name for r in table] == ["inner", "outer"]
    inner, outer = table["inner"], table["outer"]
    assert (inner.calls, inner.peak, inner.live_at_exit, inner.allocated) == (2, 140 * MiB, 112 * MiB, 32 * MiB)
    assert (outer.calls, outer.peak, outer.live_at_exit, outer.allocated) == (1, 140 * MiB, 102 * MiB, 47 * MiB)
    assert heap.stats()["allocated_bytes.all.peak"] == 115 * MiB
    heap.free(d)
    heap.free(base)
    with pytest.raises(KeyError):
        table["nowhere"]


def test_a_region_after_a_high_one_starts_from_where_memory_is():
    heap = Heap(GiB)
    with vramguard.track("big", device=heap):
        heap.free(heap.malloc(500 * MiB))
    with vramguard.track("small", device=heap):
        heap.free(heap.malloc(MiB))
    table = vramguard.regions(heap)
    assert table["big"].peak == 500 * MiB and table["small"].peak == MiB


def test_track_as_a_decorator_with_and_without_a_name():
    heap = Heap(GiB)

    @vramguard.track("forward", device=heap)
    def forward(n):
        p = heap.malloc(n)
        heap.free(p)
        return n

    assert forward(3 * MiB) == 3 * MiB and forward(MiB) == MiB
    row = vramguard.regions(heap)["forward"]
    assert (row.calls, row.peak, row.allocated) == (2, 3 * MiB, 4 * MiB)

    def plain():
        return 7

    tracked = vramguard.track(plain, device=heap)  # what @vramguard.track makes
    assert tracked() == 7 and tracked.name.endswith("plain")
    assert vramguard.regions(heap)[tracked.name].calls == 1


def test_a_region_left_by_an_exception_is_counted():
    heap = Heap(64 * MiB)
    with pytest.raises(MemoryError):
        with vramguard.track("too much", device=heap):
            heap.malloc(128 * MiB)
    assert vramguard.regions(heap)["too much"].calls == 1


def test_region_table_text_and_html():
    heap = Heap(GiB)
    assert "No region has closed yet" in str(vramguard.regions(heap))
    with vramguard.track("a<b>", device=heap):
        heap.free(heap.malloc(MiB))
    with vramguard.track("open", device=heap):
        text = str(vramguard.regions(heap))
        page = vramguard.regions(heap)._repr_html_()
    assert text.splitlines()[0].split() == ["Region", "Calls", "Peak", "Live", "at", "exit", "Allocated"]
    assert "Open now: open" in text and text.splitlines()[2].split()[:2] == ["a<b>", "1"]
    assert "a&lt;b&gt;" in page and "<table>" in page


def test_regions_from_many_threads_on_one_heap():
    heap = Heap(GiB)
    errors = []

    def work():
        try:
            for _ in range(200):
                with vramguard.track("t", device=heap):
                    p = heap.malloc(MiB)
                    with vramguard.track("t.inner", device=heap):
                        heap.free(heap.malloc(MiB))
                    heap.free(p)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    table = vramguard.regions(heap)
    assert table["t"].calls == 800 and table["t.inner"].calls == 800
    # four threads, at most two blocks each live at once
    assert 2 * MiB <= table["t"].peak <= 8 * MiB
    assert table["t"].allocated >= 2 * 800 * MiB
    assert not table.open
    heap.check()


@pytest.mark.parametrize("name, error", [("", TypeError), (5, TypeError), (None, TypeError)])
def test_track_refuses_a_bad_name(name, error):
    with pytest.raises(error, match="name must be a non-empty str"):
        vramguard.track(name)


def test_track_refuses_a_bool_device():
    with pytest.raises(TypeError, match="not bool"):
        with vramguard.track("x", device=True):
            pass


def test_without_install_a_device_region_says_so():
    with pytest.raises(vramguard.VramguardError, match="call vramguard.install"):
        with vramguard.track("x"):
            pass
    with pytest.raises(vramguard.VramguardError, match="call vramguard.install"):
        vramguard.step()
    for device in (0, "cuda:0"):
        with pytest.raises(vramguard.VramguardError, match="call vramguard.install"):
            vramguard.regions(device)
    assert _core.existing_devices() == []  # no device heap was made for it


# ---------------------------------------------------------------- steps and leaks


def test_a_constructed_leak_is_reported_with_exact_bytes_per_step():
    heap = Heap(GiB)
    caught, kept = steps(heap, 12, live_growth=3 * MiB)
    assert len(caught) == 1, "warned once, when the leak began"
    assert "grows by 3.00 MiB per step" in str(caught[0].message)
    leak = vramguard.leak_check(heap)
    assert leak.bytes_per_step == 3 * MiB
    assert (leak.since_step, leak.steps) == (1, 12)
    assert leak.accumulated == 11 * 3 * MiB and leak.live == 12 * 3 * MiB
    text = str(leak)
    assert "losses.append(loss)" in text and "loss.item()" in text
    assert "record(stacks=True)" in text  # a Heap has no lines
    assert "<li>" in leak._repr_html_()
    for p in kept:
        heap.free(p)


def test_the_leak_is_first_seen_after_the_window():
    heap = Heap(GiB)
    caught, kept = steps(heap, leak_rule.LEAK_WINDOW - 1, live_growth=MiB)
    assert not caught and vramguard.leak_check(heap) is None
    caught, more = steps(heap, 1, live_growth=MiB)
    assert len(caught) == 1


def test_a_steady_loop_is_no_leak():
    heap = Heap(GiB)
    caught, _ = steps(heap, 30)
    assert not caught and vramguard.leak_check(heap) is None


def test_a_one_off_growth_is_no_leak():
    heap = Heap(GiB)
    caught, kept = steps(heap, 30, one_off_at=3, one_off=200 * MiB)
    assert not caught and vramguard.leak_check(heap) is None
    heap.free(kept[0])


def test_a_leak_that_stops_is_no_longer_reported():
    heap = Heap(GiB)
    caught, kept = steps(heap, 10, live_growth=MiB)
    assert len(caught) == 1
    caught, _ = steps(heap, 10)
    assert not caught and vramguard.leak_check(heap) is None


def test_noise_around_a_level_is_no_leak():
    heap = Heap(GiB)
    held = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(40):  # live goes up two steps, down one: net zero per three
            if i % 3 == 2:
                heap.free(held.pop())
                heap.free(held.pop())
            else:
                held.append(heap.malloc(MiB))
            vramguard.step(heap)
    assert not [w for w in caught if issubclass(w.category, LeakWarning)]


@pytest.mark.parametrize("lives, expected", [
    ([0, 1, 2, 3, 4, 5, 6, 7], (1, 0)),
    ([5, 5, 5, 5, 5, 5, 5, 5], None),
    ([0, 9, 9, 9, 9, 9, 9, 9], None),                       # one-off
    ([0, 0, 0, 0, 2, 4, 6, 8, 10, 12, 14], (2, 3)),          # starts at index 3
    ([0, 2, 4, 6, 8, 10, 9, 11], (2, 0)),                   # 6 of 7 grew
    ([0, 2, 4, 6, 8, 7, 6, 8], None),                       # 5 of 7
    ([0, 1, 2, 3, 4, 5, 6], None),                          # shorter than the window
])
def test_leak_rule(lives, expected):
    assert leak_rule.judge_leak(lives) == expected


def test_regions_and_steps_on_simulated_device_heaps():
    """The device path: track() and step() without a Heap, on device 0."""
    code = """
        import warnings, vramguard
        from vramguard import _core
        MiB = 1 << 20
        _core.simulate_devices(1 << 30)
        h = _core.device_heap(0)
        with vramguard.track("forward"):
            h.free(h.malloc(7 * MiB))
        kept = []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for i in range(9):
                kept.append(h.malloc(2 * MiB))
                vramguard.step(0)
        print("peak", vramguard.regions()["forward"].peak)
        try:
            vramguard.regions(64)
        except ValueError as e:
            print("bad", e)
        print("leak", vramguard.leak_check().bytes_per_step, len(caught))
    """
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "peak 7340032" in proc.stdout and "leak 2097152 1" in proc.stdout
    assert "bad device must be in 0..63, got 64" in proc.stdout


# ------------------------------------------------------------------ lifetimes and misuse


def _heap_targets():
    return sum(1 for key in tracked_heaps._targets if key[0] == "heap")


def test_a_tracked_heap_is_not_kept_alive():
    import gc
    import weakref

    gc.collect()  # heaps of earlier tests, in cycles, go first
    before = _heap_targets()
    refs = []
    for _ in range(50):
        heap = Heap(GiB)
        with vramguard.track("r", device=heap):
            heap.free(heap.malloc(MiB))
        vramguard.step(heap)
        assert vramguard.regions(heap)["r"].peak == MiB
        refs.append(weakref.ref(heap))
        del heap
    gc.collect()
    assert [r for r in refs if r() is not None] == []
    assert _heap_targets() == before


def test_a_heap_at_a_dead_heaps_id_starts_with_no_regions():
    from vramguard.report import tracked_heaps

    for _ in range(20):  # CPython often hands the freed object's memory to the next one
        heap = Heap(GiB)
        with vramguard.track("old", device=heap):
            heap.free(heap.malloc(MiB))
        del heap
        heap = Heap(GiB)
        assert len(vramguard.regions(heap)) == 0
        with vramguard.track("new", device=heap):
            heap.free(heap.malloc(2 * MiB))
        assert [(r.name, r.calls, r.peak) for r in vramguard.regions(heap)] == [("new", 1, 2 * MiB)]
        del heap
    # Whether or not an id came back above, an entry left at a new heap's id
    # by a dead one (its weakref's callback not run yet) is not taken for it.
    dead = Heap(GiB)
    with vramguard.track("old", device=dead):
        dead.free(dead.malloc(MiB))
    stale = tracked_heaps._targets[("heap", id(dead))]
    del dead
    heap = Heap(GiB)
    tracked_heaps._targets[("heap", id(heap))] = stale
    assert len(vramguard.regions(heap)) == 0


def test_track_on_a_generator_covers_each_resumption():
    heap = Heap(GiB)

    @vramguard.track("gen", device=heap)
    def chunks(sizes):
        for n in sizes:
            p = heap.malloc(n)
            yield n
            heap.free(p)
        return "done"

    gen = chunks([4 * MiB, 8 * MiB])
    assert len(vramguard.regions(heap)) == 0  # creating it runs nothing
    assert next(gen) == 4 * MiB
    outside = heap.malloc(20 * MiB)  # between resumptions: not the region's
    heap.free(outside)
    assert next(gen) == 8 * MiB
    with pytest.raises(StopIteration) as stop:
        next(gen)
    assert stop.value.value == "done"
    row = vramguard.regions(heap)["gen"]
    assert (row.calls, row.peak, row.allocated, row.live_at_exit) == (1, 8 * MiB, 12 * MiB, 0)
    assert vramguard.regions(heap).open == []


def test_track_on_a_generator_closed_early_is_one_call():
    heap = Heap(GiB)

    @vramguard.track("gen", device=heap)
    def forever():
        held = []
        try:
            while True:
                held.append(heap.malloc(2 * MiB))
                yield
        finally:  # runs at close(), inside the region
            for p in held:
                heap.free(p)

    gen = forever()
    next(gen)
    next(gen)
    gen.close()
    row = vramguard.regions(heap)["gen"]
    assert (row.calls, row.peak, row.live_at_exit) == (1, 4 * MiB, 0)
    assert vramguard.regions(heap).open == []


def test_track_on_a_coroutine_covers_its_body():
    import asyncio

    heap = Heap(GiB)

    @vramguard.track("coro", device=heap)
    async def work(n):
        p = heap.malloc(n)
        await asyncio.sleep(0)
        q = heap.malloc(n)
        heap.free(p)
        heap.free(q)
        return n

    async def main():
        task = asyncio.ensure_future(work(3 * MiB))
        await asyncio.sleep(0)  # the task is suspended, holding 3 MiB
        outside = heap.malloc(30 * MiB)
        heap.free(outside)
        return await task

    assert asyncio.run(main()) == 3 * MiB
    row = vramguard.regions(heap)["coro"]
    assert (row.calls, row.peak, row.allocated, row.live_at_exit) == (1, 6 * MiB, 6 * MiB, 0)


def test_track_refuses_an_async_generator_function():
    async def agen():
        yield 1

    with pytest.raises(TypeError, match="async generator"):
        vramguard.track("a", device=Heap(GiB))(agen)


def test_track_exit_without_enter_is_a_clear_error():
    heap = Heap(GiB)
    region = vramguard.track("r", device=heap)
    with pytest.raises(RuntimeError, match="without a matching __enter__"):
        region.__exit__(None, None, None)
    assert len(vramguard.regions(heap)) == 0


def test_track_exit_on_another_thread_closes_the_region():
    heap = Heap(GiB)
    region = vramguard.track("r", device=heap)
    region.__enter__()
    errors = []

    def other():
        try:
            region.__exit__(None, None, None)
        except RuntimeError as error:
            errors.append(str(error))

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert len(errors) == 1 and "did not enter it" in errors[0]
    table = vramguard.regions(heap)
    assert table.open == [] and len(table) == 0
    with pytest.raises(RuntimeError, match="without a matching __enter__"):
        region.__exit__(None, None, None)


def test_a_dead_heaps_target_dropped_by_the_collector_while_another_is_made(monkeypatch):
    """The collector may run a dead heap's weakref callback, which drops
    its target under the table's lock, in the very thread that holds that
    lock to make another heap's target: no deadlock (it hung once under
    Python 3.12), and the table keeps the live heap's target only."""
    import gc

    dead = Heap(GiB)
    tracked_heaps._heap_target(dead)
    cycle = [dead]
    cycle.append(cycle)          # only the collector frees it now
    dead_key = ("heap", id(dead))
    del dead, cycle
    original = _core.take_interval

    def take_interval(heap):     # called inside TrackedHeap(): the lock is held
        gc.collect()
        return original(heap)

    monkeypatch.setattr(tracked_heaps._core, "take_interval", take_interval)
    live = Heap(GiB)
    done = []
    worker = threading.Thread(target=lambda: done.append(tracked_heaps._heap_target(live)), daemon=True)
    worker.start()
    worker.join(timeout=30)
    assert done, "deadlocked"
    assert tracked_heaps._targets[("heap", id(live))][1] is done[0]
    assert dead_key == ("heap", id(live)) or dead_key not in tracked_heaps._targets
