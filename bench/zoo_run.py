"""One zoo model, one allocator, one process: its memory figures as JSON.

    python bench/zoo_run.py gpt2 --allocator native --steps 3 --json out.json
    python bench/zoo_run.py resnet50 --allocator vramguard --budget 14GiB

Allocators: native (PyTorch's caching allocator), expandable (the same with
expandable_segments:True), vramguard (the arena), vramguard-segments. The
process must start clean (the allocator is chosen before CUDA starts).

The figures: peak allocated and reserved (PyTorch's counters, which
vramguard fills too), whether the steps ran or ran out of memory (and the
request), the device's name, total memory and what the CUDA context held
before the first tensor, the step times, and, under PyTorch's own allocator,
the sizes of every allocation in order (its memory history), the sequence a
phantom must reproduce. Runs the same on a GPU and on a phantom.
"""
import argparse
import json
import os
import resource
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# "given": whatever the process was started with (a dry run chooses it).
ALLOCATORS = ("native", "expandable", "vramguard", "vramguard-segments", "given")


def _select_allocator(name, budget):
    """Before torch touches CUDA."""
    if name == "given":
        import torch

        return torch
    if name == "expandable":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    else:
        os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    import torch

    if name.startswith("vramguard"):
        import vramguard

        vramguard.install(budget=budget, arena=name == "vramguard")
    elif budget:
        from vramguard import parse_size

        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(parse_size(budget) / total)
    return torch


def _rss_now():
    """Resident bytes now (Linux), else the peak so far."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


#: The device calls an allocator makes (a phantom counts each): cudaMalloc and
#: cudaFree for PyTorch's segments and vramguard's, the driver's for virtual
#: memory (expandable segments, the arena).
DEVICE_CALLS = ("cudaMalloc", "cudaFree", "cuMemAlloc", "cuMemFree", "cuMemCreate", "cuMemRelease",
                "cuMemMap", "cuMemUnmap")


#: A library's status for an allocation the device refused.
LIBRARY_OOM = ("CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED", "CUSOLVER_STATUS_ALLOC_FAILED")


def _phantom():
    """The phantom's counters when this process runs on one, else None."""
    import ctypes

    lib = ctypes.CDLL(None)
    if not hasattr(lib, "vg_fakecuda_calls"):
        return None
    lib.vg_fakecuda_calls.restype = ctypes.c_long
    lib.vg_fakecuda_calls.argtypes = [ctypes.c_char_p]
    lib.vg_fakecuda_peak_bytes.restype = ctypes.c_longlong
    lib.vg_fakecuda_peak_bytes.argtypes = [ctypes.c_int]
    return lib


def _device_calls(phantom):
    return sum(max(0, phantom.vg_fakecuda_calls(name.encode())) for name in DEVICE_CALLS)


def _history_sizes(torch):
    """The sizes of the allocations PyTorch's allocator recorded, in order."""
    snap = torch.cuda.memory._snapshot()
    traces = snap.get("device_traces") or [[]]
    return [e["size"] for e in traces[0] if e.get("action") == "alloc"]


