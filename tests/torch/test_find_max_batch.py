"""find_max_batch with the real PyTorch on the fake CUDA (one 1 GiB
device): a step that allocates 16 MiB plus 4 MiB per sample. Whole 2 MiB
granules, so each tensor's segment is its own size and the largest batch
under a budget B is exactly (B - 16 MiB) / 4 MiB."""
import pytest

from fakegpu import run

pytestmark = pytest.mark.torch

MiB = 1 << 20

STEP = """
FIXED, PER_SAMPLE = 16 * MiB, 4 * MiB

def step(batch):
    workspace = torch.empty(FIXED, dtype=torch.uint8, device="cuda")
    activations = torch.empty(PER_SAMPLE * batch, dtype=torch.uint8, device="cuda")

def tries(result):
    return [[t.batch, t.fits, t.peak] for t in result.tries]
"""


def test_largest_batch_under_a_budget_and_the_fit():
    out = run(STEP, """
        vramguard.install(budget="512MiB")
        r = vramguard.find_max_batch(step, budget="256MiB", progress=False)
        out["largest"] = r.largest
        out["tries"] = tries(r)
        out["fit"] = [r.fit.fixed, r.fit.per_sample, r.fit.residual, r.fit.points]
        out["repr"] = repr(r)
        out["budget_after"] = heap()["budget_bytes"]
        out["live_after"] = torch.cuda.memory_allocated()
        out["reserved_after"] = torch.cuda.memory_reserved()
        out["ooms"] = heap()["num_ooms"]
        from vramguard.report import oom_notes
        out["noted_fit"] = list(oom_notes.noted_fit()[0])
    """, devices=1, mem="1GiB")
    assert out["largest"] == 60                                    # 16 + 4 x 60 = 256 MiB
    fits = lambda b: [b, True, (16 + 4 * b) * MiB]  # noqa: E731
    oom = lambda b: [b, False, 16 * MiB]  # noqa: E731  the workspace, then the activations fail
    assert out["tries"] == [fits(1), fits(2), fits(4), fits(8), fits(16), fits(32), oom(64),
                            fits(48), fits(56), fits(60), oom(62), oom(61)]
    assert out["fit"] == [16 * MiB, 4 * MiB, 0.0, 9]
    assert out["repr"].splitlines()[:2] == [
        "find_max_batch: largest batch 60 under a budget of 256.00 MiB",
        "  memory = 4.00 MiB x batch + 16.00 MiB (residual 0 bytes, 9 points)",
    ]
    assert out["budget_after"] == 512 * MiB                        # the budget before, put back
    assert out["live_after"] == 0 and out["reserved_after"] == 0  # recovered after the last try
    assert out["ooms"] == 3
    assert out["noted_fit"] == [16 * MiB, 4 * MiB, None]          # for the OOM report's advice


def test_without_a_budget_the_device_is_the_limit():
    out = run(STEP, """
        vramguard.install()
        r = vramguard.find_max_batch(step, start=100, tolerance=0, progress=False)
        out["largest"] = r.largest
        out["batches"] = [t.batch for t in r.tries]
        out["budget_after"] = heap()["budget_bytes"]
    """, devices=1, mem="1GiB")
    assert out["largest"] == 252                                   # 16 + 4 x 252 = 1024 MiB
    assert out["batches"] == [100, 200, 400, 300, 250, 275, 262, 256, 253, 251, 252]
    assert out["budget_after"] == 0


def test_runtime_errors_and_limit():
    """With oom_error="runtime" the OOM is a RuntimeError, still caught; a
    limit below the largest batch ends the search there."""
    out = run(STEP, """
        vramguard.install(oom_error="runtime")
        r = vramguard.find_max_batch(step, budget="128MiB", progress=False)
        out["largest"] = r.largest
        out["errors"] = sorted({t.error.split(".")[0] for t in r.tries if not t.fits})
        r = vramguard.find_max_batch(step, limit=10, budget="128MiB", progress=False)
        out["limited"] = [r.largest, [t.batch for t in r.tries]]
    """, devices=1, mem="1GiB")
    assert out["largest"] == 28                                    # 16 + 4 x 28 = 128 MiB
    assert out["errors"] == ["CUDA out of memory"]
    assert out["limited"] == [10, [1, 2, 4, 8, 10]]


def test_bad_budget_is_refused_before_any_try():
    out = run(STEP, """
        vramguard.install()
        calls = []
        out["error"] = error(vramguard.find_max_batch, calls.append, budget=15, progress=False)
        out["calls"] = calls
    """, devices=1, mem="1GiB")
    assert out["error"][0] == "ValueError" and "15" in out["error"][1]
    assert out["calls"] == []


