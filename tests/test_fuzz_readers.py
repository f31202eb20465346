"""Seeded mutation fuzzing of the trace readers, as the CI runs it (the
coverage-guided fuzzers are `make fuzz`): snapshots with fields swapped for
hostile values, pickles with bytes changed, and the pickle pre-check
against the real unpickler."""
import io
import pickle
import random
import sys
from pathlib import Path

import pytest

import vramguard
from vramguard import TraceFormatError, _core
from vramguard.trace import importer as _import

sys.path.insert(0, str(Path(__file__).resolve().parent / "fuzz"))
from fuzz_support import TUPLE_DEPTH_LIMIT, seeds, snapshot_dict, tuple_depth  # noqa: E402


def nested_tuple(depth):
    t = 0
    for _ in range(depth):
        t = (t,)
    return t


def hostile_values(rng):
    nest = []
    for _ in range(6):
        nest = [nest, nest]
    return [
        None, True, False, -1, 0, 1 << 64, -(1 << 70), 1 << 1000, 2.5, float("nan"), "", "x" * 50,
        b"bytes", (1, 2), nested_tuple(TUPLE_DEPTH_LIMIT - 2), [], [1, 2], {}, {"size": 1},
        nest, frozenset({1}), {3}, rng.randrange(1 << 64),
    ]


def read_bytes(data, path="fuzzed"):
    """What load_trace does with a file's bytes."""
    allowance = _import.Allowance(path, len(data), _import.DEFAULT_MAX_EXPANSION)
    return _import.read_trace_bytes(io.BytesIO(data), path, None, allowance)


def must_read_or_refuse(data):
    try:
        trace = read_bytes(data)
    except TraceFormatError:
        return None
    trace.peak_live()
    vramguard.replay(trace, budget=64 << 20, samples=4)
    return trace


def mutate_structure(obj, rng, values):
    """Replace one randomly chosen value somewhere in `obj` (in place)."""
    node = obj
    for _ in range(rng.randint(1, 6)):
        if isinstance(node, dict) and node:
            key = rng.choice(list(node))
            if rng.random() < 0.3 or not isinstance(node[key], (dict, list)) or not node[key]:
                node[key] = rng.choice(values)
                return
            node = node[key]
        elif isinstance(node, list) and node:
            i = rng.randrange(len(node))
            if rng.random() < 0.3 or not isinstance(node[i], (dict, list)) or not node[i]:
                node[i] = rng.choice(values)
                return
            node = node[i]
        else:
            return


def test_snapshot_fields_swapped_for_hostile_values():
    rng = random.Random(20261122)
    values = hostile_values(rng)
    read = refused = 0
    for i in range(1500):
        snap = snapshot_dict()
        for _ in range(rng.randint(1, 3)):
            mutate_structure(snap, rng, values)
        data = pickle.dumps(snap, protocol=rng.choice((2, 4, 5)))
        if must_read_or_refuse(data) is None:
            refused += 1
        else:
            read += 1
    assert read > 100 and refused > 100  # both sides were reached


def test_pickle_bytes_changed():
    rng = random.Random(20261123)
    bases = [s for s in seeds() if s[:1] == b"\x80"]
    for _ in range(3000):
        data = bytearray(rng.choice(bases))
        for _ in range(rng.randint(1, 4)):
            roll, at = rng.random(), rng.randrange(len(data))
            if roll < 0.5:
                data[at] = rng.randrange(256)
            elif roll < 0.75:
                data[at:at] = bytes(rng.choice(b"()t\x85\x86\x87\x91\x8f\x90sude]}hq0125.") for _ in range(rng.randint(1, 6)))
            else:
                del data[at:at + rng.randint(1, 8)]
        data = bytes(data)
        if _core.pickle_problem(data) is None:
            try:
                obj = _import._PlainDataUnpickler(io.BytesIO(data)).load()
            except Exception:
                obj = None
            assert tuple_depth(obj) <= TUPLE_DEPTH_LIMIT
        must_read_or_refuse(data)


@pytest.mark.parametrize("protocol", [0, 1, 2, 3, 4, 5])
def test_pre_check_passes_plain_data_and_refuses_depth(protocol):
    rng = random.Random(protocol)

    def plain(depth):
        roll = rng.random()
        if depth > 4 or roll < 0.4:
            return rng.choice([None, True, 7, -3, 1 << 70, 2.5, "s", "é" * 3])
        if roll < 0.6:
            return [plain(depth + 1) for _ in range(rng.randint(0, 4))]
        if roll < 0.8:
            return tuple(plain(depth + 1) for _ in range(rng.randint(0, 4)))
        return {rng.choice(["a", "b", 3, (1, 2)]): plain(depth + 1) for _ in range(rng.randint(0, 4))}

    for _ in range(200):
        obj = plain(0)
        assert _core.pickle_problem(pickle.dumps(obj, protocol=protocol)) is None
    shared = nested_tuple(TUPLE_DEPTH_LIMIT)
    assert _core.pickle_problem(pickle.dumps([shared, {"k": shared}], protocol=protocol)) is None
    too_deep = {nested_tuple(TUPLE_DEPTH_LIMIT + 1): 1}
    problem = _core.pickle_problem(pickle.dumps(too_deep, protocol=protocol))
    assert problem is not None and "nested too deep" in problem[1]
    # Through the memo: a deep tuple referenced again, one level deeper.
    deep = nested_tuple(TUPLE_DEPTH_LIMIT)
    problem = _core.pickle_problem(pickle.dumps([deep, (deep,)], protocol=protocol))
    assert problem is not None and "nested too deep" in problem[1]
