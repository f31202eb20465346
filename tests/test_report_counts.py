"""Every report at counts 0, 1 and 2: the summary, the replay report, the
OOM report (and the exception's message), regions, leaks, the demo, and the
reprs a notebook shows. One rule (render/words.py) says "1 block", "2
blocks", "an 8.00 GiB device", "an L4": no report may print "1 blocks" or
"a 8.00 GiB device". Exact sentences for the main lines; a pattern over the
whole output besides, for the lines nobody thought to list."""
import json
import pickle
import re
import subprocess
import sys
import textwrap

import pytest

import vramguard
from vramguard import Heap, Trace, format_size, format_summary, load_trace, replay
from vramguard.report.demo import run_demo
from vramguard.report.leak import Leak
from vramguard.report.replay_report import format_replay_report, replay_report

MiB, GiB = 1 << 20, 1 << 30

# "1" then a plural ("1 blocks", "1 ranges reserved"); the words ending in
# s that are not plurals are let through.
_ONE_PLURAL = re.compile(r"(?<![\d.,\-+x])1 (?!(?:is|was|has|does|its|as|plus|this)\b)([a-z][a-z\-]*s)\b")
# "a" before a word read with a vowel sound: "a 8.00 GiB", "a 11 GB", "a L4", "a H200".
_WRONG_ARTICLE = re.compile(r"\b[Aa] (?:8|11\b|18\b|[AEFHILMNORSX]\d|[AEFHILMNORSX]{2,4}\b)")


def assert_good_english(text):
    assert not _ONE_PLURAL.findall(text), _ONE_PLURAL.findall(text)
    assert not _WRONG_ARTICLE.findall(text), _WRONG_ARTICLE.findall(text)


def test_the_patterns_catch_what_they_are_for():
    for bad in ("in 1 blocks", "1 ranges reserved", "in 1 segments", "read device values back 1 times",
                "on a 8.00 GiB device", "on a L4", "on a H200", "(a L4's usable memory)", "Under a 8.00 MiB budget"):
        with pytest.raises(AssertionError):
            assert_good_english(bad)
    assert_good_english("in 1 block, 2 blocks, 11 blocks, 1.00 GiB, 21 ranges; on an 8.00 GiB device, a T4, an L4")


# ---------------------------------------------------------------- the summary


def heap_with(n, policy):
    """A heap holding `n` small blocks, each alone in its own 2 MiB segment
    (range, under the arena) with one free block beside it."""
    heap = Heap(8 * GiB, policy=policy)
    pairs = [(heap.malloc(MiB), heap.malloc(MiB)) for _ in range(n)]
    for _, spare in pairs:
        heap.free(spare)
    return heap, [kept for kept, _ in pairs]


@pytest.mark.parametrize("policy", ["arena", "segments"])
@pytest.mark.parametrize("n", [0, 1, 2])
def test_summary_at_counts_0_1_2(n, policy):
    heap, kept = heap_with(n, policy)
    stats = heap.stats()
    text, verbose = format_summary(stats), format_summary(stats, verbose=True)
    assert_good_english(text)
    assert_good_english(verbose)
    held = "mapped" if policy == "arena" else "reserved"
    if n == 0:
        assert text == f"vramguard memory summary (no budget on an 8.00 GiB device): nothing allocated, nothing {held}"
        assert verbose.splitlines()[1].strip("| ") == "vramguard memory summary (no budget on an 8.00 GiB device)"
        return
    blocks = {1: "1 block", 2: "2 blocks"}[n]
    assert f"| Cached free: {n}.00 MiB in {blocks}, largest free block 1.00 MiB " in text
    if policy == "arena":
        # the small blocks share one range (one per stream and pool), a page each
        assert "| Memory: arena, 2.00 MiB pages; 1 range reserved, 0 released " in text
        # its provider calls are counters: the verbose form's
        assert f"| maps {n} ({n} page{'s' if n > 1 else ''}), unmaps 0 (0 pages), " in verbose
        assert "| maps " not in text
    assert "cache hits" not in text and "cache hits" in verbose
    for p in kept:
        heap.free(p)
    heap.empty_cache()
    # empty again: one line, with the peaks it had
    assert format_summary(heap.stats()) == (
        f"vramguard memory summary (no budget on an 8.00 GiB device): nothing allocated, nothing {held}; "
        f"peak allocated {2 * n}.00 MiB, peak {held} {2 * n}.00 MiB")


