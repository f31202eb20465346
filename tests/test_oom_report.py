"""vramguard.last_oom(): report contents and advice ranking for constructed
situations (a leak, free memory in pieces, one tensor bigger than the
budget), on simulated device heaps, the path the installed allocator takes
(each in a fresh interpreter: simulated devices are set before first use)."""
import json
import subprocess
import sys
import textwrap

import pytest

import vramguard
from vramguard import Heap
from vramguard.report import oom as _oom_report
from vramguard.report import oom_advice

MiB, GiB = 1 << 20, 1 << 30

PRELUDE = """
import json, warnings
import vramguard
from vramguard import _core
MiB = 1 << 20
ARENA
_core.simulate_devices(1 << 30)
_core.configure_devices(256 * MiB, 0.0, 0.0)
h = _core.device_heap(0)
warnings.simplefilter("ignore")
out = {}

def oom(size):
    try:
        h.malloc(size)
    except MemoryError as e:
        return str(e)

def report():
    r = vramguard.last_oom()
    out["text"] = str(r)
    out["html"] = r._repr_html_()
    out["advice"] = [[a.key, a.saving, a.cause] for a in r.advice]
    for name in ("requested", "rounded", "live", "reserved", "cached", "free_bytes", "largest_free_block",
                 "free_blocks", "room", "available", "short_by", "activations", "budget", "limit",
                 "live_blocks", "live_by_class", "live_by_region", "device", "seq"):
        out[name] = getattr(r, name)
    return r
"""


def run(code, arena=None):
    """`arena` False: the device heap uses segments (a test of their pieces)."""
    prelude = PRELUDE.replace("ARENA", "" if arena is None else f"_core.use_arena({arena})")
    script = prelude + textwrap.dedent(code) + "\nprint('@@' + json.dumps(out))\n"
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = [l for l in proc.stdout.splitlines() if l.startswith("@@")][-1]
    return json.loads(line[2:])


def keys(out):
    return [key for key, _, _ in out["advice"]]


# ---------------------------------------------------------------- situations


def test_one_tensor_bigger_than_the_budget():
    out = run("""
        out["before"] = vramguard.last_oom() is None
        with vramguard.track("forward"):
            out["message"] = oom(300 * MiB)
        report()
        out["same"] = vramguard.last_oom() is vramguard.last_oom()
    """)
    assert out["before"] is True and out["same"] is True
    assert out["message"].startswith("Simulated device out of memory. Tried to allocate 300.00 MiB.")
    assert (out["requested"], out["rounded"], out["budget"], out["limit"]) == (300 * MiB, 300 * MiB, 256 * MiB,
                                                                              256 * MiB)
    assert (out["live"], out["reserved"], out["room"], out["available"]) == (0, 0, 256 * MiB, 256 * MiB)
    assert out["short_by"] == 44 * MiB and out["device"] == 0 and out["seq"] == 1
    assert keys(out)[0] == "too_big" and out["advice"][0][2] is True
    assert out["live_by_region"] == [["forward", 0, 0]]
    text = out["text"]
    assert text.splitlines()[0] == ("Out of memory on device 0: asked for 300.00 MiB (300.00 MiB as a block); "
                                    "the budget said no.")
    assert "1. One tensor is larger than the budget (no estimate)" in text
    # the allocator sees no dtype and no frame showed one: no 16-bit advice (a uint8
    # tensor gains nothing), no batch-halving figure, nothing listed as left out
    assert "autocast" not in text and "16 bits" not in text and "Not advised" not in text
    assert "150.00 MiB" not in text and "enough alone" not in text
    assert keys(out) == ["too_big"]
    assert "Short by: 44.00 MiB" in text
    assert "by line: vramguard.record(stacks=True) shows which lines" in text
    assert "<ol>" in out["html"] and "One tensor is larger than the budget" in out["html"]


