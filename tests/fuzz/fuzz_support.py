"""What the Python fuzzing shares (tests/fuzz/fuzz_readers.py with atheris,
tests/test_fuzz_readers.py seeded): seed inputs for every reader, and the
property the pickle pre-check promises."""
import os
import pickle
import tempfile

import vramguard

#: vramguard refuses pickles holding tuples nested deeper (pickle_scan.h).
TUPLE_DEPTH_LIMIT = 100


def tuple_depth(obj):
    """The longest chain of directly nested tuples or frozensets in `obj`
    (hashing recurses along such a chain and stops at anything else),
    walked without recursion, every object once."""
    chain = {}  # id -> chain length starting there

    def chain_of(top):
        stack = [(top, False)]
        while stack:
            item, ready = stack.pop()
            if id(item) in chain:
                continue
            inner = [x for x in item if isinstance(x, (tuple, frozenset))]
            if ready:
                chain[id(item)] = 1 + max((chain[id(x)] for x in inner), default=0)
            else:
                stack.append((item, True))
                stack.extend((x, False) for x in inner if id(x) not in chain)
        return chain[id(top)]

    deepest, seen, stack = 0, set(), [obj]
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, (tuple, frozenset)):
            deepest = max(deepest, chain_of(item))
        if isinstance(item, (tuple, list, set, frozenset)):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(x for kv in item.items() for x in kv)
    return deepest


def snapshot_dict():
    """A small snapshot that reaches every branch of the snapshot reader."""
    events = [
        {"action": "segment_alloc", "addr": 4096, "size": 2 << 20, "stream": 0},
        {"action": "alloc", "addr": 4096, "size": 512, "stream": 0, "frames": []},
        {"action": "free_requested", "addr": 4096, "size": 512, "stream": 0},
        {"action": "free_completed", "addr": 4096, "size": 512, "stream": 0},
        {"action": "free_completed", "addr": 1 << 30, "size": 4096, "stream": 7},
        {"action": "segment_free", "addr": 4096, "size": 2 << 20, "stream": 0},
        {"action": "alloc", "addr": 8192, "size": 1 << 20, "stream": 0},
    ]
    segments = [{"device": 0, "address": 1 << 32, "total_size": 2 << 20, "stream": 0,
                 "blocks": [{"size": 1024, "state": "active_allocated", "requested_size": 1000},
                            {"size": (2 << 20) - 1024, "state": "inactive"}]}]
    return {"segments": segments, "device_traces": [events],
            "allocator_settings": {"max_split_size": -1, "roundup_power2_divisions": {"1": 0}}}


def seeds():
    """One valid input of each format load_trace reads."""
    t = vramguard.Trace("seed")
    a = t.alloc(1000, stream=1)
    b = t.alloc(3 << 20)
    t.free(a)
    t.empty_cache()
    t.free(b)
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "t.vgtrace")
        vramguard.save_trace(t, p)
        with open(p, "rb") as f:
            vgtrace = f.read()
    out = [vgtrace, b"0 3 100\n1 2 200\n2 -1 300\n"]
    out += [pickle.dumps(snapshot_dict(), protocol=p) for p in (2, 3, 4, 5)]
    return out


def write_seeds(folder):
    os.makedirs(folder, exist_ok=True)
    for i, seed in enumerate(seeds()):
        with open(os.path.join(folder, f"seed{i}"), "wb") as f:
            f.write(seed)


if __name__ == "__main__":
    import sys

    write_seeds(sys.argv[1])
