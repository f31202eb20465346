"""torch.empty(n, device="cuda") then del, for a mix of sizes: ns per pair
under the native allocator and under vramguard (each in its own process, as
an allocator cannot be swapped), median of repeats, and the share of
vramguard's time spent in its own C heap (timed in the same process by
calling the heap directly).

    python bench/gpu_alloc_micro.py --json out.json
"""
import argparse
import json
import statistics
import subprocess
import sys
import time

SIZES = [512, 4096, 65536, 1 << 20, 3 << 20, 16 << 20, 64 << 20]
PAIRS = 20000
REPEATS = 7


def measure(torch):
    mix = [SIZES[i % len(SIZES)] for i in range(64)]
    for n in mix:  # warm the cache
        torch.empty(n, dtype=torch.uint8, device="cuda")
    runs = []
    for _ in range(REPEATS):
        torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        for i in range(PAIRS):
            x = torch.empty(mix[i & 63], dtype=torch.uint8, device="cuda")
            del x
        runs.append((time.perf_counter_ns() - t0) / PAIRS)
    return statistics.median(runs)


def heap_only():
    """ns per alloc+free of the same mix straight on vramguard's device heap,
    through the Python binding: an upper bound on vramguard's own part."""
    import vramguard

    heap = vramguard._core.device_heap(0)
    mix = [SIZES[i % len(SIZES)] for i in range(64)]
    runs = []
    for _ in range(REPEATS):
        t0 = time.perf_counter_ns()
        for i in range(PAIRS):
            heap.free(heap.malloc(mix[i & 63]))
        runs.append((time.perf_counter_ns() - t0) / PAIRS)
    empty = []
    for _ in range(REPEATS):  # the cost of the Python calls alone
        t0 = time.perf_counter_ns()
        for i in range(PAIRS):
            heap.block_size(mix[i & 63])
            heap.block_size(0)
        empty.append((time.perf_counter_ns() - t0) / PAIRS)
    return statistics.median(runs), statistics.median(empty)


def worker(allocator):
    if allocator == "vramguard":
        import vramguard

        vramguard.install()
    import torch

    out = {"allocator": allocator, "ns_per_pair": measure(torch)}
    if allocator == "vramguard":
        out["heap_ns_per_pair_via_python"], out["python_call_ns_per_pair"] = heap_only()
    print(json.dumps(out))


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--worker", choices=("native", "vramguard"))
    p.add_argument("--json")
    args = p.parse_args()
    if args.worker:
        return worker(args.worker)
    res = {}
    for allocator in ("native", "vramguard"):
        proc = subprocess.run([sys.executable, __file__, "--worker", allocator], capture_output=True, text=True)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        res[allocator] = json.loads(lines[-1]) if lines else {"error": proc.stderr[-2000:]}
    if "ns_per_pair" in res["native"] and "ns_per_pair" in res["vramguard"]:
        res["ratio_vramguard_native"] = res["vramguard"]["ns_per_pair"] / res["native"]["ns_per_pair"]
        v = res["vramguard"]
        v["heap_ns_per_pair"] = v["heap_ns_per_pair_via_python"] - v["python_call_ns_per_pair"]
    print(json.dumps(res, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