def test_free_memory_in_pieces():
    out = run("""
        ps = [h.malloc(512 << 10) for _ in range(480)]     # 240 MiB in 120 segments of 2 MiB
        for p in ps[::2]:
            h.free(p)                                        # 120 MiB free in 512 KiB pieces
        with vramguard.track("forward"):
            x = h.malloc(8 * MiB)
            oom(100 * MiB)
        report()
    """, arena=False)
    assert (out["live"], out["reserved"], out["cached"]) == (128 * MiB, 248 * MiB, 120 * MiB)
    assert (out["free_bytes"], out["free_blocks"], out["largest_free_block"]) == (120 * MiB, 240, 512 << 10)
    assert (out["room"], out["short_by"]) == (8 * MiB, 92 * MiB)
    assert keys(out)[:2] == ["empty_cache", "arena"]
    assert out["advice"][0][1] == 120 * MiB - (512 << 10) and out["advice"][0][2] is True
    # the activations: what the region added (8 MiB) and the request
    assert out["activations"] == 108 * MiB
    # no tensor seen, no dtype known: no mixed precision; no estimated figure for the rest
    assert keys(out)[2:] == ["batch_size", "checkpointing", "accumulation", "no_grad"]
    assert [s for _, s, _ in out["advice"][2:]] == [None, None, None, None]
    assert out["live_by_class"][0] == [512 << 10, MiB, 240, 120 * MiB]
    assert out["live_by_region"] == [["forward", 8 * MiB, 128 * MiB]]
    text = out["text"]
    assert "Cached free: 120.00 MiB in 240 blocks, largest free block 512.00 KiB" in text
    assert "Cached free in pieces (1 - largest free block / cached free): 99.6%" in text
    assert "Non-releasable memory: 120.00 MiB" in text
    assert "So what: it matters now" in text
    # a fact, not a saving: freeing the tensors between the pieces frees them too
    assert "1. Free dead tensors, then empty_cache() (119.50 MiB cached free outside the largest free block)" in text
    assert "2. Use the arena: install(arena=True) (119.50 MiB cached free outside the largest free block)" in text
    assert "by region, forward: +8.00 MiB since it began" in text
    assert ("Not advised here:\n  Mixed precision (torch.autocast): vramguard saw no tensor in the failing call's "
            "function frames, so it does not know their dtypes (autocast changes only 32-bit floats; a training "
            "step in a function lets it see them).\n") in text
    assert "saves about" not in text and "enough alone" not in text


@pytest.mark.parametrize("classes, other", [(5, None), (6, "1 other class: 2.00 MiB in 1 block"),
                                             (7, "2 other classes: 3.00 MiB in 2 blocks")])
def test_every_live_byte_is_in_a_size_class_line(classes, other):
    """The five largest classes one a line, the rest counted in one; under
    the arena what is held is named as the error message names it."""
    out = run(f"""
        kept = [h.malloc((1 << k) * MiB) for k in range({7 - classes}, 7)]     # up to 64 MiB, a class each
        oom(200 * MiB)
        report()
    """)
    text = out["text"]
    shown = [line for line in text.splitlines() if line.startswith("  by size class,")]
    assert shown[:5] == [f"  by size class, {s}.00 MiB to {2 * s}.00 MiB: {s}.00 MiB in 1 block" for s in (64, 32, 16, 8, 4)]
    assert shown[5:] == ([f"  by size class, {other}"] if other else [])
    held = text.split("Cached (reserved but not allocated): ")[1].split("\n")[0]
    assert " mapped in " in held and " range" in held and "segment" not in held


@pytest.mark.parametrize("arena", [True, False])
def test_non_releasable_is_what_empty_cache_leaves(arena):
    """Free pieces beside live blocks: the report's non-releasable memory is
    exactly what stays cached after empty_cache() (under the arena, the free
    bytes of pages that hold live blocks)."""
    out = run("""
        ps = [h.malloc(512 << 10) for _ in range(16)]      # 8 MiB: 4 pages or segments
        for p in ps[::2]:
            h.free(p)                                       # 4 MiB free, every page still in use
        big = h.malloc(150 * MiB)
        oom(200 * MiB)
        r = report()
        out["non_releasable"] = r.non_releasable
        h.free(big)
        h.empty_cache()
        s = h.stats()
        out["left"] = s["reserved_bytes.all.current"] - s["allocated_bytes.all.current"]
    """, arena=arena)
    assert out["non_releasable"] == out["left"] == 4 * MiB
    assert "Non-releasable memory: 4.00 MiB" in out["text"]