@pytest.mark.parametrize("ooms, text", [
    (0, None), (1, "So far: 1 out-of-memory error"), (2, "So far: 2 out-of-memory errors")])
def test_the_summary_says_what_went_wrong_at_counts_0_1_2(ooms, text):
    heap = Heap(GiB, budget=4 * MiB)
    p = heap.malloc(MiB)
    for _ in range(ooms):
        with pytest.raises(MemoryError):
            heap.malloc(8 * MiB)
    lines = [line.strip("| ") for line in format_summary(heap.stats()).splitlines()]
    assert [line for line in lines if line.startswith("So far")] == ([text] if text else [])
    heap.free(p)
    heap.empty_cache()
    one = format_summary(heap.stats())
    assert one.endswith("; so far " + text[len("So far: "):]) if text else "so far" not in one


@pytest.mark.parametrize("device, text", [
    (8 * GiB, "on an 8.00 GiB device"), (11 * 10**9, "on a 10.24 GiB device"), (80 * GiB, "on an 80.00 GiB device"),
    (18 * GiB, "on an 18.00 GiB device"), (16 * GiB, "on a 16.00 GiB device")])
def test_the_summary_title_has_the_right_article(device, text):
    assert f"(no budget {text})" in format_summary(Heap(device).stats())


def test_one_byte_is_a_byte():
    assert [format_size(n) for n in (0, 1, 2, 1023)] == ["0 bytes", "1 byte", "2 bytes", "1023 bytes"]


# ---------------------------------------------------------------- the replay report


def lone_trace(n_live, request):
    """`n_live` tensors of 3 MiB, then one of `request` bytes."""
    t = Trace(f"live{n_live}")
    for _ in range(n_live):
        t.alloc(3 * MiB)
    t.alloc(request)
    return t


@pytest.mark.parametrize("n, phrase", [(0, "0 bytes live then in 0 allocations"),
                                       (1, "3.00 MiB live then in 1 allocation"),
                                       (2, "6.00 MiB live then in 2 allocations")])
def test_replay_report_at_counts_0_1_2(n, phrase):
    t = lone_trace(n, 10 * MiB)
    text = format_replay_report(replay_report(t, "8MiB"))
    assert_good_english(text)
    lines = text.splitlines()
    assert lines[0].startswith(f"Trace live{n}: {n + 1} op{'s' if n else ''}, replayed at ")
    assert lines[1] == "Under an 8.00 MiB budget with the vramguard policy: DOES NOT FIT"
    assert lines[2].startswith(f"  first OOM at op {n}: 10.00 MiB asked, {phrase}")
    result = replay(t, "8MiB")
    assert repr(result).endswith(f", {n + 1} op{'s' if n else ''})")
    assert str(result.first_oom_at) == (f"op {n}: an allocation of 10.00 MiB, with {phrase.replace(' then', '')}"
                                        + ("; largest live: " + ", ".join(["3.00 MiB (op 0)", "3.00 MiB (op 1)"][:n])
                                           if n else ""))
    assert repr(t) == f"<Trace 'live{n}': {n + 1} op{'s' if n else ''}, {n + 1} allocation{'s' if n else ''}>"


@pytest.mark.parametrize("budget, text", [
    ("L4", "Under an L4 (21.57 GiB usable) budget"), ("T4", "Under a T4 (14.35 GiB usable) budget"),
    ("H100-80GB", "Under an H100-80GB (78.80 GiB usable) budget"), ("18GiB", "Under an 18.00 GiB budget"),
    ("16GiB", "Under a 16.00 GiB budget")])
def test_replay_report_budget_has_the_right_article(budget, text):
    out = format_replay_report(replay_report(lone_trace(1, MiB), budget))
    assert out.splitlines()[1] == f"{text} with the vramguard policy: FITS"


