"""The emulation of expandable segments (vramguard.replay(policy=
"torch-expandable")) against the real thing: PyTorch's own allocator with
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, on the fake CUDA, running
the same sequence of torch.empty / del / empty_cache. After every step,
memory_reserved() (the mapped pages), memory_allocated() and the map and
unmap counts (num_device_alloc / num_device_free) must be what the emulation
says, byte for byte."""
import json

import pytest

from fakegpu import MiB, run

# torch_version: runs in the CUDA 12 tier too (docs/development.md)
pytestmark = [pytest.mark.torch, pytest.mark.torch_version]

# A step: ("alloc", name, bytes, stream), ("free", name) or ("empty_cache",).
# Stream 0 is the default stream; 1 and 2 are side streams.
SCRIPT = """
steps = json.loads(%r)
streams = {0: torch.cuda.current_stream(), 1: torch.cuda.Stream(), 2: torch.cuda.Stream()}
live, after = {}, []
for step in steps:
    if step[0] == "alloc":
        with torch.cuda.stream(streams[step[3]]):
            try:
                live[step[1]] = torch.empty(step[2], dtype=torch.uint8, device="cuda")
            except torch.OutOfMemoryError:
                pass
    elif step[0] == "free":
        live.pop(step[1], None)
    else:
        torch.cuda.empty_cache()
    stats = torch.cuda.memory_stats()
    after.append([torch.cuda.memory_reserved(), torch.cuda.memory_allocated(),
                  stats["num_device_alloc"], stats["num_device_free"], stats["num_ooms"],
                  stats["num_alloc_retries"]])
out["after"] = after
"""


