"""What a run's figures say about it, and the dry run's exit status:
a run that never used the GPU, one that failed in the phantom rather than
in the script, and which of them decides the verdict."""
from ..render.words import and_list, plural
from .contract import (EXIT_DOES_NOT_FIT, EXIT_FITS, EXIT_NEVER_USED_GPU, EXIT_PHANTOM_FAILED, EXIT_SCRIPT_FAILED,
                       EXIT_TIMED_OUT, runs_of)

__all__ = ["PHANTOM_GAPS", "exit_status", "fails_for_every_allocator", "never_used_gpu", "phantom_cause",
           "phantom_failed", "remedies_unmeasured", "statuses"]


#: Calls whose absence from the phantom depends on the allocator (its memory
#: calls): a run failing in one of them says nothing of the other allocators.
_ALLOCATOR_CALLS = ("cuMem", "cudaMalloc", "cudaFree")


#: Errors that say the phantom lacks a library, not that the script is wrong.
PHANTOM_GAPS = (("CUDNN_STATUS_NOT_INITIALIZED", "cuDNN"), ("CUBLAS_STATUS_NOT_INITIALIZED", "cuBLAS"),
                 ("CUFFT_", "cuFFT"), ("CURAND_STATUS", "cuRAND"), ("CUSOLVER_STATUS", "cuSOLVER"),
                 ("CUSPARSE_STATUS", "cuSPARSE"))


def never_used_gpu(run):
    """A run that ended well without putting anything on the GPU (no memory
    allocated, no kernel launched by the script itself): nothing measured."""
    return (run.get("used_gpu") is False and run.get("fits") is None and not run.get("error")
            and not run.get("exit_status"))


def phantom_failed(run):
    """A run that failed in the phantom, not in the script: its error is
    the one a call the phantom does not model returns (the child counts
    those calls), or a library the phantom lacks."""
    if run.get("not_run"):
        return True
    if run.get("fits") is not None or not run.get("error"):
        return False
    gap = run.get("phantom_unsupported") or {}
    return bool(gap.get("caused_failure")) or any(key in run["error"] for key, _ in PHANTOM_GAPS)


def phantom_cause(run):
    """What the phantom lacked, in words."""
    gap = run.get("phantom_unsupported") or {}
    if gap.get("caused_failure") and gap.get("last"):
        return f"it does not model {gap['last']}"
    missing = [lib for key, lib in PHANTOM_GAPS if key in (run.get("error") or "")]
    return f"it has no stand-in for {and_list(missing)}" if missing else "a call it does not model"


def statuses(runs):
    """"exit status 3", "exit statuses 1 and 3": the scripts' own."""
    codes = sorted({int(r.get("exit_status") or 0) for r in runs})
    return f"exit {plural(len(codes), 'status', 'statuses')} {and_list([str(c) for c in codes])}"


def remedies_unmeasured(baseline):
    """Why the program as written leaves the remedies nothing to measure, or None."""
    if baseline.get("timed_out"):
        return "the program as written timed out"
    if never_used_gpu(baseline):
        return "the program never used the GPU: there is no memory for a remedy to free"
    if phantom_failed(baseline):
        return "the phantom could not run the program as written"
    if baseline.get("fits") is None:
        return "the script failed before its end as written (below): a remedy's run would fail there too"
    return None


def fails_for_every_allocator(run):
    """A run that failed in the phantom at a call no allocator makes (CUDA
    IPC, managed memory, a library's): every allocator's run would fail
    there the same way. One of the allocators' own memory calls would not."""
    if not phantom_failed(run):
        return False
    last = (run.get("phantom_unsupported") or {}).get("last") or ""
    return not last.startswith(_ALLOCATOR_CALLS)


def exit_status(result):
    """The dry run's status, from the deciding runs (vramguard's, or every
    allocator's when vramguard was not asked): EXIT_FITS when all fit,
    EXIT_DOES_NOT_FIT when one ran out of memory, EXIT_PHANTOM_FAILED when
    the others failed in the phantom, EXIT_SCRIPT_FAILED when the script
    failed otherwise (its own status is in the report, not here),
    EXIT_TIMED_OUT when a run was ended at --timeout, and
    EXIT_NEVER_USED_GPU when it ended without using the GPU."""
    deciding = [result["vramguard"]] if "vramguard" in result else list(runs_of(result).values())
    if all(r.get("fits") for r in deciding):
        return EXIT_FITS
    if any(r.get("fits") is False for r in deciding):
        return EXIT_DOES_NOT_FIT
    if any(r.get("timed_out") for r in deciding):
        return EXIT_TIMED_OUT
    failed = [r for r in deciding if not never_used_gpu(r)]
    if failed:
        return EXIT_PHANTOM_FAILED if all(phantom_failed(r) for r in failed) else EXIT_SCRIPT_FAILED
    return EXIT_NEVER_USED_GPU