def test_a_leak_comes_first():
    out = run("""
        kept = []
        for i in range(10):
            t = h.malloc(40 * MiB)
            kept.append(h.malloc(8 * MiB))                    # the leak: 8 MiB per step
            h.free(t)
            vramguard.step(0)
        a = h.malloc(100 * MiB)
        oom(100 * MiB)
        report()
    """)
    assert (out["live"], out["reserved"], out["room"]) == (180 * MiB, 180 * MiB, 76 * MiB)
    assert out["short_by"] == 24 * MiB
    assert out["activations"] == 200 * MiB           # 100 MiB since the last boundary, and the request
    assert keys(out)[0] == "leak" and out["advice"][0][1] == 72 * MiB and out["advice"][0][2] is True
    assert "empty_cache" not in keys(out) and "arena" not in keys(out)
    text = out["text"]
    # what the leak holds is measured; whether freeing it is enough only a run says
    assert "1. Fix the leak: +8.00 MiB per step (frees at least 72.00 MiB)" in text
    assert "enough alone" not in text
    assert "losses.append(loss)" in text
    assert "at the last step boundary (step 10): 80.00 MiB" in text


def test_an_evaluation_region_puts_no_grad_first_among_causes():
    out = run("""
        with vramguard.track("validation"):
            a = h.malloc(200 * MiB)
            oom(100 * MiB)
        report()
    """)
    assert keys(out)[0] == "no_grad" and out["advice"][0][1] == 300 * MiB


def test_a_batch_fit_names_the_largest_batch():
    out = run("""
        from vramguard.report import oom as _oom_report
        _oom_report.note_batch_fit(16 * MiB, 30 * MiB, batch=10)
        a = h.malloc(200 * MiB)
        oom(100 * MiB)
        report()
    """)
    assert keys(out)[0] == "batch_size"
    assert out["advice"][0][1] is None                  # a noted fit, no batch measured: no saving figure
    assert "1. Lower the batch size to 8 at most (no estimate)" in out["text"]   # (256 - 16) // 30 = 8
    assert "no batch was measured here" in out["text"]


def test_only_what_the_failing_step_added_is_activations():
    # a step boundary, then an old tensor, then a region that fails: the old
    # 100 MiB is the step's but not the region's, and the region holds the failure
    out = run("""
        vramguard.step(0)
        old = h.malloc(100 * MiB)
        with vramguard.track("train"):
            x = h.malloc(20 * MiB)
            oom(200 * MiB)
        report()
    """)
    assert out["activations"] == 220 * MiB            # 20 MiB added in 'train', and the request
    assert "region 'train' had added 220.00 MiB (with the request)" in out["text"]
    assert "the step under way had added" not in out["text"]


def test_a_batch_measured_to_fail_is_never_advised():
    out = run("""
        from vramguard.report import oom as _oom_report
        _oom_report.note_batch_fit(16 * MiB, 30 * MiB, batch=10, failed=[7, 9])
        a = h.malloc(200 * MiB)
        oom(100 * MiB)
        report()
    """)
    assert keys(out)[0] == "batch_size"
    assert out["advice"][0][1] is None                  # the fit says 8; 7 was measured to fail
    assert "Lower the batch size to 6 at most" in out["text"]
    assert "batch 7 was measured to run out of memory" in out["text"]


def test_a_batch_measured_to_fit_is_advised_as_measured():
    """Only a batch find_max_batch ran and saw fit is called measured, and
    never one above a batch measured to fail; the fit's line gives none."""
    out = run("""
        from vramguard.report import oom as _oom_report
        _oom_report.note_batch_fit(16 * MiB, 30 * MiB, batch=10, failed=[9], fitted=[4, 8])
        a = h.malloc(200 * MiB)
        oom(100 * MiB)
        report()
        out["first"] = out["text"]
        _oom_report.note_batch_fit(16 * MiB, 30 * MiB, batch=10, failed=[7, 9], fitted=[4, 8])
        oom(101 * MiB)
        report()
    """)
    first, second = out["first"], out["text"]
    assert "1. Lower the batch size to 8 at most (measured to fit)" in first      # the fit's 8, measured
    assert "Batch 8 was measured to fit in this step (find_max_batch); batch 9 was measured to run out" in first
    assert "1. Lower the batch size to 4 at most (measured to fit)" in second     # 8 is above the failed 7
    assert out["advice"][0][1] is None and "saves about" not in first + second


