"""What a dry run's parent and its children agree on, in one place: the
allocators, the exit statuses, the environment variables the parent sets
for a child, and the record a child writes of its run.

A child (dryrun/child/) runs the script once and writes a RunRecord as
versioned JSON through the one atomic writer (vramguard._files): the
parent (dryrun/launch.py) reads it back with read_run(), which refuses a
file of another format or version, or with a field this version does not
know, rather than guess at it. tests/dryrun/test_contract.py checks that
every field a child writes is one the parent reads, or one kept for the
user's JSON only (`for_users`).

The run's figures then travel on as the plain dict of the public JSON
(result["vramguard"]["fits"]): RunRecord.to_run() makes it."""
import dataclasses
import json
from typing import Any, Dict, List, Optional

from .._files import write_atomically

ALLOCATORS = ("native", "expandable", "vramguard")

#: The dry run's exit status, one per verdict (2, bad input, and 130,
#: Ctrl-C, are the command line's): a CI job tells a misfit from a crash.
EXIT_FITS = 0
EXIT_DOES_NOT_FIT = 1
EXIT_SCRIPT_FAILED = 3  # the script failed for another reason than memory (its own status in the report)
EXIT_NEVER_USED_GPU = 4  # it ended without putting anything on the GPU: nothing to measure
EXIT_PHANTOM_FAILED = 5  # the phantom could not run it (a call it does not model)
EXIT_TIMED_OUT = 124  # a run was ended at --timeout, as timeout(1) says

#: The verdict's word in the JSON, by exit status.
VERDICTS = {EXIT_FITS: "fits", EXIT_DOES_NOT_FIT: "does not fit", EXIT_SCRIPT_FAILED: "script failed",
            EXIT_NEVER_USED_GPU: "never used the GPU", EXIT_PHANTOM_FAILED: "phantom failed",
            EXIT_TIMED_OUT: "timed out"}

#: --min-memory's answer and every need are exact to this: the device sizes tried are its multiples.
GRANULE = 16 << 20

# The environment a parent gives a child, beside the phantom's own (VG_FAKECUDA_*).
#: A folder of the run's own for files the script would rather not write into the user's.
DIR_ENV = "VRAMGUARD_DRYRUN_DIR"
#: --world-size: "RANK/WORLD/GPUS_PER_NODE" (features/fake_world.py).
WORLD_ENV = "VRAMGUARD_DRYRUN_WORLD"
#: --no-weights: the folder of the weightless checkpoints' stand-ins (features/weightless.py).
NO_WEIGHTS_ENV = "VRAMGUARD_DRYRUN_NO_WEIGHTS"
#: --remedies: the run counts its work (features/work.py) ...
WORK_ENV = "VRAMGUARD_DRYRUN_WORK"
#: ... and applies these remedies (features/remedy_apply.py).
REMEDIES_ENV = "VRAMGUARD_DRYRUN_REMEDIES"

#: The record's format and version, the first keys of every file a child
#: writes: a field added, removed or changed in meaning is a new version.
FORMAT = "vramguard-dryrun-run"
VERSION = 1


def _for_users():
    """A field kept for the user's JSON: the report does not read it."""
    return {"for_users": True}


@dataclasses.dataclass
class FirstOom:
    """The first out-of-memory of a run: the user's line (and the
    library's line inside it), the request, PyTorch's message, and
    whether the script caught it."""
    line: Optional[str] = None
    request_bytes: Optional[int] = None
    message: Optional[str] = None
    caught: bool = False
    inner_line: Optional[str] = None