def snapshot_of(n_events, tmp_path):
    """A snapshot of `n_events` alloc events (at least 1)."""
    events = [{"action": "alloc", "addr": 0x10000000 + i * MiB, "size": MiB, "stream": 0} for i in range(n_events)]
    path = tmp_path / f"s{n_events}.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [events]}))
    return load_trace(path)


@pytest.mark.parametrize("n", [1, 2])
def test_replay_report_counts_the_snapshots_events(n, tmp_path):
    first = format_replay_report(replay_report(snapshot_of(n, tmp_path))).splitlines()[0]
    events = "1 snapshot event" if n == 1 else "2 snapshot events"
    assert first.startswith(f"Trace s{n}: {n} op{'s' if n > 1 else ''} from {events}, replayed at ")


# ---------------------------------------------------------------- the demo


@pytest.mark.parametrize("steps", [1, 2])
@pytest.mark.parametrize("capacity, device", [
    ("T4", "a simulated 14.35 GiB device (a T4's usable memory)"),
    ("L4", "a simulated 21.57 GiB device (an L4's usable memory)"),
    ("H100-80GB", "a simulated 78.80 GiB device (an H100-80GB's usable memory)"),
    ("8GiB", "a simulated 8.00 GiB device")])
def test_demo_at_counts_1_2(steps, capacity, device):
    lines = []
    run_demo(capacity=capacity, steps=steps, out=lines.append)
    text = "\n".join(lines)
    assert_good_english(text)
    assert lines[0] == (f"Synthetic training loop: GPT-like, 12 layers, hidden 768, batch 8, sequence 512, "
                        f"{steps} step{'s' if steps > 1 else ''}, on {device}.")
    name = f"synthetic-gpt-train-batch8-{steps}step{'s' if steps > 1 else ''}"
    assert f"\nTrace {name}: " in text


def test_the_demo_and_the_example_trace_have_different_true_names():
    lines = []
    run_demo(out=lines.append)
    header = next(line for line in lines if line.startswith("Trace "))
    assert header.startswith("Trace synthetic-gpt-train-batch8-5steps: 2,764 ops, ")
    assert "Physical limit (peak live tensors): 5.71 GiB" in lines[-1]
    example = vramguard.example_trace()
    assert repr(example) == "<Trace 'synthetic-gpt-train-batch25-3steps': 1,892 ops, 1,238 allocations>"
    assert format_size(example.peak_live()) == "13.92 GiB"
    assert example.meta["recipe"].startswith("vramguard.report.demo.EXAMPLE: steps=3, ")


# ---------------------------------------------------------------- regions and leaks


@pytest.mark.parametrize("n", [0, 1, 2])
def test_regions_at_counts_0_1_2(n):
    heap = Heap(GiB)
    for _ in range(n):
        with vramguard.track("forward", device=heap):
            heap.free(heap.malloc(MiB))
    text = str(vramguard.regions(heap))
    assert_good_english(text)
    if n == 0:
        assert text == 'No region has closed yet: wrap code in `with vramguard.track("name"):`.'
    else:
        assert text.splitlines()[2].split() == ["forward", str(n), "1.00", "MiB", "0", "bytes", f"{n}.00", "MiB"]


@pytest.mark.parametrize("blocks, text", [(0, "in 0 blocks"), (1, "in 1 block"), (2, "in 2 blocks")])
def test_leak_lines_at_counts_0_1_2(blocks, text):
    leak = Leak(8 * MiB, 3, 10, 56 * MiB, 80 * MiB, lines=[("train.py:82 step", 56 * MiB, blocks)])
    assert str(leak).splitlines()[2] == f"  train.py:82 step: +56.00 MiB {text}"
    assert_good_english(str(leak))


# ---------------------------------------------------------------- the OOM report, on simulated devices