def run(args):
    torch = _select_allocator(args.allocator, args.budget)
    import zoo_models

    torch.cuda.init()
    free0, total = torch.cuda.mem_get_info()
    props = torch.cuda.get_device_properties(0)
    result = {
        "model": args.model, "allocator": args.allocator, "size": args.size, "steps": args.steps,
        "torch": torch.__version__, "device": props.name, "cc": "%d.%d" % (props.major, props.minor),
        "sms": props.multi_processor_count, "total_memory": props.total_memory,
        "context_bytes": total - free0 - torch.cuda.memory_reserved(), "budget": args.budget,
    }
    # The host's resident memory before the model exists: the program's own
    # (interpreter, torch, the CUDA libraries), what a phantom adds to is
    # measured against it.
    result["host_rss_start_bytes"] = _rss_now()
    native = args.allocator in ("native", "expandable")
    if args.record and not args.allocator.startswith("vramguard"):
        raise SystemExit("zoo_run: --record needs a vramguard allocator (it records vramguard's heap)")
    if args.record:
        import vramguard

        vramguard.start_recording(stacks=True, name=f"{args.model}-{args.size}")
    if native and args.history:
        torch.cuda.memory._record_memory_history(max_entries=args.history, context=None, stacks="python")
    times, cpu, calls = [], [], []
    phantom = _phantom()
    try:
        step = zoo_models.build(torch, args.model, args.batch, args.size, args.seq)
        for _ in range(args.steps):
            torch.cuda.synchronize()
            before = _device_calls(phantom) if phantom else 0
            t, c = time.perf_counter(), time.process_time()
            step()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
            if phantom:
                calls.append(_device_calls(phantom) - before)
        result["fits"] = True
    except torch.OutOfMemoryError as exc:
        result["fits"] = False
        result["oom"] = str(exc).splitlines()[0][:300]
    except RuntimeError as exc:
        # A library's own allocation refused on a full device (cuBLAS makes a
        # handle for autograd's thread in the first backward): out of memory
        # as much as PyTorch's, though PyTorch raises it as a RuntimeError.
        if not any(code in str(exc) for code in LIBRARY_OOM):
            raise
        result["fits"] = False
        result["oom"] = str(exc).splitlines()[0][:300]
    result["batch"] = args.batch or zoo_models.default_batch(args.model, args.size)
    result["seq"] = args.seq  # None: the model's own
    result["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
    result["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
    result["host_peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    result["step_seconds"] = times
    # The CPU the process spent per step, every thread (autograd's too): on a
    # phantom, where kernels cost nothing, the allocator's and PyTorch's host
    # work, and less disturbed than the wall clock by other work on the machine.
    result["step_cpu_seconds"] = cpu
    if args.record:
        import vramguard

        vramguard.save_trace(vramguard.stop_recording(), args.record)
    if phantom:
        # Per step, the allocator's device calls (the first steps warm the cache),
        # and what the device held at its fullest: the context, the libraries'
        # own memory and the allocator's reserve.
        result["device_calls_per_step"] = calls
        result["device_peak_bytes"] = phantom.vg_fakecuda_peak_bytes(0)
    if len(times) > 1:
        result["median_step_seconds"] = statistics.median(times[1:])
    stats = torch.cuda.memory_stats()
    # What the program asked for at its fullest, before any allocator's
    # rounding (allocated counts whole blocks, and a block's unsplit
    # remainder differs between allocators).
    result["peak_requested_bytes"] = stats.get("requested_bytes.all.peak")
    result["num_device_alloc"] = stats.get("num_device_alloc", 0)
    result["num_device_free"] = stats.get("num_device_free", 0)
    if native and args.history:
        sizes = _history_sizes(torch)
        result["allocations"] = len(sizes)
        result["allocation_sizes"] = sizes
    return result


def main(argv=None):
    import zoo_models

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", choices=sorted(zoo_models.MODELS))
    ap.add_argument("--allocator", choices=ALLOCATORS, default="native")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--size", choices=zoo_models.SIZES, default="full")
    ap.add_argument("--seq", type=int, default=None,
                    help=f"tokens per sequence (only {', '.join(zoo_models.WITH_SEQ)}; default: the model's)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--budget", default=None, help="a size or preset: vramguard's budget, or a memory fraction")
    ap.add_argument("--history", type=int, default=0,
                    help="record this many allocator events (native, expandable) and report the sizes")
    ap.add_argument("--record", metavar="PATH",
                    help="record the run (vramguard allocators, stacks on) into this trace (.vgtrace)")
    ap.add_argument("--json", help="write the result here (default: stdout)")
    args = ap.parse_args(argv)
    result = run(args)
    text = json.dumps(result)
    if args.json:
        with open(args.json + ".tmp", "w") as f:
            f.write(text)
        os.replace(args.json + ".tmp", args.json)
    else:
        print(text)


if __name__ == "__main__":
    # No os._exit past PyTorch's teardown here, though it aborts now and then
    # ("terminate called without an active exception") while autograd's
    # device threads finish: a dry run runs this file as its script and
    # writes its figures after it. bench/zoo.py keeps a run whose JSON was
    # written whatever its exit.
    main()
