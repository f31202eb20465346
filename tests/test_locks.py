"""Lock discipline seen from Python: no walk runs Python with the heap
locked, so a finalizer that frees into the heap, or a thread switch inside a
walk, cannot freeze the process. Each case runs in a child process with a
timeout, so a regression fails instead of hanging the test run."""
import subprocess
import sys
import textwrap

import pytest

# A hang, not a slow run: each script takes well under a second when it works.
HANG_SECONDS = 60


def run_script(body):
    script = textwrap.dedent(body)
    try:
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                              timeout=HANG_SECONDS)
    except subprocess.TimeoutExpired:
        pytest.fail(f"hung for {HANG_SECONDS} s (the heap lock was waited for by a thread "
                    "that the lock holder needed)")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_finalizer_freeing_into_the_heap_during_segments():
    # A cycle whose finalizer frees a block, as a CUDA tensor in a reference
    # cycle does through the torch free entry point. Every object segments()
    # creates can run the cyclic GC, hence the finalizer.
    out = run_script("""
        import gc
        from vramguard import Heap

        heap = Heap(1 << 30)
        class Holder:
            def __init__(self):
                self.addr = heap.malloc(4096)
                self.cycle = self
            def __del__(self):
                heap.free(self.addr)

        for p in [heap.malloc(1000) for _ in range(64)]:
            pass  # 64 live blocks: a walk creates a few hundred objects
        gc.disable()
        rounds = 0
        for _ in range(50):
            for _ in range(20):
                Holder()
            gc.enable()
            gc.set_threshold(1)
            segs = heap.segments()
            gc.set_threshold(700)
            gc.collect()
            rounds += 1
            gc.disable()
        heap.check()
        s = heap.stats()
        print(rounds, s["allocation.all.current"], s["num_invalid_frees"], len(segs))
    """)
    # Every Holder's block was freed (64 blocks stay live), none twice.
    assert out.split()[:3] == ["50", "64", "0"]


def test_thread_switch_inside_segments_while_another_reads_stats():
    # The finalizer touches no heap: it only lets the GIL go. The other
    # thread then takes the GIL and reads stats, which waits for the heap's
    # lock if the walk still holds it.
    out = run_script("""
        import gc, sys, threading, time
        from vramguard import Heap

        heap = Heap(1 << 30)
        live = [heap.malloc(1000 + 512 * i) for i in range(200)]
        class Garbage:
            def __init__(self):
                self.cycle = self
            def __del__(self):
                time.sleep(0)

        stop = False
        reads = 0
        def reader():
            global reads
            while not stop:
                heap.stats()
                reads += 1

        sys.setswitchinterval(1e-6)
        t = threading.Thread(target=reader)
        t.start()
        gc.set_threshold(1)
        walks = 0
        for _ in range(300):
            for _ in range(10):
                Garbage()
            heap.segments()
            walks += 1
        gc.set_threshold(700)
        stop = True
        t.join()
        heap.check()
        print(walks, len(heap.segments()[0]["blocks"]) > 0)
    """)
    assert out.split() == ["300", "True"]


def test_histogram_holds_every_class():
    # One call copies every class under the lock. Blocks of 1..300 units
    # of 512 B fill 31 one-unit classes, then 32 classes per power of two
    # (steps of 1, 2, 4 and 8 units): 31 + 32 * 3 + 6 = 133 classes.
    from vramguard import Heap

    heap = Heap(1 << 40)
    live = [heap.malloc(512 * (k + 1)) for k in range(300)]
    hist = heap.histogram()
    assert len(hist) == 133
    assert hist[:2] == [(512, 1), (1024, 1)]
    assert hist[-1] == (512 * 296, 5)  # 296..300 units
    assert sum(n for _, n in hist) == 300
    for p in live:
        heap.free(p)
    assert heap.histogram() == []


def replay_columns(pairs):
    # alloc id i, free id i, for i in 0..pairs-1, sizes cycling over 1..64 KiB.
    from array import array

    kinds = array("B", [1, 2] * pairs)
    ids = array("I", [i // 2 for i in range(2 * pairs)])
    sizes = array("Q", [(1 + (i // 2) % 64) << 10 if i % 2 == 0 else 0 for i in range(2 * pairs)])
    streams = array("Q", [0] * (2 * pairs))
    return kinds.tobytes(), ids.tobytes(), sizes.tobytes(), streams.tobytes(), pairs


def test_replay_lets_other_threads_run_and_refuses_the_heap_to_them():
    # A replay releases the GIL, so a thread waiting for it runs at once; it
    # finds the heap refused (the replay reads its counters as it goes), and
    # other heaps usable.
    import threading

    from vramguard import Heap

    heap, other = Heap(1 << 40), Heap(1 << 30)
    columns = replay_columns(200_000)
    seen = {"refused": None, "other_ops": 0}
    done = threading.Event()

    def neighbour():
        while not done.is_set() and seen["refused"] is None:
            other.free(other.malloc(4096))
            seen["other_ops"] += 1
            try:
                heap.stats()
            except RuntimeError as e:
                seen["refused"] = str(e)

    rounds = 0
    while seen["refused"] is None and rounds < 20:
        done.clear()
        t = threading.Thread(target=neighbour)
        t.start()
        r = heap.replay(*columns)
        done.set()
        t.join()
        rounds += 1
        assert (r["ops"], r["allocs"], r["frees"], r["ooms"]) == (400_000, 200_000, 200_000, 0)
    assert seen["refused"] is not None, "no thread ran during 20 replays"
    assert "replaying a trace in another thread" in seen["refused"]
    assert heap.stats()["allocation.all.current"] == 0
    heap.check()
    other.check()


def test_waiting_calls_from_many_threads():
    # synchronize and empty_cache release the GIL while they wait for the
    # device: four threads calling them between deferred frees, exact counts.
    import threading

    from vramguard import Heap

    heap = Heap(1 << 30)
    errors = []

    def worker(stream):
        try:
            for _ in range(200):
                p = heap.malloc(1 << 20, stream)
                heap.record_stream(p, stream + 100)
                heap.free(p)
                heap.synchronize()
                heap.empty_cache()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    s = heap.stats()
    assert (s["allocation.all.allocated"], s["num_deferred_frees"], s["active.all.current"]) == (800, 800, 0)
    assert s["num_empty_cache"] == 800
    heap.check()