OOM_SCRIPT = """
import json, sys, types, warnings
import vramguard
from vramguard import _core
MiB = 1 << 20
n, arena = {n}, {arena}
_core.use_arena(arena)
_core.simulate_devices(8 << 30)
_core.configure_devices({budget}, 0.0, 0.0)
h = _core.device_heap(0)
warnings.simplefilter("ignore")
# `n` blocks that each line holds, read as a recording with stacks would give them
fake = types.ModuleType("vramguard.trace.stacks")
fake.live_by_line = lambda device=None, top=5: [("train.py:82 step", n * MiB, n)] if n else []
sys.modules["vramguard.trace.stacks"] = fake
vramguard.trace.stacks = fake
# `n` live blocks, each alone in its 2 MiB segment with one free block beside it
pairs = [(h.malloc(MiB), h.malloc(MiB)) for _ in range(n)]
for _, spare in pairs:
    h.free(spare)
try:
    h.malloc({request})
except MemoryError as e:
    message = str(e)
print("@@" + json.dumps({{"message": message, "report": str(vramguard.last_oom())}}))
"""


def oom_texts(n, arena, budget=256 * MiB, request=300 * MiB):
    script = textwrap.dedent(OOM_SCRIPT.format(n=n, arena=arena, budget=budget, request=request))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.split("@@", 1)[1])


@pytest.mark.parametrize("arena", [False, True])
@pytest.mark.parametrize("n", [0, 1, 2])
def test_oom_report_at_counts_0_1_2(n, arena):
    out = oom_texts(n, arena)
    assert_good_english(out["message"])
    assert_good_english(out["report"])
    lines = out["report"].splitlines()
    blocks = ["0 blocks", "1 block", "2 blocks"][n]
    assert "Budget: 256.00 MiB budget on an 8.00 GiB device; " in out["report"]
    assert f"Live: {f'{n}.00 MiB' if n else '0 bytes'} in {blocks}" in lines
    if n:
        assert f"  by size class, 1.00 MiB to 2.00 MiB: {n}.00 MiB in {blocks}" in lines
        assert f"  by line, train.py:82 step: {n}.00 MiB in {blocks}" in lines
    if not arena:  # (the arena counts its ranges, the large pool's too)
        cached, reserved = (f"{n}.00 MiB", f"{2 * n}.00 MiB") if n else ("0 bytes", "0 bytes")
        held = ["0 segments", "1 segment", "2 segments"][n]
        assert f"Cached (reserved but not allocated): {cached} of {reserved} reserved in {held}" in lines
    else:
        assert " mapped in 1 range, " in out["message"] if n == 0 else " mapped in 2 ranges, " in out["message"]
    assert any(line.startswith(f"Cached free: ") and f" in {blocks}, largest free block " in line for line in lines)


def test_oom_report_free_pieces():
    # two live blocks with a free block beside each, and a budget that holds only those two segments
    out = oom_texts(2, False, budget=4 * MiB, request=3 * MiB // 2)
    assert_good_english(out["report"])
    assert "2.00 MiB was cached free in 2 pieces between live tensors, the largest 1.00 MiB" in out["report"]


@pytest.mark.parametrize("ooms, searched, said", [
    (0, 0, None),
    (1, 0, "So far: 1 out-of-memory error"),
    (1, 1, "So far: 1 out-of-memory error (a find_max_batch try)"),
    (5, 5, "So far: 5 out-of-memory errors (all find_max_batch's tries)"),
    (5, 1, "So far: 5 out-of-memory errors (of which 1 was a find_max_batch try)"),
    (5, 4, "So far: 5 out-of-memory errors (of which 4 were find_max_batch's tries)"),
    (2, 9, "So far: 2 out-of-memory errors (all find_max_batch's tries)"),
])
def test_the_summary_says_which_oom_errors_were_the_search_s(ooms, searched, said):
    from vramguard.render.summary import SEARCH_OOMS

    stats = Heap(GiB).stats()
    stats.update({"allocated_bytes.all.current": 1, "num_ooms": ooms, SEARCH_OOMS: searched})
    text = format_summary(stats)
    assert_good_english(text)
    lines = [line.strip("| ") for line in text.splitlines() if "So far" in line]
    assert lines == ([said] if said else [])
