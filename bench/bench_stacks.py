"""What keeping allocation stacks costs: ns per malloc+free pair through
Heap.malloc on the simulated device, called from a few frames of user code,
with no recording, recording without stacks, and recording with stacks;
median of repeats, all in one process, and the ratios against the recording
without stacks. With PyTorch and a CUDA device (the fake one will do), the
same for torch.empty + del, where the stack is set aside by the torch mode.

    python bench/bench_stacks.py [--torch]
"""
import argparse
import statistics
import time

import vramguard

PAIRS = 20000
REPEATS = 7


def nested(depth, fn):
    """fn called `depth` frames of user code down, as a model's layer is."""
    return fn() if depth == 0 else nested(depth - 1, fn)


def time_heap(heap, mode):
    def loop():
        malloc, free = heap.malloc, heap.free
        t0 = time.perf_counter_ns()
        for _ in range(PAIRS):
            free(malloc(4096))
        return time.perf_counter_ns() - t0

    rec = vramguard.record(heap, capacity=4 * PAIRS, stacks=(mode == "stacks")).start() if mode else None
    ns = nested(6, loop)
    if rec:
        rec.stop()
    return ns / PAIRS


def time_torch(torch, mode):
    def loop():
        t0 = time.perf_counter_ns()
        for _ in range(PAIRS):
            x = torch.empty(4096, dtype=torch.uint8, device="cuda")
            del x
        return time.perf_counter_ns() - t0

    rec = vramguard.record(capacity=4 * PAIRS, stacks=(mode == "stacks")).start() if mode else None
    ns = nested(6, loop)
    if rec:
        rec.stop()
    return ns / PAIRS


def table(title, timer):
    modes = [None, "events", "stacks"]
    runs = {m: [] for m in modes}
    for _ in range(REPEATS):
        for m in modes:  # interleaved, so that drift hits all three alike
            runs[m].append(timer(m))
    med = {m: statistics.median(r) for m, r in runs.items()}
    base = med["events"]
    print(title)
    for m, label in zip(modes, ["no recording", "recording", "recording with stacks"]):
        print(f"  {label:<24} {med[m]:8.1f} ns/pair   x{med[m] / base:.2f} of recording")
    print(f"  stacks cost {med['stacks'] - base:+.1f} ns per allocation")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--torch", action="store_true", help="also torch.empty through the installed allocator")
    args = parser.parse_args()
    heap = vramguard.Heap(1 << 30)
    table(f"Heap.malloc+free of 4 KiB, 6 frames down, {PAIRS} pairs, median of {REPEATS}", lambda m: time_heap(heap, m))
    if args.torch:
        import torch

        vramguard.install(patch_torch=False)
        table(f"torch.empty+del of 4 KiB on the installed allocator, {PAIRS} pairs, median of {REPEATS}",
              lambda m: time_torch(torch, m))


if __name__ == "__main__":
    main()