@dataclasses.dataclass
class RunRecord:
    """One run's figures, as its child writes them. None: not measured."""
    allocator: str
    peak_allocated_bytes: Optional[int] = None
    peak_reserved_bytes: Optional[int] = None
    # True: the script ended (or reached --steps) with no out-of-memory,
    # having used the GPU; False: it ran out of memory, caught or not;
    # None: it failed for another reason before its end, or never used
    # the GPU (used_gpu False), so nobody knows.
    fits: Optional[bool] = None
    first_oom: Optional[FirstOom] = None
    error: Optional[str] = None
    error_at: Optional[str] = None  # the user's line the error was raised at
    exit_status: int = 0  # the script's own
    used_cuda: bool = False
    used_gpu: bool = False
    phantom_unsupported: Optional[Dict[str, Any]] = None  # {"calls", "last", "caused_failure"}
    ended: Optional[str] = None  # how, when the process was ended before the script's end
    ended_at: Optional[str] = None
    steps: int = dataclasses.field(default=0, metadata=_for_users())
    stopped_at_steps: bool = False
    d2h_reads: Optional[int] = None
    managed_bytes: Optional[int] = None  # unified memory, outside PyTorch's allocator
    managed_prefetched_bytes: Optional[int] = None
    ddp_adjusted: int = 0
    accelerate_unpadded: int = 0
    auto_batch_sizes: List[int] = dataclasses.field(default_factory=list)
    auto_batch_size: Optional[int] = None
    llm_int8_layers: int = 0  # bitsandbytes' LLM.int8 layers with an outlier threshold
    device_peak_bytes: Optional[int] = None
    context_bytes: Optional[int] = None
    host_peak_rss_bytes: Optional[int] = None
    snapshot: Optional[str] = None
    compiled: Dict[str, bool] = dataclasses.field(default_factory=dict)
    compile_cache: Optional[Dict[str, int]] = None  # Inductor's code shared by the runs (features/compile_cache.py)
    script_installed_vramguard: bool = False
    alloc_conf: Optional[str] = None  # PYTORCH_CUDA_ALLOC_CONF at the run's end
    extensions: Dict[str, Any] = dataclasses.field(default_factory=dict)  # {name: kernels, launches, ...}
    weightless_loads: Optional[List[Any]] = None
    fake_world: Optional[Dict[str, Any]] = None
    heap_policy: Optional[str] = None  # vramguard's heap: "arena" or "segments"
    card_arch: Optional[Dict[str, Any]] = None
    cudnn_benchmark_kept_off: int = 0
    side_streams: bool = False
    grad_scalers: int = 0
    optimizers: List[str] = dataclasses.field(default_factory=list)
    remedies_seen: Optional[Dict[str, Any]] = None
    work: Optional[Dict[str, Any]] = None
    torch: Optional[str] = None
    elapsed_s: float = 0.0
    terminated: bool = False  # ended by SIGTERM (--timeout) while the script ran
    partial: bool = False  # the figures so far, written as the run went: what a kill leaves

    def to_run(self):
        """The run's dict, as the result (and the public JSON) holds it."""
        return dataclasses.asdict(self)


def field_names(cls=RunRecord):
    return [f.name for f in dataclasses.fields(cls)]


def for_users_fields():
    return {f.name for f in dataclasses.fields(RunRecord) if f.metadata.get("for_users")}


def write_run(path, record):
    """The record as JSON, whole or not at all."""
    data = {"format": FORMAT, "version": VERSION, **dataclasses.asdict(record)}
    write_atomically(path, json.dumps(data, default=repr))


def read_run(path):
    """The RunRecord a child wrote at `path`. OSError when there is none;
    ValueError when it is not whole JSON, or of another format or version,
    or has a field this version does not know."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{path}: not a dry run's record")
    if data.get("version") != VERSION:
        raise ValueError(f"{path}: a record of version {data.get('version')!r}, not {VERSION}: "
                         "written by another vramguard")
    fields = {k: v for k, v in data.items() if k not in ("format", "version")}
    unknown = sorted(set(fields) - set(field_names()))
    if unknown:
        raise ValueError(f"{path}: fields this vramguard does not know: {', '.join(unknown)}")
    if isinstance(fields.get("first_oom"), dict):
        fields["first_oom"] = FirstOom(**fields["first_oom"])
    return RunRecord(**fields)


def unwritten_run(allocator, error):
    """The run's dict when its child wrote no record: nothing measured, and why."""
    return {"allocator": allocator, "peak_allocated_bytes": None, "peak_reserved_bytes": None,
            "fits": None, "first_oom": None, "d2h_reads": None, "host_peak_rss_bytes": None,
            "snapshot": None, "compiled": {}, "extensions": {}, "error": error}


def runs_of(result):
    """{allocator: its run's dict} of a result, in ALLOCATORS' order."""
    return {name: result[name] for name in ALLOCATORS if name in result}