def test_the_arena_is_named_and_a_retry_counts_its_free_pages():
    """Under the arena the report says so, and the most one request could
    have had is the allocator's own figure (the message's): that request is
    then served, a page more is not."""
    out = run("""
        a = h.malloc(100 * MiB)
        b = h.malloc(100 * MiB)
        h.free(a)                                   # 100 MiB of free pages, unmapped by the failure
        oom(200 * MiB)
        r = report()
        out["arena"] = r.arena
        p = h.malloc(r.available)
        out["served"] = True
        h.free(p)
        out["more"] = oom(r.available + 2 * MiB) is not None
    """)
    assert out["arena"] is True
    assert (out["room"], out["available"], out["short_by"]) == (156 * MiB, 156 * MiB, 44 * MiB)
    assert "Short by: 44.00 MiB (the most one request could have had: 156.00 MiB)" in out["text"]
    assert out["served"] is True and out["more"] is True


def test_a_fit_of_another_step_gives_no_batch_figure():
    out = run("""
        from vramguard.report import oom as _oom_report
        def train_step(batch):
            pass
        _oom_report.note_batch_fit(16 * MiB, 30 * MiB, step=train_step)
        a = h.malloc(200 * MiB)
        oom(100 * MiB)                                    # not inside train_step
        report()
        out["other"] = out["text"]
        def train_step_fails():
            h.malloc(100 * MiB)
        _oom_report.note_batch_fit(16 * MiB, 30 * MiB, step=train_step_fails)
        try:
            train_step_fails()
        except MemoryError:
            out["own"] = str(vramguard.last_oom())
    """)
    assert "Lower the batch size to" not in out["other"]
    assert "Lower the batch size (no estimate)" in out["other"]
    assert "Lower the batch size to 8 at most" in out["own"]


def test_the_report_follows_the_last_oom():
    out = run("""
        oom(300 * MiB)
        first = vramguard.last_oom()
        oom(400 * MiB)
        second = vramguard.last_oom()
        out["seqs"] = [first.seq, second.seq]
        out["asked"] = [first.requested, second.requested]
        # a plain Heap's failure is an answer, not the allocator's OOM
        try:
            vramguard.Heap(1 << 30).malloc(2 << 30)
        except MemoryError:
            pass
        out["still"] = vramguard.last_oom().seq
    """)
    assert out["seqs"] == [1, 2] and out["asked"] == [300 * MiB, 400 * MiB] and out["still"] == 2


# ---------------------------------------------------------------- in this process


def test_no_oom_no_report():
    try:
        Heap(GiB).malloc(2 * GiB)  # a Heap's own: not recorded
    except MemoryError:
        pass
    assert vramguard.last_oom() is None


@pytest.mark.parametrize("args", [(-1, MiB), (0, 0), ("1", MiB), (0, float("nan")), (True, MiB), (0, MiB, 0),
                                  (0, MiB, 2.5)])
def test_note_batch_fit_refuses_bad_values(args):
    with pytest.raises(ValueError):
        _oom_report.note_batch_fit(*args)


def test_ranking_rule():
    A = oom_advice.Advice
    ranked = oom_advice.rank([
        A("autocast", "", "", 10), A("checkpointing", "", "", None), A("leak", "", "", 5, cause=True),
        A("batch_size", "Lower the batch size", "", 10), A("too_big", "", "", None, cause=True),
        A("empty_cache", "", "", 50, cause=True), A("accumulation", "", "", 20),
    ])
    assert [a.key for a in ranked] == ["too_big", "empty_cache", "leak", "accumulation", "batch_size", "autocast",
                                       "checkpointing"]