def test_garbage_is_collected_only_after_a_try_that_left_memory_allocated():
    """A full collection costs about half a second with PyTorch loaded:
    tries whose tensors went with their step collect nothing; a step that
    leaves its tensors in a reference cycle is collected after, and every
    try still starts from the same allocated bytes."""
    out = run(STEP, """
        import gc
        collections = []
        real_collect = gc.collect
        gc.collect = lambda *a: collections.append(1) or real_collect(*a)
        vramguard.install()
        r = vramguard.find_max_batch(step, limit=8, progress=False)
        out["clean"] = [len(collections), r.largest, tries(r)]
        del collections[:]

        def cyclic_step(batch):
            holder = {"t": torch.empty(PER_SAMPLE * batch, dtype=torch.uint8, device="cuda")}
            holder["self"] = holder                 # freed only by the collector
        gc.disable()                                # no collection but the recovery's
        r = vramguard.find_max_batch(cyclic_step, limit=4, progress=False)
        out["cyclic"] = [len(collections), tries(r), torch.cuda.memory_allocated()]
    """, devices=1, mem="1GiB")
    fits = lambda b: [b, True, (16 + 4 * b) * MiB]  # noqa: E731
    assert out["clean"] == [0, 8, [fits(1), fits(2), fits(4), fits(8)]]
    assert out["cyclic"] == [3, [[1, True, 4 * MiB], [2, True, 8 * MiB], [4, True, 16 * MiB]], 0]


def test_the_sessions_peaks_are_left_as_they_were():
    """The tries reach 256 MiB; the session had reached 80 MiB (64 MiB
    freed, 16 MiB kept): afterwards PyTorch's peaks, vramguard's stats and
    the summary read 80 MiB, as if the search had not run, and a new
    allocation raises them from there."""
    out = run(STEP, """
        vramguard.install()
        a = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
        kept = torch.empty(16 * MiB, dtype=torch.uint8, device="cuda")
        del a
        before = torch.cuda.memory_stats()
        r = vramguard.find_max_batch(step, budget="256MiB", progress=False)
        after = torch.cuda.memory_stats()
        out["largest"] = r.largest
        out["tries_peaks"] = max(t.peak for t in r.tries)
        out["max_allocated"] = torch.cuda.max_memory_allocated()
        out["max_reserved"] = torch.cuda.max_memory_reserved()
        out["peaks_changed"] = sorted(k for k in before if k.endswith(".peak") and before[k] != after[k])
        out["stats_peak"] = vramguard.stats()["allocated_bytes.all.peak"]
        rows = {line.split("|")[1].strip(): line.split("|")[3].strip() for line in vramguard.summary().splitlines()
                if line.count("|") == 6}
        out["summary_peaks"] = [rows["Allocated memory"], rows["Mapped memory"]]  # the Peak Usage column
        more = torch.empty(100 * MiB, dtype=torch.uint8, device="cuda")
        out["max_after_more"] = torch.cuda.max_memory_allocated()
    """, devices=1, mem="1GiB")
    assert out["largest"] == 56 and out["tries_peaks"] == 256 * MiB  # 16 kept + 16 + 4 x 56
    assert out["max_allocated"] == 80 * MiB
    assert out["max_reserved"] == 80 * MiB
    assert out["peaks_changed"] == []
    assert out["stats_peak"] == 80 * MiB
    assert out["summary_peaks"] == ["80.00 MiB", "80.00 MiB"]
    assert out["max_after_more"] == 116 * MiB                        # raised from there: 16 kept + 100


def test_a_budget_larger_than_the_device_is_said():
    """budget="2GiB" on a 1 GiB device: the answer is the device's, and the
    result and the log say so."""
    out = run(STEP, """
        import logging
        records = []
        handler = logging.Handler()
        handler.emit = lambda record: records.append(record.getMessage())
        logging.getLogger("vramguard").addHandler(handler)
        vramguard.install()
        r = vramguard.find_max_batch(step, start=100, budget="2GiB", tolerance=0, progress=False)
        out["largest"] = r.largest
        out["headline"] = repr(r).splitlines()[0]
        out["warned"] = [m for m in records if "larger than" in m]
        r = vramguard.find_max_batch(step, start=100, budget="512MiB", tolerance=0, progress=False)
        out["within"] = repr(r).splitlines()[0]
        r = vramguard.find_max_batch(step, start=1000, progress=False)
        out["nothing"] = repr(r).splitlines()[0]
    """, devices=1, mem="1GiB", VG_FAKECUDA_NAME="Tesla T4")
    sentence = ("the budget of 2.00 GiB is larger than the device's 1.00 GiB (Tesla T4): the device is the limit, "
                "not the budget")
    assert out["largest"] == 252
    assert out["headline"] == f"find_max_batch: largest batch 252 on the device ({sentence})"
    assert out["warned"] == [f"find_max_batch: {sentence}"]
    assert out["within"] == "find_max_batch: largest batch 124 under a budget of 512.00 MiB"
    assert out["nothing"] == "find_max_batch: not even batch 1000 fits: pass a smaller start (start=1000 now)"


def test_another_error_stops_the_search_and_leaves_no_probe_open():
    out = run(STEP, """
        vramguard.install()
        from vramguard.report import tracked_heaps
        def broken(batch):
            if batch > 2:
                raise KeyError("not memory")
        out["error"] = error(vramguard.find_max_batch, broken, progress=False)
        out["open"] = len(tracked_heaps.tracked_heap(0).open)
    """, devices=1, mem="1GiB")
    assert out["error"] == ["KeyError", "'not memory'"]
    assert out["open"] == 0