def in_torch(steps, mem="1GiB"):
    """What PyTorch itself shows after each step, on a device of `mem`."""
    out = run(SCRIPT % json.dumps(steps), devices=1, mem=mem,
              PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
    return out["after"]


def emulated(steps, budget=0):
    """The same figures from the emulation, replaying the steps one by one."""
    import vramguard
    from vramguard import _core

    trace, ids = vramguard.Trace("steps"), {}
    for step in steps:
        if step[0] == "alloc":
            ids[step[1]] = trace.alloc(step[2], stream=step[3])
        elif step[0] == "free":
            trace.free(ids.pop(step[1]))
        else:
            trace.empty_cache()
    after = []
    for n in range(1, len(steps) + 1):
        prefix = vramguard.Trace("prefix")
        for column in ("kinds", "ids", "sizes", "streams"):
            getattr(prefix, column).extend(getattr(trace, column)[:n])
        prefix.nids = sum(1 for kind in prefix.kinds if kind == 1)  # ids are dense, in order
        r = _core.expandable_replay(*prefix.columns(), prefix.nids, budget=budget, samples=n)
        reserved, allocated = r["curve"][-1][3], r["curve"][-1][2]
        after.append([reserved, allocated, r["map_calls"], r["unmap_calls"], r["ooms"],
                      r["alloc_retries"]])
    return after


def compare(steps, mem="1GiB", budget=0):
    real, ours = in_torch(steps, mem), emulated(steps, budget)
    for i, (a, b) in enumerate(zip(real, ours)):
        assert a == b, f"after step {i} {steps[i]}: PyTorch {a}, emulation {b}"
    return real


def test_page_rounding_and_the_small_pool():
    real = compare([
        ["alloc", "a", MiB + 1, 0],        # large pool: one 20 MiB page
        ["alloc", "b", 512 * 1024, 0],     # small pool: one 2 MiB page
        ["alloc", "c", 1, 0],
        ["free", "b"],
        ["alloc", "d", 19 * MiB, 0],       # the large page's rest is 19 MiB - 512
        ["free", "a"], ["free", "c"], ["free", "d"],
        ["empty_cache"],
    ])
    assert real[2][0] == 22 * MiB
    assert real[4][0] == 42 * MiB
    assert real[-1][0] == 0


def test_free_in_the_middle_then_allocate_bigger():
    real = compare([
        ["alloc", "a", 8 * MiB, 0],
        ["alloc", "b", 8 * MiB, 0],
        ["alloc", "c", 8 * MiB, 0],       # grows the segment by a page
        ["free", "b"],                     # an 8 MiB hole
        ["alloc", "d", 12 * MiB, 0],       # from the tail
        ["alloc", "e", 10 * MiB, 0],       # grows again
        ["alloc", "f", 8 * MiB, 0],        # the hole
        ["alloc", "g", 30 * MiB, 0],       # two pages in one map
    ])
    assert [row[0] // MiB for row in real] == [20, 20, 40, 40, 40, 60, 60, 80]


def test_the_tail_is_kept_for_what_nothing_else_fits():
    compare([
        ["alloc", "a", 16 * MiB, 0],
        ["alloc", "b", 4 * MiB, 0],
        ["alloc", "c", 6 * MiB, 0],
        ["free", "a"],
        ["alloc", "d", 12 * MiB, 0],
        ["alloc", "e", 14 * MiB, 0],
    ])


def test_two_streams_two_segments():
    real = compare([
        ["alloc", "a", 4 * MiB, 1],
        ["alloc", "b", 4 * MiB, 2],
        ["free", "a"],
        ["alloc", "c", 4 * MiB, 2],
        ["alloc", "d", 13 * MiB, 2],
        ["alloc", "e", 600 * 1024, 1],
        ["alloc", "f", 600 * 1024, 2],
        ["empty_cache"],
    ])
    assert real[4][0] == 60 * MiB


def test_empty_cache_unmaps_whole_free_pages_only():
    real = compare([
        ["alloc", "a", 30 * MiB, 0],
        ["alloc", "b", 5 * MiB, 0],
        ["free", "a"],
        ["empty_cache"],
        ["free", "b"],
        ["empty_cache"],
        ["alloc", "c", 4 * MiB, 0],
    ])
    assert [row[0] // MiB for row in real] == [40, 40, 40, 20, 20, 0, 20]


def test_an_oom_releases_free_pages_and_retries():
    """A device of 120 MiB (each segment reserves 7 pages: 9/8 of it). d
    fits once stream 0's free pages 0-1 are unmapped (one retry); e never
    fits; f's retry unmaps page 2, which releases stream 0's segment, and
    still does not fit."""
    real = compare([
        ["alloc", "a", 45 * MiB, 0],
        ["alloc", "b", 10 * MiB, 0],
        ["free", "a"],
        ["alloc", "c", 50 * MiB, 1],       # another stream: its own segment
        ["alloc", "d", 40 * MiB, 1],
        ["alloc", "e", 60 * MiB, 0],
        ["free", "b"],
        ["alloc", "f", 30 * MiB, 0],
    ], mem="120MiB", budget=120 * MiB)
    # reserved MiB, allocated MiB, maps, unmaps, OOMs, retries after each step
    assert [[r[0] // MiB, r[1] // MiB] + r[2:] for r in real] == [
        [60, 45, 1, 0, 0, 0], [60, 55, 1, 0, 0, 0], [60, 10, 1, 0, 0, 0], [120, 60, 2, 0, 0, 0],
        [120, 100, 3, 1, 0, 1], [120, 100, 3, 1, 1, 2], [120, 90, 3, 1, 1, 2], [100, 90, 3, 2, 2, 3],
    ]


def random_steps(seed, count, largest):
    """A seeded mix of small and large tensors on three streams, frees in
    random order and a few empty_cache calls."""
    import random

    rng, live, steps = random.Random(seed), [], []
    for i in range(count):
        roll = rng.random()
        if roll < 0.05:
            steps.append(["empty_cache"])
        elif live and roll < 0.45:
            steps.append(["free", live.pop(rng.randrange(len(live)))])
        else:
            size = rng.randint(1, 2 * MiB) if rng.random() < 0.5 else rng.randint(1, largest)
            steps.append(["alloc", f"t{i}", size, rng.randrange(3)])
            live.append(f"t{i}")
    return steps


@pytest.mark.parametrize("seed", [1, 2])
def test_random_sequences_match_step_by_step(seed):
    compare(random_steps(seed, 150, 64 * MiB))


def test_a_random_sequence_on_a_small_device_matches_ooms_included():
    real = compare(random_steps(7, 150, 48 * MiB), mem="256MiB", budget=256 * MiB)
    assert real[-1][4] > 0  # some requests did not fit