def test_lines_from_recorded_stacks():
    """With stacks recorded (trace/stacks.py: live_by_line, here a stand-in that
    reports one growing line), the leak and the report name the lines."""
    out = run("""
        import sys, types
        fake = types.ModuleType("vramguard.trace.stacks")
        held = {"n": 0}
        def live_by_line(device=None, top=5):
            return [("train.py:82 step", held["n"] * 8 * MiB, held["n"]), ("model.py:10 forward", 40 * MiB, 1)][:top]
        fake.live_by_line = live_by_line
        sys.modules["vramguard.trace.stacks"] = fake
        vramguard.trace.stacks = fake
        kept = []
        for i in range(12):
            kept.append(h.malloc(8 * MiB))
            held["n"] += 1
            vramguard.step(0)
        leak = vramguard.leak_check()
        out["leak_lines"] = leak.lines
        out["leak_text"] = str(leak)
        oom(300 * MiB)
        report()
    """)
    # first seen at step 8 (n = 8); four steps later the line had grown by 4 x 8 MiB
    assert out["leak_lines"] == [["train.py:82 step", 32 * MiB, 4]]
    assert "train.py:82 step: +32.00 MiB in 4 blocks" in out["leak_text"]
    # the headline counts from step 1, the lines from step 8 where stacks were first compared: both said
    assert "(since step 1, 88.00 MiB so far; " in out["leak_text"]
    assert "What accumulates, by line (from step 8 to step 12):\n  train.py:82 step" in out["leak_text"]
    assert "by line, train.py:82 step: 96.00 MiB in 12 blocks" in out["text"]
    assert "record(stacks=True) shows which lines" not in out["text"]


def test_equal_leaks_read_between_boundaries_grow_alike():
    """Two lines leaking 256 KiB a step each, the leak looked at in the
    middle of a step (one line's tensor of the step made, the other's not
    yet): each line's growth is counted between step boundaries, so both
    read the same."""
    out = run("""
        import sys, types
        fake = types.ModuleType("vramguard.trace.stacks")
        held = {"a": 0, "b": 0}
        def live_by_line(device=None, top=5):
            rows = [("train.py:5 a", held["a"] * 256 * 1024, held["a"]), ("train.py:6 b", held["b"] * 256 * 1024, held["b"])]
            return sorted(rows, key=lambda r: -r[1])[:top]
        fake.live_by_line = live_by_line
        sys.modules["vramguard.trace.stacks"] = fake
        vramguard.trace.stacks = fake
        kept = []
        for i in range(12):
            kept.append(h.malloc(256 << 10)); held["a"] += 1
            kept.append(h.malloc(256 << 10)); held["b"] += 1
            vramguard.step(0)
        kept.append(h.malloc(256 << 10)); held["a"] += 1          # step 13 under way: a's, not yet b's
        leak = vramguard.leak_check()
        out["lines"] = leak.lines
        out["text"] = str(leak)
    """)
    (a, a_bytes, a_blocks), (b, b_bytes, b_blocks) = sorted(out["lines"])
    assert (a_bytes, a_blocks) == (b_bytes, b_blocks) == (4 * 256 << 10, 4)    # steps 8 to 12
    assert "What accumulates, by line (from step 8 to step 12):" in out["text"]


def test_a_leak_first_seen_as_stacks_begin_lists_no_line():
    """Stacks recorded only from the step the leak is first seen: no earlier
    boundary to compare with, so no line is called accumulating (the
    largest holder now may be the batch, replaced each step)."""
    out = run("""
        import sys, types
        fake = types.ModuleType("vramguard.trace.stacks")
        held = {"n": 0}
        def live_by_line(device=None, top=5):
            if held["n"] < 8:
                raise RuntimeError("not recording")
            return [("train.py:5 batch", 64 * MiB, 1), ("train.py:6 loss", held["n"] * MiB, held["n"])][:top]
        fake.live_by_line = live_by_line
        sys.modules["vramguard.trace.stacks"] = fake
        vramguard.trace.stacks = fake
        kept = []
        for i in range(8):
            kept.append(h.malloc(MiB))
            held["n"] += 1
            vramguard.step(0)
        out["first"] = str(vramguard.leak_check())
        kept.append(h.malloc(MiB))
        held["n"] += 1
        vramguard.step(0)
        out["next"] = str(vramguard.leak_check())
    """)
    assert ("What accumulates, by line:\n  which lines accumulate shows after another step with stacks recorded "
            "(vramguard compares each line's live memory between step boundaries)\n") in out["first"]
    assert "batch" not in out["first"]
    # the lines' growth is counted from the step the leak was first seen, and says so
    assert ("What accumulates, by line (from step 8 to step 9):\n  train.py:6 loss: +1.00 MiB in 1 block\nUsual"
            in out["next"])
