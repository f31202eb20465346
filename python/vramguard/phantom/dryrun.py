"""Will it fit? A dry run of a training script on a phantom GPU.

    python -m vramguard dryrun --gpu T4 train.py --batch 32
    vramguard.dryrun("train.py", "--batch", "32", gpu="T4")     # in a notebook

The script runs unchanged, once per allocator (PyTorch's own, PyTorch's
with expandable segments, vramguard's), each in a child process whose CUDA
is the phantom GPU (vramguard.phantom.gpu: kernels succeed and compute nothing,
device memory costs no host memory), so it makes on a CPU the allocations
it would make on the card. Each child (child.py) writes its figures
to a JSON file; this module starts the children, passes their output
through, and lays the figures side by side.

Each allocator's need, the smallest device it runs on, comes from a replay
of its run's own recording under its policy (need.py); --min-memory finds
it by running again on phantoms of other sizes (the real out-of-memory
path, not a replay); --sweep BATCH=1,2,4,8 finds the largest value that
fits by bisection.
"""
import json
import os
import re
import shutil
import signal
import site
import subprocess
import sys
import tempfile
import threading
import time

from .._core import format_size
from .._presets import PRESETS, find_preset, preset_names
from . import adjust_accelerate, argnames, llm_int8, managed
from . import remedies as remedy_runs
from .fake_world import WORLD_ENV, check_world, world_env, world_notes
from .weightless import NO_WEIGHTS_ENV, weightless_notes
from ..render.words import a, count, plural
from .need import HISTORY_ENTRIES, measure_need

__all__ = ["ALLOCATORS", "DryRunResult", "dryrun", "format_report", "parse_allocators", "parse_sweep"]

ALLOCATORS = ("native", "expandable", "vramguard")
#: The dry run's exit status, one per verdict (2, bad input, and 130,
#: Ctrl-C, are the command line's): a CI job tells a misfit from a crash.
EXIT_FITS = 0
EXIT_DOES_NOT_FIT = 1
EXIT_SCRIPT_FAILED = 3  # the script failed for another reason than memory (its own status in the report)
EXIT_NEVER_USED_GPU = 4  # it ended without putting anything on the GPU: nothing to measure
EXIT_PHANTOM_FAILED = 5  # the phantom could not run it (a call it does not model)
EXIT_TIMED_OUT = 124  # a run was ended at --timeout, as timeout(1) says
#: Calls whose absence from the phantom depends on the allocator (its memory
#: calls): a run failing in one of them says nothing of the other allocators.
_ALLOCATOR_CALLS = ("cuMem", "cudaMalloc", "cudaFree")
#: --min-memory's answer is exact to this: the device sizes tried are its multiples.
GRANULE = 16 << 20
#: --min-memory's search above a card its run does not fit: phantoms up to this size.
MAX_SEARCH_BYTES = 1 << 40
#: How long a child interrupted by Ctrl-C has to end before it is killed.
KILL_GRACE_S = 2.0
#: How long a run past --timeout has, once told to end, to write its figures
#: so far (its memory snapshot included) before it is killed.
TIMEOUT_GRACE_S = 60.0
#: --cwd's placeholder for a folder per allocator (runs at once need one each).
CWD_PER_RUN = "{allocator}"
READS_NOTE = ("values read back from a phantom device are zeros; data-dependent shapes and control "
              "flow may differ from a real run")
#: Errors that say the phantom lacks a library, not that the script is wrong.
_PHANTOM_GAPS = (("CUDNN_STATUS_NOT_INITIALIZED", "cuDNN"), ("CUBLAS_STATUS_NOT_INITIALIZED", "cuBLAS"),
                 ("CUFFT_", "cuFFT"), ("CURAND_STATUS", "cuRAND"), ("CUSOLVER_STATUS", "cuSOLVER"),
                 ("CUSPARSE_STATUS", "cuSPARSE"))
_SWEEP = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.+)$")
#: Variables the dry run sets or its runs need: a --sweep of one of them
#: would undo the phantom (or the allocator) it set.
_RESERVED_ENV = ("LD_PRELOAD", "LD_LIBRARY_PATH", "PYTORCH_CUDA_ALLOC_CONF", "PATH", "PYTHONPATH",
                 "PYTHONUNBUFFERED", "TRITON_LIBCUDA_PATH", "TORCH_COMPILE_DISABLE", "TORCHINDUCTOR_CACHE_DIR")
_RESERVED_PREFIXES = ("VG_FAKECUDA_", "VRAMGUARD_")


class DryRunInputError(ValueError):
    """A dry run that cannot start: a missing script, an unknown GPU, a bad
    option. One line says what."""


# ------------------------------------------------------------------ inputs


def parse_allocators(value):
    """('native', ...) from "native,vramguard" or a sequence of names."""
    names = value.split(",") if isinstance(value, str) else list(value or ())
    names = [n.strip().lower() for n in names if n and n.strip()]
    if not names:
        raise DryRunInputError(f"no allocator named: choose from {', '.join(ALLOCATORS)}")
    for name in names:
        if name not in ALLOCATORS:
            raise DryRunInputError(f"unknown allocator {name!r}: choose from {', '.join(ALLOCATORS)}")
    return tuple(dict.fromkeys(names))


def parse_sweep(text):
    """("BATCH", [1, 2, 4]) from "BATCH=1,2,4": a name, then whole numbers
    in increasing order."""
    if isinstance(text, (tuple, list)) and len(text) == 2:
        name, values = text
        text = f"{name}={','.join(str(v) for v in values)}"
    match = _SWEEP.match(str(text).strip())
    if not match:
        raise DryRunInputError(f"{argnames.given('sweep', text)}: expected NAME=V1,V2,... (e.g. BATCH=1,2,4,8)")
    name, raw = match.groups()
    if name in _RESERVED_ENV or name.startswith(_RESERVED_PREFIXES):
        raise DryRunInputError(f"{argnames.given('sweep', text)}: {name} is a variable the dry run sets or needs: "
                               "sweep another name (e.g. BATCH)")
    values = []
    for part in raw.split(","):
        part = part.strip()
        if not re.fullmatch(r"[0-9]+", part) or int(part) < 1:
            raise DryRunInputError(f"{argnames.given('sweep', text)}: {part!r} is not a whole number above 0")
        values.append(int(part))
    if any(b <= a for a, b in zip(values, values[1:])):
        raise DryRunInputError(f"{argnames.given('sweep', text)}: the values must increase")
    return name, values


def _check_script(script):
    if not isinstance(script, (str, os.PathLike)) or not os.fspath(script):
        raise DryRunInputError("no script given")
    path = os.fspath(script)
    if not os.path.exists(path):
        raise DryRunInputError(f"{path}: No such file or directory")
    if os.path.isdir(path):
        raise DryRunInputError(f"{path}: is a directory, not a script")
    if not os.path.isfile(path):
        raise DryRunInputError(f"{path}: not a regular file")
    if path.endswith(".ipynb"):
        try:
            with open(path, encoding="utf-8") as f:
                nb = json.load(f)
            if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
                raise ValueError("no cells")
        except (ValueError, UnicodeDecodeError) as exc:
            raise DryRunInputError(f"{path}: not a Jupyter notebook ({exc})") from None
    return path


def _check_gpu(gpu):
    preset = find_preset(gpu)
    if preset is None:
        raise DryRunInputError(f"unknown GPU {gpu!r}: one of {preset_names()}")
    return preset


def _check_size(value, what):
    if value is None:
        return None
    from .._units import parse_size

    try:
        nbytes = parse_size(value, what)
    except (TypeError, ValueError) as exc:
        said = str(exc)
        for lead in (f"{what} {value!r} ", f"a {what} "):  # parse_size names the value too: once is enough
            if said.startswith(lead):
                said = said[len(lead):]
                break
        raise DryRunInputError(f"{argnames.given(what, value)}: {said}") from None
    return nbytes


def check_device(memory, preset, context=None):
    """(device bytes, context bytes): `memory` (bytes or "8GiB"; None: the
    preset's total) and `context` (None: the preset's), refused with one
    line when the device would hold nothing beside its CUDA context. The
    dry run's rule, and a phantom kernel's."""
    device = _check_size(memory, "memory") if memory is not None else preset.total_bytes
    context = _check_size(context, "context") if context is not None else preset.context_bytes
    if device <= context:
        raise DryRunInputError(f"{argnames.given('memory', format_size(device), quote=False)} leaves nothing beside "
                               f"the CUDA context's "
                               f"{format_size(context)}")
    return device, context


def _check_out(out):
    """--out: a directory, or a path where one can be made, that this user
    can write (the dry run makes a folder of its own in it): said before
    anything runs. access(2) answers for a read-only file system even to
    root."""
    if out is None:
        return None
    path = os.path.abspath(os.fspath(out))
    said = argnames.given("out", os.fspath(out), quote=False)
    if os.path.exists(path) and not os.path.isdir(path):
        raise DryRunInputError(f"{said}: is a file, not a directory")
    existing = path
    while not os.path.exists(existing):  # the folder nearest to it that is there, where it would be made
        existing = os.path.dirname(existing)
    if not os.access(existing, os.W_OK | os.X_OK):
        where = "" if existing == path else f" ({existing}, where it would be made)"
        raise DryRunInputError(f"{said}: cannot write there{where}: the dry run makes a folder of its own "
                               "in it for its logs, figures and snapshots")
    return path


def _check_cwd(cwd, allocators):
    """--cwd: an existing directory, where the script runs; with
    {allocator} in it, a folder per allocator (made when missing, once the
    dry run starts, see _make_cwds), whose parent must exist."""
    if cwd is None:
        return None
    path = os.path.abspath(os.fspath(cwd))
    said = argnames.given("cwd", os.fspath(cwd), quote=False)
    for folder in sorted({path.replace(CWD_PER_RUN, a) for a in allocators}):
        if os.path.exists(folder) and not os.path.isdir(folder):
            raise DryRunInputError(f"{said}: {folder} is a file, not a directory")
        if not os.path.isdir(folder if CWD_PER_RUN not in path else os.path.dirname(folder)):
            raise DryRunInputError(f"{said}: No such directory" + (
                f" ({os.path.dirname(folder)})" if CWD_PER_RUN in path else ""))
    return path


def _make_cwds(cwd, allocators):
    """The folders of a per-allocator --cwd, made where missing."""
    if cwd is None or CWD_PER_RUN not in cwd:
        return
    for allocator in allocators:
        folder = cwd.replace(CWD_PER_RUN, allocator)
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as exc:
            raise DryRunInputError(f"{argnames.given('cwd', cwd, quote=False)}: {folder}: "
                                   f"{exc.strerror or exc}") from None


def _check_jobs(jobs, allocators, cwd):
    """Runs at once share nothing but the folder they run in, where their
    file I/O is real (a checkpoint one saves, another loads): so runs at
    once are refused in one folder. One run at a time is the default."""
    if jobs is None:
        return default_jobs(allocators)
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise DryRunInputError(f"{argnames.name('jobs')} must be a whole number above 0, got {jobs!r}")
    if min(jobs, len(allocators)) > 1 and (cwd is None or CWD_PER_RUN not in cwd):
        example = argnames.given("cwd", "runs/" + CWD_PER_RUN, quote=False)
        raise DryRunInputError(
            f"{argnames.given('jobs', jobs)} runs allocators at once, and a script's file I/O is real: "
            f"give each run a folder of its own ({example}, made when missing), or leave "
            f"{argnames.name('jobs')} out to run one at a time")
    return jobs


def _check_timeout(timeout):
    """--timeout: seconds, above 0, or None (no limit)."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < float("inf"):
        raise DryRunInputError(f"{argnames.name('timeout')} must be a number of seconds above 0, "
                               f"got {timeout!r}")
    return timeout


def alloc_conf(allocator, user=None):
    """PYTORCH_CUDA_ALLOC_CONF for a run: the user's (`user`) as it is for
    native; for expandable the user's with expandable_segments:True in place
    of any expandable_segments setting of theirs; none for vramguard, whose
    allocator replaces PyTorch's."""
    if allocator == "vramguard":
        return None
    items = [item.strip() for item in (user or "").split(",") if item.strip()]
    if allocator == "expandable":
        items = [item for item in items if item.split(":")[0].strip() != "expandable_segments"]
        items.append("expandable_segments:True")
    return ",".join(items) or None


# ------------------------------------------------------------------ one child


#: One lock for every echo and log write: the lines of a run's two pipes (and
#: of runs at once) never cut into each other.
_WRITE_LOCK = threading.Lock()


class _Forward(threading.Thread):
    """Copies one pipe of the child to a stream, whole lines at a time (a
    line ends at \n or \r), each prefixed, and to the run's log file. A
    child's print() reaches the pipe in pieces; a piece is held until its
    line is complete, so that lines from stdout and stderr never mix."""

    def __init__(self, pipe, stream, prefix, log):
        super().__init__(daemon=True)
        self.pipe, self.stream, self.prefix, self.log = pipe, stream, prefix, log

    def run(self):
        import codecs

        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        pending = ""
        while True:
            try:
                chunk = os.read(self.pipe.fileno(), 65536)
            except OSError:
                break
            if not chunk:
                break
            pending += decoder.decode(chunk)
            cut = max(pending.rfind("\n"), pending.rfind("\r"))
            if cut < 0 and len(pending) < 65536:
                continue
            cut = cut if cut >= 0 else len(pending) - 1
            self.emit(pending[:cut + 1])
            pending = pending[cut + 1:]
        pending += decoder.decode(b"", final=True)
        if pending:
            self.emit(pending, end="\n")

    def emit(self, text, end=""):
        echo = "".join(self.prefix + line for line in text.splitlines(True)) + end
        with _WRITE_LOCK:
            if self.log is not None:
                try:
                    self.log.write(text + end)
                except (OSError, ValueError):
                    pass
            if self.stream is not None:
                try:
                    self.stream.write(echo)
                    self.stream.flush()
                except (OSError, ValueError):
                    self.stream = None  # a closed stream stops the echo, never the run


def _child_env(env_extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("VRAMGUARD_") and k != "PYTORCH_CUDA_ALLOC_CONF"}
    env.update(env_extra)
    env["PYTHONUNBUFFERED"] = "1"
    # The child imports this very vramguard: where it is not on the
    # interpreter's own path (a source tree), the path goes with it.
    package_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        known = set(site.getsitepackages()) | {site.getusersitepackages()}
    except AttributeError:
        known = set()
    if package_parent not in {os.path.abspath(p) for p in known}:
        env["PYTHONPATH"] = os.pathsep.join([package_parent] + [p for p in env.get("PYTHONPATH", "").split(
            os.pathsep) if p])
    return env


def _signal_group(proc, sig):
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_groups(procs):
    """Ctrl-C for the children and everything they started (each its own
    process group), then, after a grace period, SIGKILL for every group:
    the leader may be gone while a DataLoader worker is not."""
    for proc in procs:
        _signal_group(proc, signal.SIGINT)
    deadline = time.monotonic() + KILL_GRACE_S
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for proc in procs:
        _signal_group(proc, signal.SIGKILL)
        try:
            proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            pass


class _Live:
    """The children running now, so that Ctrl-C ends all of them (runs of
    several allocators at once, --jobs)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.procs = set()
        self.cancelled = False

    def add(self, proc):
        with self.lock:
            self.procs.add(proc)
            cancelled = self.cancelled
        if cancelled:
            _kill_groups([proc])

    def discard(self, proc):
        with self.lock:
            self.procs.discard(proc)

    def cancel(self):
        with self.lock:
            self.cancelled = True
            procs = list(self.procs)
        _kill_groups(procs)


def _new_log(out_dir, stem):
    """(the stem, its log opened for writing): a file made here and now,
    never one that was there (O_EXCL), nor through a symbolic link
    (O_NOFOLLOW), even in a folder others can write; a stem taken already
    gets a number ("native-2")."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    for n in range(1, 1000):
        name = stem if n == 1 else f"{stem}-{n}"
        try:
            fd = os.open(os.path.join(out_dir, f"{name}.log"), flags, 0o644)
        except FileExistsError:
            continue
        return name, os.fdopen(fd, "w", encoding="utf-8")
    raise FileExistsError(os.path.join(out_dir, f"{stem}.log"))


def _remove_if_empty(folder):
    try:
        os.rmdir(folder)  # only when empty
    except OSError:
        pass


def _no_figures(rc, log_path=None):
    """Why a run that wrote no figures ended, from its exit status and the
    last exception its log shows (the status itself is said beside it,
    not here)."""
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        return f"killed by {name} before its figures were written"
    last = _last_exception(log_path)
    if last:
        return f"{last} (before its figures were written)"
    return "ended before its figures were written (a crash: see its log)"


def _ended_unwritten(result, rc, log_path):
    """A run that left only the figures written as it went (child.py,
    `partial`), ended by a kill or a crash: the cause from its status and
    log, the figures up to its last optimizer step kept."""
    cause = _no_figures(rc, log_path).replace("before its figures were written",
                                              "after the figures of its last step were written")
    result["error"] = cause
    result["error_at"] = None
    if result.get("fits") is not False:  # an out-of-memory already seen stays the verdict
        result["fits"] = None


def _last_exception(log_path):
    """The last line of the last Python traceback in a run's log ("ValueError:
    ..."), or None."""
    if not log_path:
        return None
    try:
        with open(log_path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last):")]
    if not starts:
        return None
    for line in lines[starts[-1] + 1:]:
        if line and not line[0].isspace():
            return line.strip()
    return None


def run_child(script, args, allocator, env, out_dir, label, *, notebook=False, steps=0,
              snapshot=True, echo=True, stdout=None, stderr=None, live=None, cwd=None, nproc=1,
              timeout=None):
    """Runs the script once in a child on the phantom (in `cwd`, default
    this process's working directory); returns the child's figures (a
    dict), with `exit_status` and `log` added. Its files are new files in
    `out_dir` (a folder of this dry run's own), named after `label`. Ctrl-C
    here ends the child and its process group (and those `live` holds)
    before KeyboardInterrupt goes on; a run is taken for interrupted only
    then (`live` cancelled), never for its status: a script's own exit
    status 130 or KeyboardInterrupt is its own failure. A run still going
    after `timeout` seconds is told to end (SIGTERM: the child writes its
    figures so far), then killed with its process group; its result has
    `timed_out` set."""
    live = _Live() if live is None else live
    if live.cancelled:
        raise KeyboardInterrupt
    stem, log = _new_log(out_dir, re.sub(r"[^A-Za-z0-9_.=-]+", "_", label))
    # nproc > 1: torchrun starts the ranks, each writes its own figures ({rank})
    ranked = f"{stem}.rank{{rank}}" if nproc > 1 else stem
    result_path = os.path.join(out_dir, f"{ranked}.json")
    log_path = os.path.join(out_dir, f"{stem}.log")
    # A folder of the run's own for files the script would rather not write
    # into the user's (the quickstart notebook's memory snapshot): made here,
    # removed again when the run left nothing in it.
    files_dir = os.path.join(out_dir, f"{stem}.files")
    os.mkdir(files_dir)
    env = dict(env, VRAMGUARD_DRYRUN_DIR=files_dir)
    # torchrun's own logs with the run's (left to itself it makes a folder in /tmp and leaves it there)
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
                 "--log-dir", os.path.join(out_dir, "torchrun")]
                if nproc > 1 else [sys.executable])
    cmd = launcher + ["-m", "vramguard.phantom.child", "--allocator", allocator,
                      "--result", result_path, "--steps", str(int(steps or 0))]
    if snapshot:
        cmd += ["--snapshot", os.path.join(out_dir, f"{ranked}.pickle")]
    if notebook:
        cmd.append("--notebook")
    # as given (its sys.argv[0] and __file__), but absolute where the child runs elsewhere (cwd)
    script = os.fspath(script) if cwd is None else os.path.abspath(os.fspath(script))
    cmd += [script, "--"] + [str(a) for a in args]
    stdout = sys.stdout if stdout is None else stdout
    stderr = sys.stderr if stderr is None else stderr
    started = time.monotonic()
    timed_out = False
    with log:
        proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True, cwd=cwd)
        live.add(proc)
        prefix = f"[{label}] "
        threads = [_Forward(proc.stdout, stdout if echo else None, prefix, log),
                   _Forward(proc.stderr, stderr if echo else None, prefix, log)]
        for t in threads:
            t.start()
        try:
            rc, timed_out = _wait(proc, timeout, group=nproc > 1)
        except BaseException:
            live.cancel()
            for t in threads:
                t.join(timeout=1.0)
            _remove_if_empty(files_dir)
            raise
        finally:
            live.discard(proc)
        # The script's leftovers (a worker, a subprocess that outlived it) go
        # with it, before its pipes are read to their end: they hold them open.
        _signal_group(proc, signal.SIGKILL)
        for t in threads:
            t.join()
        proc.stdout.close()
        proc.stderr.close()
    _remove_if_empty(files_dir)
    if live.cancelled:  # Ctrl-C, or another run's: the dry run ends, whatever this one's status
        raise KeyboardInterrupt
    status = rc if rc >= 0 else 128 - rc  # killed by signal N: what a shell says, 128 + N
    try:
        if nproc > 1:
            result = _ranks_result([result_path.replace("{rank}", str(r)) for r in range(nproc)])
        else:
            with open(result_path, encoding="utf-8") as f:
                result = json.load(f)
    except (OSError, ValueError):
        result = {
            "allocator": allocator, "peak_allocated_bytes": None, "peak_reserved_bytes": None,
            "fits": None, "first_oom": None, "d2h_reads": None, "host_peak_rss_bytes": None,
            "snapshot": None, "compiled": {}, "extensions": {},
            "error": _no_figures(rc, log_path),
        }
    if result.get("partial"):  # only the figures written as it went: killed, or crashed
        _ended_unwritten(result, rc, log_path)
        result["exit_status"] = status
    result.setdefault("exit_status", status)  # the script's own, which the child wrote
    if timed_out and result.get("terminated", True):  # not one that ended in time and was writing its figures
        _timed_out(result, timeout)
    result["log"] = log_path
    result.setdefault("elapsed_s", round(time.monotonic() - started, 3))
    return result


def _wait(proc, timeout, group=False):
    """(the child's exit status, whether it ran past `timeout` seconds).
    Past it, SIGTERM to the child (to every process of its group when
    torchrun leads it: each rank writes its figures so far), then, after
    TIMEOUT_GRACE_S, SIGKILL to the group."""
    if timeout is None:
        return proc.wait(), False
    try:
        return proc.wait(timeout=timeout), False
    except subprocess.TimeoutExpired:
        pass
    if group:
        _signal_group(proc, signal.SIGTERM)
    else:
        try:
            proc.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass
    try:
        return proc.wait(timeout=TIMEOUT_GRACE_S), True
    except subprocess.TimeoutExpired:
        _signal_group(proc, signal.SIGKILL)
        return proc.wait(), True


def _timed_out(result, timeout):
    """A run ended at --timeout: its figures are those up to then, and
    whether it fits is not known unless it ran out of memory by then.
    Exit status 124, as timeout(1) gives."""
    seconds = f"{timeout:g} s"
    result["timed_out"] = True
    result["exit_status"] = 124
    if result.get("fits") is not False:
        result["fits"] = None
    if result.get("peak_allocated_bytes") is None:
        result["error"] = f"timed out after {seconds} (--timeout), before its figures were written"
    else:
        result["error"] = f"timed out after {seconds} (--timeout): its figures are those up to then"


RANK_KEYS = ("peak_allocated_bytes", "peak_reserved_bytes", "device_peak_bytes", "fits", "first_oom",
             "error", "error_at", "exit_status", "used_gpu", "phantom_unsupported", "ended", "partial")


def _ranks_result(paths):
    """One run's figures from its ranks' files (dryrun --nproc): the lowest
    rank's that wrote some, with the peaks the largest of any rank's, fits
    only when every rank fits (False when one ran out of memory), the
    first out-of-memory and error of the lowest rank that had one (its
    `rank` added), and `ranks`, each rank's own (`figures` False for a
    rank that wrote none: torchrun ends the others when one fails).
    OSError when no rank wrote any."""
    ranks = []
    for path in paths:
        try:
            with open(path, encoding="utf-8") as f:
                rank = json.load(f)
        except (OSError, ValueError):
            rank = {"fits": None, "figures": False}
        if rank.get("partial") and rank.get("fits") is not False:
            rank["fits"] = None  # figures up to its last step: it did not reach its end
        ranks.append(rank)
    written = [r for r in ranks if r.get("figures", True)]
    if not written:
        raise OSError("no rank wrote its figures")
    result = dict(written[0])
    result.pop("partial", None)
    for key in ("peak_allocated_bytes", "peak_reserved_bytes", "device_peak_bytes", "host_peak_rss_bytes"):
        values = [r.get(key) for r in ranks if r.get(key) is not None]
        result[key] = max(values) if values else None
    fits = [r.get("fits") for r in ranks]
    result["fits"] = False if False in fits else None if None in fits else True
    for key in ("first_oom", "error"):
        first = next(((i, r) for i, r in enumerate(ranks) if r.get(key)), None)
        result[key] = dict(first[1][key], rank=first[0]) if first and key == "first_oom" else \
            first[1][key] if first else None
        if key == "error":
            result["error_at"] = first[1].get("error_at") if first else None
    result["used_gpu"] = any(r.get("used_gpu") for r in written)
    result["exit_status"] = next((r.get("exit_status") for r in ranks if r.get("exit_status")), 0)
    result["ranks"] = [dict({k: r.get(k) for k in RANK_KEYS}, rank=i, figures=r.get("figures", True))
                       for i, r in enumerate(ranks)]
    return result


# ------------------------------------------------------------------ the result


class DryRunResult(dict):
    """A dry run's figures: a dict (the --json object) whose keys read as
    attributes too (result.vramguard["fits"], result.fits), printed as the
    text report and shown in a notebook as a table."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __str__(self):
        return format_report(self)

    def __repr__(self):
        return format_report(self)

    def _repr_html_(self):
        return report_html(self)

    @property
    def runs(self):
        return {name: self[name] for name in ALLOCATORS if name in self}

    def to_json(self):
        return json.dumps(dict(self), sort_keys=True, default=repr)


def _size(nbytes):
    return "-" if nbytes is None else format_size(int(nbytes))


def _fits_word(fits, unused=False):
    """yes, NO, error; "-" for a run that never used the GPU (no verdict)."""
    return "-" if unused else {True: "yes", False: "NO", None: "error"}[fits]


def _oom_text(run, sweep_name=None):
    oom = run.get("first_oom")
    if not oom:
        error = run.get("error")
        return "-" if error is None else (error if len(error) <= 48 else error[:47] + "...")
    where = oom.get("line") or "unknown line"
    if oom.get("inner_line"):  # the user's line called a library (a Trainer) that asked for it
        where += f" via {oom['inner_line']}"
    request = oom.get("request_bytes")
    text = f"{where} ({_size(request)})" if request else where
    if oom.get("value") is not None:
        text += f" at {sweep_name}={oom['value']}"
    return text + (" caught" if oom.get("caught") else "")


def _need_text(run, device):
    """The needs column: the smallest device the run fits on (the replay's),
    "> the device" for a run that ran out of memory on it, else not measured."""
    if run.get("need_bytes"):
        return format_size(int(run["need_bytes"]))
    if run.get("need_above_device"):
        return f"> {format_size(int(device))}"
    return "not measured"


def _columns(result):
    headers = ["allocator", "needs", "peak allocated", "peak reserved", "fits", "first OOM (request)"]
    sweep = result.get("sweep")
    if result.get("min_memory"):
        headers.insert(5, "min memory")
    if sweep:
        headers.insert(5, f"largest {sweep['name']}")
    rows = []
    for name, run in DryRunResult(result).runs.items():
        row = [name, _need_text(run, result["device_bytes"]), _size(run.get("peak_allocated_bytes")),
               _size(run.get("peak_reserved_bytes")), _fits_word(run.get("fits"), never_used_gpu(run)),
               _oom_text(run, sweep and sweep["name"])]
        if result.get("min_memory"):
            above = run.get("min_memory_above_bytes")
            row.insert(5, f"> {format_size(above)}" if above else _size(run.get("min_memory_bytes")))
        if sweep:
            largest = run.get("largest_batch")
            row.insert(5, "unknown" if run.get("fits") is None
                       else "no effect" if run.get("sweep_measured_nothing")
                       else "none" if largest is None else str(largest))
        rows.append(row)
    return headers, rows


def _names(items):
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _device(result):
    """The card, and its size where --memory changed it."""
    preset = PRESETS.get(result["gpu"])
    if preset is not None and preset.total_bytes == result["device_bytes"]:
        return result["gpu"]
    return f"{result['gpu']} of {format_size(result['device_bytes'])}"


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
    return bool(gap.get("caused_failure")) or any(key in run["error"] for key, _ in _PHANTOM_GAPS)


def _phantom_cause(run):
    """What the phantom lacked, in words."""
    gap = run.get("phantom_unsupported") or {}
    if gap.get("caused_failure") and gap.get("last"):
        return f"it does not model {gap['last']}"
    missing = [lib for key, lib in _PHANTOM_GAPS if key in (run.get("error") or "")]
    return f"it has no stand-in for {_names(missing)}" if missing else "a call it does not model"


def _statuses(runs):
    """"exit status 3", "exit statuses 1 and 3": the scripts' own."""
    codes = sorted({int(r.get("exit_status") or 0) for r in runs})
    return f"exit {plural(len(codes), 'status', 'statuses')} {_names([str(c) for c in codes])}"


def _verdict(result):
    runs = DryRunResult(result).runs
    gpu = _device(result)
    sweep = result.get("sweep")
    fit = [n for n, r in runs.items() if r.get("fits")]
    oom = [n for n, r in runs.items() if r.get("fits") is False]
    unused = [n for n, r in runs.items() if never_used_gpu(r)]
    failed = [n for n, r in runs.items() if r.get("fits") is None and n not in unused]
    if sweep:
        lines = []
        for n, r in runs.items():
            value = (r.get("failed_at") or {}).get("value")
            if n in unused:
                lines.append(f"{n}: not known, the program never used the GPU")
            elif r.get("fits") is None:
                lines.append(f"{n}: not known, the script failed"
                             + (f" at {sweep['name']}={value}" if value is not None else ""))
            elif r.get("sweep_measured_nothing"):
                lines.append(f"{n}: not measured, the figures were the same at every {sweep['name']} tried")
            elif r.get("largest_batch") is not None:
                last = r["largest_batch"] == sweep["values"][-1]  # what lies above it was never tried
                lines.append(f"{n}: {sweep['name']}={r['largest_batch']}" + (" (the largest tried)" if last else ""))
            else:
                lines.append(f"{n}: no {sweep['name']} fits")
        head = f"Largest {sweep['name']} that fits on {a(gpu)}: " + "; ".join(lines) + "."
    elif len(fit) == len(runs):
        head = f"Fits on {a(gpu)} with {'every allocator tried' if len(runs) > 1 else fit[0]}."
    elif fit:
        head = f"Fits on {a(gpu)} with {_names(fit)}" + (f"; not with {_names(oom)}" if oom else "") + "."
    elif oom and not failed and not unused:
        head = f"Does not fit on {a(gpu)} with any allocator tried."
    elif oom:
        head = f"Does not fit on {a(gpu)} with {_names(oom)}."
    elif failed and all(phantom_failed(runs[n]) for n in failed):
        head = (f"The phantom GPU could not run the program ({_phantom_cause(runs[failed[0]])}): "
                "whether it fits is not known.")
    elif failed:
        head = (f"The script failed before its end ({_statuses(runs[n] for n in failed)}): "
                "whether it fits is not known.")
    else:
        head = (f"The program never used the GPU: it allocated nothing on the phantom {gpu} and "
                "launched no kernel, so whether it fits is not known.")
    if failed and (fit or oom):
        head += f" With {_names(failed)} the script failed before its end (below)."
    if unused and (fit or oom or failed):
        head += f" With {_names(unused)} the program never used the GPU."
    out = [head]
    out += _rank_lines(runs)
    if result.get("min_memory"):
        sizes = {n: r.get("min_memory_bytes") for n, r in runs.items() if r.get("min_memory_bytes")}
        if sizes:
            least = min(sizes.values())
            best = _names([n for n, size in sizes.items() if size == least])
            smallest = [p.name for p in sorted(PRESETS.values(), key=lambda p: p.total_bytes)
                        if p.total_bytes >= least]
            card = ("" if not smallest
                    else f" (the {result['gpu']} asked about is the smallest preset that holds it)"
                    if smallest[0] == result["gpu"] and _device(result) == result["gpu"]
                    else f" (the smallest preset that holds it: {smallest[0]})")
            out.append(f"Smallest device: {format_size(least)} with {best}{card}, "
                       f"exact to {GRANULE >> 20} MiB, the CUDA context's "
                       f"{format_size(result.get('context_bytes', 0))} included.")
        elif unused and len(unused) == len(runs):
            out.append("Smallest device: not known: the program never used the GPU.")
        elif any(r.get("fits") is None and n not in unused for n, r in runs.items()):
            out.append("Smallest device: not known: the search stopped where the script failed (below).")
        elif any(r.get("min_memory_above_bytes") for r in runs.values()):
            above = max(r.get("min_memory_above_bytes") or 0 for r in runs.values())
            out.append(f"Smallest device: none found: it did not fit even {a(format_size(above) + ' device')}.")
        else:
            out.append("Smallest device: none found (it does not fit the full device).")
    return out


def _rank_lines(runs):
    """Per run of several ranks (--nproc) whose ranks did not all fit: the
    rank that ran out or failed, where, with its figures, and what the
    others left (torchrun ends every rank when one fails)."""
    lines = []
    for name, run in runs.items():
        ranks = run.get("ranks") or []
        if all(k.get("fits") for k in ranks):
            continue
        said = []
        for k in ranks:
            figures = (f"peak allocated {_size(k.get('peak_allocated_bytes'))}, "
                       f"reserved {_size(k.get('peak_reserved_bytes'))}")
            if not k.get("figures", True):
                said.append(f"rank {k['rank']} left no figures")
            elif k.get("first_oom"):
                oom = k["first_oom"]
                request = f" (request {_size(oom['request_bytes'])})" if oom.get("request_bytes") else ""
                said.append(f"rank {k['rank']} ran out of memory at {oom.get('line') or 'an unknown line'}"
                            f"{request}, {figures}")
            elif k.get("error"):
                at = f" at {k['error_at']}" if k.get("error_at") else ""
                # ended by SIGTERM where another rank ran out or failed first: torchrun's doing
                cause = any(j is not k and (j.get("first_oom") or j.get("error") and j.get("ended") != "SIGTERM")
                            for j in ranks)
                why = (" (torchrun ends the other ranks when one fails)"
                       if k.get("ended") == "SIGTERM" and cause else "")
                said.append(f"rank {k['rank']} ended by {k['error']}{at}{why}, {figures}")
        if said:
            lines.append(f"{name}: " + "; ".join(said) + ".")
    return lines


def _need_lines(result):
    """Which allocator needs the least device memory (the needs column),
    and why a need was not measured."""
    runs = DryRunResult(result).runs
    needs = {n: r["need_bytes"] for n, r in runs.items() if r.get("need_bytes")}
    lines = []
    if needs:
        least = min(needs.values())
        leanest = [n for n, b in needs.items() if b == least]
        others = "; ".join(f"{n} {format_size(b)}" for n, b in sorted(needs.items(), key=lambda i: i[1])
                           if b != least)
        lines.append(f"Needs: {_names(leanest)} {format_size(least)}" + (f", the least; {others}" if others else "")
                     + f". A need is the smallest device a run fits on (the CUDA context included, exact to "
                     f"{GRANULE >> 20} MiB), from a replay of the run's own recorded allocations under its "
                     "allocator's policy; peak reserved is what a cache with room keeps, not what it needs.")
    why = {}
    for n, r in runs.items():
        if not r.get("need_bytes") and not r.get("need_above_device") and r.get("need_unmeasured"):
            why.setdefault(r["need_unmeasured"], []).append(n)
    for reason, names in why.items():
        lines.append(f"Need not measured for {_names(names)}: {reason}.")
    return lines


#: A margin under this share of the memory beside the context (or under
#: SMALL_MARGIN_BYTES) is said: another driver or library can take it.
SMALL_MARGIN_SHARE = 0.02
SMALL_MARGIN_BYTES = 256 << 20


def _margin_note(result):
    usable = int(result["device_bytes"]) - int(result.get("context_bytes") or 0)
    small = max(usable * SMALL_MARGIN_SHARE, SMALL_MARGIN_BYTES)
    tight = []
    for n, r in DryRunResult(result).runs.items():
        peak = r.get("device_peak_bytes")
        if r.get("fits") and peak:
            spare = max(0, int(result["device_bytes"]) - int(peak))
            if spare < small:
                tight.append(f"{n} fits, with {format_size(spare)} to spare")
    if not tight:
        return []
    return ["; ".join(tight) + f" (of the {format_size(usable)} beside the CUDA context, under "
            f"{SMALL_MARGIN_SHARE:.0%} or {format_size(SMALL_MARGIN_BYTES)}): another driver, CUDA version or "
            "library on the card can take that much."]


def _card_line(result):
    """That this PyTorch has no kernels for the card, before any verdict."""
    arch = next((r.get("card_arch") for r in DryRunResult(result).runs.values() if r.get("card_arch")), None)
    if not arch or arch.get("runs"):
        return []
    return [f"This PyTorch ({result.get('torch') or 'installed'}) has no kernels for {a(result['gpu'])} "
            f"(compute capability {arch['capability']}; it was built for {', '.join(arch['arch_list'])}): on "
            "the card its first CUDA kernel fails. A phantom runs every kernel, so the figures below are those "
            "of the program, which needs a PyTorch built for the card to run there."]
def _extensions_that_ran(runs):
    """"bitsandbytes (2 kernels, 40 launches)" per extension whose kernels
    ran, as the first run that launched them counted."""
    seen = {}
    for r in runs:
        for name, ran in (r.get("extensions") or {}).items():
            seen.setdefault(name, ran)
    return [f"{name} ({count(ran['kernels'], 'kernel')}, {count(ran['launches'], 'launch', 'launches')})"
            for name, ran in sorted(seen.items())]


def _notes(result):
    runs = DryRunResult(result).runs.values()
    notes = []
    reads = [r.get("d2h_reads") for r in runs if r.get("d2h_reads") is not None]
    if reads and max(reads) > 0:
        notes.append(f"The program read device values back {count(max(reads), 'time')}: {READS_NOTE}.")
    adjusted = [r.get("ddp_adjusted") or 0 for r in runs]
    if adjusted and max(adjusted) > 0:
        notes.append(f"DistributedDataParallel reads device values back at its start and after its first "
                     f"step (zeros here): the dry run gave its {count(max(adjusted), 'DDP module')} init_sync=False "
                     f"and find_unused_parameters=True, the same gradient buckets in their first order.")
    notes += adjust_accelerate.notes(runs, max([len(r.get("ranks") or []) for r in runs] + [1]))
    notes += filter(None, [llm_int8.note(runs)])
    if result.get("no_compile"):
        notes.append("torch.compile was turned off (--no-compile): the figures are eager mode's, usually "
                     "more than a compiled model's (no fusion).")
    elif any((r.get("compiled") or {}).get("torch_compile") for r in runs):
        failed = any(r.get("error") for r in runs)
        notes.append("torch.compile was used: its Triton kernels were built on this CPU for the card's "
                     "architecture and launched as no-ops"
                     + ("; it failed here: run again with --no-compile for eager mode's figures "
                        "(an upper bound, usually)." if failed
                        else ", so the figures are the compiled program's (autotuning, which times "
                             "kernels, chose blindly)."))
    ran = _extensions_that_ran(runs)
    if ran:
        notes.append(f"Custom CUDA extensions ran kernels: {', '.join(ran)}: their kernels compute nothing "
                     "here, and memory they take outside PyTorch's allocator is not in the peaks above.")
    took_over = [r["allocator"] for r in runs if r.get("script_installed_vramguard")]
    if took_over:
        notes.append(f"The script calls vramguard.install() itself: the {_names(took_over)} "
                     f"run{'s' if len(took_over) > 1 else ''} ran under vramguard too.")
    expected = {"expandable": "expandable_segments:True"}
    own = sorted({r.get("alloc_conf") for r in runs
                  if r.get("alloc_conf") and r.get("alloc_conf") != r.get("alloc_conf_set",
                                                                           expected.get(r["allocator"]))})
    if own:
        notes.append(f"The script sets PYTORCH_CUDA_ALLOC_CONF itself ({'; '.join(own)}): the runs used its "
                     "setting where it was made before CUDA started.")
    for r in runs:
        if r.get("ranks"):
            notes.append(f"{r['allocator']}, per rank (peak allocated / reserved): " + "; ".join(
                f"rank {k['rank']} {_size(k.get('peak_allocated_bytes'))} / {_size(k.get('peak_reserved_bytes'))}"
                for k in r["ranks"]) + ".")
    stopped = [r for r in runs if r.get("stopped_at_steps")]
    if stopped:
        notes.append(f"Each run stopped after {result.get('steps')} optimizer steps (--steps).")
    user = result.get("user_alloc_conf")
    given = [(r["allocator"], r.get("alloc_conf_set")) for r in runs if r.get("alloc_conf_set")]
    if user and given:
        notes.append(f"Your PYTORCH_CUDA_ALLOC_CONF={user} was applied: "
                     + "; ".join(f"{n} ran with {conf}" for n, conf in given)
                     + (" (not in vramguard's run: its allocator replaces PyTorch's)."
                        if any(r["allocator"] == "vramguard" for r in runs) else "."))
    for r in runs:
        if r.get("not_run"):
            notes.append(f"{r['allocator']}: {r['error']}.")
        elif r.get("error") and not r.get("ranks"):  # a run of ranks: _rank_lines says which and where
            failed_at = r.get("failed_at") or {}
            at = (f" at {r.get('sweep_name') or (result.get('sweep') or {}).get('name')}={failed_at['value']}"
                  if "value" in failed_at
                  else f" on a device of {format_size(failed_at['memory_bytes'])} (--min-memory)"
                  if "memory_bytes" in failed_at else "")
            whose = "the run failed in the phantom" if phantom_failed(r) else "the script failed"
            where = f", at {r['error_at']}" if r.get("error_at") else ""
            notes.append(f"{r['allocator']}: {whose}{at}: {r['error']}{where} "
                         f"(exit status {r.get('exit_status')}).")
        elif r.get("ended") and not r.get("error"):  # os._exit(0): the script's own end, its figures up to there
            notes.append(f"{r['allocator']}: the script ended itself with {r['ended']}"
                         + (f" at {r['ended_at']}" if r.get("ended_at") else "") + ": the figures are up to there.")
    gaps = sorted({(r["phantom_unsupported"]["last"], r["phantom_unsupported"]["calls"]) for r in runs
                   if phantom_failed(r) and not r.get("not_run") and (r.get("phantom_unsupported") or {}).get("last")})
    for call, calls in gaps:
        notes.append(f"That failure is the phantom's, not the script's: the phantom GPU does not model "
                     f"{call} ({count(calls, 'unsupported call')} in the run), which returned the error.")
    missing = sorted({lib for r in runs for key, lib in _PHANTOM_GAPS if key in (r.get("error") or "")})
    if missing:
        notes.append(f"That failure is the phantom's, not the script's: this build of the phantom GPU has no "
                     f"stand-in for {_names(missing)}.")
    notes += weightless_notes(result.get("weights", True), runs)
    notes += world_notes(result, runs)
    notes += _program_notes(result)
    if result.get("cwd"):
        per_run = " (--cwd: a folder per allocator)" if CWD_PER_RUN in result["cwd"] else " (--cwd)"
        notes.append(f"The script ran in {result['cwd']}{per_run if result.get('cwd_given') else ''} "
                     "with real file I/O: files it writes (a torch.save checkpoint holds zeros on a phantom) "
                     "overwrite real ones" + ("." if result.get("cwd_given") else "; --cwd DIR runs it elsewhere."))
    return notes


def _managed_lines(result):
    runs = list(DryRunResult(result).runs.values())
    lines = [managed.verdict(result, runs, _device(result)), managed.note(result, runs)]
    return [line for line in lines if line]


def _program_notes(result):
    """What made a row another program than the card would run, or hid
    something from every row: cuDNN's benchmark mode kept off, side
    streams, GradScaler's scale, a sweep that changed nothing."""
    runs = DryRunResult(result).runs
    notes = []
    kept_off = [n for n, r in runs.items() if r.get("cudnn_benchmark_kept_off")]
    others = [n for n in runs if n not in kept_off]
    if kept_off and others:
        notes.append(f"The script turns cuDNN's benchmark mode on (torch.backends.cudnn.benchmark), which "
                     f"vramguard keeps off (PyTorch's pluggable allocators cannot answer its cacheInfo query): "
                     f"the {_names(kept_off)} row measured convolutions without it, another cuDNN mode than "
                     f"the {_names(others)} {plural(len(others), 'row')}.")
    elif kept_off:
        notes.append("The script turns cuDNN's benchmark mode on (torch.backends.cudnn.benchmark), which "
                     "vramguard keeps off: the figures are those of convolutions without it.")
    if any(r.get("side_streams") for r in runs.values()):
        notes.append("The program used CUDA side streams (torch.cuda.Stream, or a library's, such as NCCL's): "
                     "on a phantom queued work is done at once, so memory a card holds until work queued on "
                     "another stream has run (record_stream, a collective's buffers) is not in these figures.")
    if any(r.get("grad_scalers") for r in runs.values()):
        notes.append("GradScaler was used: on a phantom its scale reads 0 (scaler.get_scale(), a logged or saved "
                     "scale) and no step is ever skipped for an inf or NaN gradient.")
    sweep = result.get("sweep")
    same = [n for n, r in runs.items() if r.get("sweep_measured_nothing")]
    if sweep and same:
        token = "{" + sweep["name"] + "}"
        how = (f"it replaced {token} in the arguments" if any(token in arg for arg in result.get("args", []))
               else f"no argument has {token}, so it was only set as the environment variable {sweep['name']}")
        tried = sorted({s["value"] for n in same for s in runs[n].get("sweep") or []})
        notes.append(f"The sweep measured nothing for {_names(same)}: peak allocated and reserved were the same at "
                     f"{sweep['name']}={_names([str(v) for v in tried])} ({how}), so no value is the largest "
                     "that fits.")
    return notes


def format_report(result):
    """The text report: one row per allocator, the verdict, the notes."""
    headers, rows = _columns(result)
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows)]
    lines = [f"vramguard dryrun: {result.get('script')} on a phantom {result['gpu']} "
             f"({format_size(result['device_bytes'])}, of which the CUDA context holds "
             f"{format_size(result.get('context_bytes', 0))})"]
    lines += _card_line(result)
    for i, row in enumerate([headers] + rows):
        cells = [str(c).ljust(w) if j in (0, len(row) - 1) else str(c).rjust(w)
                 for j, (c, w) in enumerate(zip(row, widths))]
        lines.append("  ".join(cells).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    lines += _verdict(result)
    lines += _managed_lines(result)
    lines += _need_lines(result)
    lines += remedy_runs.table_lines(result)
    lines += _margin_note(result)
    lines += _notes(result)
    rss = result.get("host_peak_rss_bytes")
    if rss:
        lines.append(f"Host memory: peak RSS {format_size(rss)} (the largest run's).")
    if result.get("out_dir"):
        snapshots = any(r.get("snapshot") for r in DryRunResult(result).runs.values())
        lines.append(("Snapshots and logs (memory snapshots open at pytorch.org/memory_viz): " if snapshots
                      else "Logs and figures (no memory snapshots): ") + result["out_dir"])
    return "\n".join(lines)


def report_html(result):
    from html import escape

    from ..render.html import _verdict as verdict_badge, table

    headers, rows = _columns(result)
    fits = result.get("fits")
    caption = (f"{result.get('script')} on a phantom {result['gpu']} ({format_size(result['device_bytes'])})")
    lines = (_card_line(result) + _verdict(result) + _managed_lines(result) + _need_lines(result)
             + _margin_note(result) + _notes(result))
    body = "".join(f"<div>{escape(line)}</div>" for line in lines)
    remedies = remedy_runs.table_lines(result)
    if remedies:  # a table of its own, in the text's columns
        body += f"<pre>{escape(chr(10).join(remedies))}</pre>"
    where = (f"<div style='font-size:11px;color:#555'>snapshots and logs: {escape(result['out_dir'])}</div>"
             if result.get("out_dir") else "")
    badge = verdict_badge(bool(fits)) if fits is not None else ""
    return f"<div><b>vramguard dryrun</b> {badge}" + table(headers, rows, caption) + body + where + "</div>"


# ------------------------------------------------------------------ the dry run


def _snapshots(result, nproc):
    """The recording of each rank of a run (rank 0's is the one it names)."""
    first = result.get("snapshot")
    if nproc <= 1 or not first:
        return [first]
    return [first.replace(".rank0.pickle", f".rank{r}.pickle") for r in range(nproc)]


class _SearchFailed(Exception):
    """A run of --min-memory's or --sweep's search failed for a reason other
    than memory (fits None): the search stops there, with that run."""

    def __init__(self, run):
        super().__init__(run.get("error"))
        self.run = run


class _Runner:
    def __init__(self, script, args, gpu, memory, context, steps, snapshot, echo, notebook,
                 stdout, stderr, cwd=None, nproc=1, timeout=None):
        from .gpu import environ

        self.script, self.args = script, list(args)
        self.gpu = gpu
        self.memory = memory
        self.context, self.steps, self.snapshot, self.echo = context, steps, snapshot, echo
        self.notebook, self.cwd, self.nproc, self.timeout = notebook, cwd, nproc, timeout
        self.stdout, self.stderr = stdout, stderr
        # the phantom's libraries (built the first time), or why not, before any run
        # and before the output directory: a phantom that cannot be had leaves nothing behind
        self.base_env = environ(gpu.name, context=context)
        if nproc > 1:  # a device per rank
            self.base_env["VG_FAKECUDA_DEVICES"] = str(nproc)
        self.out_dir = None  # set by dryrun() once the environment is there
        self.live = _Live()
        self.extra_env = {}
        self.started = 0  # runs started: a dry run that fails before any leaves no temporary directory
        self.partial = None  # the result being made, and the allocators' runs that ended
        self.finished = {}
        # the user's own settings, kept: the allocator's (native, expandable) and their preloads
        self.user_alloc_conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or None
        self.user_preload = os.environ.get("LD_PRELOAD", "").strip() or None

    def say(self, text):
        with _WRITE_LOCK:
            try:
                print(f"vramguard dryrun: {text}", file=self.stderr, flush=True)
            except (OSError, ValueError):
                pass

    def say_partial(self):
        """The table of the allocators whose runs ended, when the dry run
        is cut short (Ctrl-C, SIGTERM): their figures are whole; the
        others' are not shown."""
        if self.partial is None or not self.finished:
            return
        partial = DryRunResult(self.partial, **self.finished)
        headers, rows = _columns(partial)
        widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows)]
        lines = []
        for i, row in enumerate([headers] + rows):
            lines.append("  ".join(str(c).ljust(w) if j in (0, len(row) - 1) else str(c).rjust(w)
                                   for j, (c, w) in enumerate(zip(row, widths))).rstrip())
            if i == 0:
                lines.append("  ".join("-" * w for w in widths))
        missing = [a for a in self.partial["allocators"] if a not in self.finished]
        if not missing:
            return
        self.say(f"stopped before {_names(missing)} ended; the figures of the runs that ended:\n"
                 + "\n".join(lines))

    def run(self, allocator, label, memory=None, args=None, extra_env=None, snapshot=None, steps=None):
        env = dict(self.base_env, VG_FAKECUDA_MEM=str(int(memory or self.memory)))
        if self.user_preload:  # the phantom's libraries first, then the user's
            env["LD_PRELOAD"] = f"{env['LD_PRELOAD']} {self.user_preload}"
        env.update(self.extra_env)
        conf = alloc_conf(allocator, self.user_alloc_conf)
        if conf:
            env["PYTORCH_CUDA_ALLOC_CONF"] = conf
        env.update(extra_env or {})
        size = format_size(int(memory or self.memory))
        self.say(f"{label}: running on a phantom {self.gpu.name} of {size}")
        self.started += 1
        # torch.compile's cache, empty for each run: a cache another run
        # warmed skips the autotuning whose buffers a cold first run holds,
        # and the rows would measure different programs.
        env["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix=".inductor-", dir=self.out_dir)
        # Triton's kernels, compiled for the card, are the same whoever asks:
        # shared (Triton's own default folder), they build once.
        env.setdefault("TRITON_CACHE_DIR", os.environ.get("TRITON_CACHE_DIR")
                       or os.path.join(os.path.expanduser("~"), ".triton", "cache"))
        try:
            result = run_child(self.script, self.args if args is None else args, allocator, _child_env(env),
                               self.out_dir, label, notebook=self.notebook,
                               steps=self.steps if steps is None else steps,
                               snapshot=self.snapshot if snapshot is None else snapshot,
                               echo=self.echo, stdout=self.stdout, stderr=self.stderr, live=self.live,
                               cwd=self.cwd and self.cwd.replace(CWD_PER_RUN, allocator),
                               nproc=self.nproc, timeout=self.timeout)
        finally:
            shutil.rmtree(env["TORCHINDUCTOR_CACHE_DIR"], ignore_errors=True)
        result["alloc_conf_set"] = conf  # what the run was given; alloc_conf: what it had at its end
        recorded = self.snapshot if snapshot is None else snapshot
        if recorded or memory is None:  # a search's runs record nothing, and need no need
            measure_need(result, _snapshots(result, self.nproc) if recorded else [], GRANULE, HISTORY_ENTRIES)
        verdict = ("timed out" if result.get("timed_out")
                   else "never used the GPU" if never_used_gpu(result)
                   else "failed in the phantom" if phantom_failed(result)
                   else {True: "fits", False: "out of memory", None: "failed"}[result.get("fits")])
        self.say(f"{label}: {verdict}, peak allocated {_size(result.get('peak_allocated_bytes'))}, "
                 f"reserved {_size(result.get('peak_reserved_bytes'))} ({result.get('elapsed_s', 0):.1f}s)")
        return result

    def min_memory(self, allocator, full):
        """The smallest device on which the run fits, by bisection: exact to
        GRANULE (the sizes tried are its multiples), or the card's own size
        (the full run's, which need not be a multiple) when nothing smaller
        fits. Below the context plus the peak allocated nothing can fit;
        what the device held at its peak in the full run (the context, the
        libraries' own memory such as cuBLAS's handle, and the allocator's
        reserve) is tried first, as the likely answer, so that the search is
        over a few GRANULEs, not the card. Only an out-of-memory (fits False)
        narrows the search from below: a run that fails otherwise (fits
        None) stops it, raising _SearchFailed with that run."""
        top = int(self.memory)

        def fits(size):
            r = self.run(allocator, f"{allocator} {format_size(size)}", memory=size, snapshot=False)
            if r.get("fits") is None:
                r["failed_at"] = {"memory_bytes": size}
                raise _SearchFailed(r)
            return r["fits"]

        if full.get("fits") is None:
            return None
        if not full.get("fits"):
            return self._min_memory_above(top, fits, full)
        need = self.context + int(full.get("peak_allocated_bytes") or 0)
        lo = max(0, (need - 1) // GRANULE * GRANULE)  # does not fit
        hi = top  # fits
        # the replay's need where measured, else what the device held at its fullest
        held = (int(full.get("need_bytes") or 0) or int(full.get("device_peak_bytes") or 0)
                or self.context + int(full.get("peak_reserved_bytes") or 0))
        guess = -(-held // GRANULE) * GRANULE

        if lo < guess < hi:
            if fits(guess):
                hi = guess
            else:
                lo = guess
        while hi - lo > GRANULE:
            mid = (lo + hi) // 2 // GRANULE * GRANULE
            if mid <= lo:
                mid = lo + GRANULE
            if mid >= hi:
                break
            if fits(mid):
                hi = mid
            else:
                lo = mid
        return hi

    def _min_memory_above(self, top, fits, full):
        """The smallest device for a run that ran out of memory on the card:
        larger phantoms (device memory there costs no host memory), doubling
        from the card's size up to MAX_SEARCH_BYTES, then bisection. None,
        with full["min_memory_above_bytes"], when none of them fits."""
        lo, hi = top, None
        size = -(-2 * top // GRANULE) * GRANULE
        while size <= MAX_SEARCH_BYTES:
            if fits(size):
                hi = size
                break
            lo, size = size, 2 * size
        if hi is None:
            full["min_memory_above_bytes"] = lo
            return None
        while hi - lo > GRANULE:
            mid = -(-((lo + hi) // 2) // GRANULE) * GRANULE
            if mid >= hi:
                break
            if fits(mid):
                hi = mid
            else:
                lo = mid
        return hi

    def with_value(self, name, value):
        """The script's arguments and environment for one value of a sweep:
        the value in place of "{NAME}" in the arguments, or the variable
        NAME when no argument has it."""
        token = "{" + name + "}"
        if any(token in a for a in self.args):
            return [a.replace(token, str(value)) for a in self.args], {}
        return self.args, {name: str(value)}

    def sweep(self, allocator, name, values, extra_env=None, label=None):
        """The largest value that fits, by bisection over the increasing
        values (a larger one never needs less memory): about log2 of their
        count in runs, not one per value. Returns it (None when the
        smallest does not fit), the runs made, in the values' order, and the
        run that failed for a reason other than memory (fits None), which
        ends the search with no answer, or None."""
        tried = {}

        def run(value):
            args, env = self.with_value(name, value)
            r = self.run(allocator, f"{label or allocator} {name}={value}", args=args,
                         extra_env=dict(extra_env or {}, **env))
            r["sweep_value"] = value
            tried[value] = r
            return r

        lo, hi = -1, len(values)  # values[lo] fits, values[hi] does not (-1, len: not known)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            r = run(values[mid])
            if r.get("fits") is None:  # not an out-of-memory: it says nothing of the values above
                r["failed_at"] = {"value": values[mid]}
                return None, [tried[v] for v in sorted(tried)], r
            if r["fits"]:
                lo = mid
            else:
                hi = mid
        return (values[lo] if lo >= 0 else None), [tried[v] for v in sorted(tried)], None


def dryrun(script, *args, gpu="T4", allocators=ALLOCATORS, memory=None, min_memory=False, sweep=None,
           out=None, steps=None, context=None, snapshot=True, echo=True, stdout=None,
           stderr=None, jobs=None, no_compile=False, cwd=None, nproc=1, timeout=None, weights=True,
           world_size=None, rank=None, gpus_per_node=8, remedies=False):
    """Run `script` with `args` on a phantom `gpu` once per allocator and
    return a DryRunResult: per allocator its need (need_bytes: the
    smallest device, from a replay of its run's recording; None, with
    need_unmeasured saying why, without a complete recording), peak
    allocated and reserved bytes, whether it fits, its first out-of-memory
    (line and request); `verdict` and `exit_code` say the whole
    (exit_status(): fits, does not fit, script failed, never used the GPU,
    phantom failed, timed out).

    gpu: a preset (vramguard.PRESETS). allocators: some of "native",
    "expandable", "vramguard" (a list, or "native,vramguard"). memory: the
    device's bytes instead of the preset's total ("8GiB"). min_memory: also
    find each allocator's smallest device (more runs: about log2 of the
    range / 16 MiB), exact to 16 MiB, or the card's size when only the
    whole card fits, or above the card's when it does not fit there.
    sweep: "BATCH=1,2,4,8": each value substituted for
    "{BATCH}" in the arguments (or set as the variable BATCH when no
    argument has it); the largest that fits is found by bisection
    (`largest_value` per allocator; `largest_batch` too, whatever the
    name; None, with sweep_measured_nothing, when every run gave the same
    figures). A run of either search that fails for a reason other than memory
    stops that allocator's search: its result is that run's (fits None, its
    error and exit status, `failed_at`). out: the directory for snapshots,
    logs and results (default: a new temporary one, removed again when the
    dry run fails before any run). steps: stop each run after that many
    optimizer steps. timeout: end each run after that many seconds (its
    figures so far are kept; it is reported as timed out). context: the
    bytes the CUDA context holds on the device (default: the preset's, 400
    MiB unless measured on the card). out: the folder in which the dry run
    makes a new folder of its own (dryrun-<time>-<random>) for its files:
    a dry run never writes into another's files nor reads them. cwd: the
    directory the script runs in (default this one: its files are real
    files, so a checkpoint it saves, zeros on a phantom, overwrites a real
    one); "{allocator}" in it makes it a folder per allocator. A run's
    stdin is /dev/null.
    echo: pass the script's output through (prefixed by its run). jobs:
    allocators run at once (default 1: one at a time; more only with a
    cwd that has "{allocator}" in it, since their file I/O is real).
    no_compile: torch.compile off (TORCH_COMPILE_DISABLE=1): eager mode's
    figures, for a script whose compilation fails on the phantom.
    nproc: ranks (torchrun --standalone --nproc_per_node N), each on a
    phantom device of its own (LOCAL_RANK's; the script sets it, as on
    GPUs), through the phantom's NCCL; each run's figures are its largest
    rank's, and `ranks` has each rank's.
    world_size: one process per allocator runs as rank `rank` (default 0)
    of `world_size` on PyTorch's fake process group, on nodes of
    `gpus_per_node` phantom GPUs (vramguard.phantom.fake_world): one rank's
    figures for a data-parallel job of any size; not with nproc.
    remedies: True also runs the standard remedies on the unchanged
    program (vramguard.phantom.remedies: autocast, activation
    checkpointing, an 8-bit or fused optimizer, then greedy combinations
    until one fits), each measured, with its work relative to the program
    as written, the cheapest that fits and the code that applies it
    (`remedies` in the result); with sweep, each remedy's largest value
    and the accumulation that keeps the largest value's batch.
    weights: False loads Hugging Face models (from_pretrained of a Hub id
    or a local folder) from a stand-in of their safetensors checkpoint, the
    same names, shapes and dtypes with no data (vramguard.phantom.weightless):
    nothing downloaded or read but configs and headers.
    PYTORCH_CUDA_ALLOC_CONF, where set, is kept for native and, with
    expandable_segments:True, for expandable; LD_PRELOAD comes after the
    phantom's libraries."""
    allocators = parse_allocators(allocators)
    preset = _check_gpu(gpu)
    sweep_spec = parse_sweep(sweep) if sweep is not None else None
    if sweep_spec:
        _check_placeholders(sweep_spec, args)
    if sweep_spec and min_memory:
        raise DryRunInputError(f"{argnames.name('min_memory')} and {argnames.name('sweep')} cannot be combined: "
                               f"run {argnames.name('min_memory')} on one value")
    if not isinstance(remedies, bool):
        raise DryRunInputError(f"{argnames.name('remedies')} is True or False, got {remedies!r}")
    if remedies and min_memory:
        raise DryRunInputError(f"{argnames.name('remedies')} and {argnames.name('min_memory')} cannot be combined: "
                               f"run {argnames.name('min_memory')} on its own")
    remedies_wanted = remedies
    script = _check_script(script)
    device, context = check_device(memory, preset, context)
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        raise DryRunInputError(f"{argnames.name('steps')} must be a whole number above 0, got {steps!r}")
    if isinstance(nproc, bool) or not isinstance(nproc, int) or not 1 <= nproc <= 16:
        raise DryRunInputError(f"{argnames.name('nproc')} must be a whole number from 1 to 16, got {nproc!r}")
    try:
        check_world(world_size, rank, gpus_per_node, nproc, arg=argnames.name)
    except ValueError as exc:
        raise DryRunInputError(str(exc)) from None
    timeout = _check_timeout(timeout)
    out_path = _check_out(out)
    cwd = _check_cwd(cwd, allocators)
    jobs = _check_jobs(jobs, allocators, cwd)
    _check_platform()
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise DryRunInputError(f"PyTorch is not installed in this Python ({sys.executable}): "
                               "a dry run runs the script with it")
    stdout = sys.stdout if stdout is None else stdout
    stderr = sys.stderr if stderr is None else stderr
    # The phantom's environment first: where it cannot be had, no directory is made.
    runner = _Runner(script, args, preset, device, context, steps, snapshot, echo,
                     script.endswith(".ipynb"), stdout, stderr, cwd=cwd, nproc=nproc, timeout=timeout)
    if no_compile:
        runner.extra_env["TORCH_COMPILE_DISABLE"] = "1"
    if world_size is not None:
        runner.extra_env.update(world_env(world_size, rank or 0, gpus_per_node))
    if remedies_wanted:  # every run counts its work and records what the program does
        runner.extra_env[remedy_runs.WORK_ENV] = "1"
    out_dir = _make_out_dir(out_path, out)
    runner.out_dir = out_dir
    if not weights:
        runner.extra_env[NO_WEIGHTS_ENV] = os.path.join(out_dir, "weightless")
    try:
        _make_cwds(cwd, allocators)
        return _dryrun(runner, script, args, preset, device, context, allocators, min_memory, sweep_spec,
                       steps, no_compile, jobs, cwd, want_remedies=remedies_wanted)
    except BaseException:
        if runner.started:
            runner.say_partial()
            runner.say(f"the logs so far are in {out_dir}")
        else:
            shutil.rmtree(out_dir, ignore_errors=True)  # nothing in it, and nobody told where it is
        raise


def _make_out_dir(out_path, out):
    """A new folder of this dry run's own (mkdtemp: made by this call, so
    nothing in it was planted, and no other dry run writes in it): in
    --out, named by the time it started, else a temporary one."""
    if out_path is None:
        return tempfile.mkdtemp(prefix="vramguard-dryrun-")
    try:
        os.makedirs(out_path, exist_ok=True)
        return tempfile.mkdtemp(prefix=time.strftime("dryrun-%Y%m%d-%H%M%S-"), dir=out_path)
    except OSError as exc:
        raise DryRunInputError(f"{argnames.given('out', os.fspath(out), quote=False)}: "
                               f"{exc.strerror or exc}") from None


def _check_platform():
    """A dry run needs Linux: the phantom stands in for the CUDA libraries
    of PyTorch's Linux wheels (LD_PRELOAD), which macOS and Windows lack."""
    if not sys.platform.startswith("linux"):
        raise DryRunInputError(
            f"a dry run needs Linux and PyTorch's CUDA build (pip's Linux wheels), and this is {sys.platform}: "
            "run it in a Linux container or a Colab CPU runtime (docs/would-it-fit.md, 'Where it runs')")


def _dryrun(runner, script, args, preset, device, context, allocators, min_memory, sweep_spec, steps,
            no_compile, jobs, cwd, want_remedies=False):
    result = DryRunResult(gpu=preset.name, device_bytes=device, context_bytes=context, script=script,
                          args=[str(a) for a in args], out_dir=runner.out_dir, steps=steps,
                          allocators=list(allocators), min_memory=bool(min_memory),
                          no_compile=bool(no_compile), cwd=cwd or os.getcwd(), cwd_given=cwd is not None,
                          user_alloc_conf=runner.user_alloc_conf, nproc=runner.nproc,
                          weights=NO_WEIGHTS_ENV not in runner.extra_env,
                          world_size=_world_size(runner), rank=_world_rank(runner))
    if sweep_spec:
        result["sweep"] = {"name": sweep_spec[0], "values": sweep_spec[1]}
    started = time.monotonic()
    stopped = []  # the run that failed in the phantom, whatever the allocator: the others are not run

    def one(allocator):
        if stopped:
            return _not_run(allocator, stopped[0])
        if not sweep_spec:
            run = runner.run(allocator, allocator)
            if min_memory:
                try:
                    run["min_memory_bytes"] = runner.min_memory(allocator, run)
                except _SearchFailed as stop:  # the failed run is the answer: its error and its status
                    run = dict(stop.run, min_memory_bytes=None)
            if _fails_for_every_allocator(run):
                stopped.append(run)
            return run
        name = sweep_spec[0]
        largest, runs, failed = runner.sweep(allocator, *sweep_spec)
        if failed is not None:
            run = {k: v for k, v in failed.items() if k != "sweep_value"}
        else:
            # The smallest value tried that ran out of memory: where the sweep broke.
            broke = next((r for r in runs if r.get("fits") is False
                          and (largest is None or r["sweep_value"] > largest)), None)
            chosen = next((r for r in runs if r["sweep_value"] == largest), broke)
            run = {k: v for k, v in chosen.items() if k != "sweep_value"}
            run["fits"] = largest is not None
            if broke is not None:
                run["first_oom"] = broke.get("first_oom")
                if run["first_oom"]:
                    run["first_oom"] = dict(run["first_oom"], value=broke["sweep_value"])
        if failed is None and _measured_nothing(runs):
            # the value changed nothing measured: no value is the largest that fits
            largest = None
            run = {k: v for k, v in runs[-1].items() if k != "sweep_value"}
            run["sweep_measured_nothing"] = True
        # largest_batch: the key the sweep's answer always had, whatever its name (kept)
        run.update(largest_value=largest, largest_batch=largest, sweep_name=name)
        run["sweep"] = [dict({k: r.get(k) for k in ("fits", "peak_allocated_bytes", "peak_reserved_bytes",
                                                     "first_oom", "error", "exit_status")},
                             value=r["sweep_value"], work_flops=remedy_runs.work_of(r))
                        for r in runs]
        return run

    def kept(allocator):  # each allocator's figures as it ends: Ctrl-C shows those
        run = one(allocator)
        runner.finished[allocator] = run
        return run

    runner.partial = result
    for allocator, run in zip(allocators, _each(kept, allocators, jobs, runner.live)):
        result[allocator] = run
    runs = result.runs.values()
    result["torch"] = next((r.get("torch") for r in runs if r.get("torch")), None)
    rss = [r.get("host_peak_rss_bytes") for r in runs if r.get("host_peak_rss_bytes")]
    result["host_peak_rss_bytes"] = max(rss) if rss else None
    reads = [r.get("d2h_reads") for r in runs if r.get("d2h_reads") is not None]
    result["d2h_reads"] = max(reads) if reads else None
    managed.summarize(result, runs)
    if want_remedies:
        runner.say("measuring the remedies on the unchanged program")
        result["remedies"] = remedy_runs.measure(runner, result, preset, sweep_spec,
                                                 _remedies_unmeasured(result[remedy_runs.allocator_of(result)]),
                                                 device=_device(result))
    result["elapsed_s"] = round(time.monotonic() - started, 3)
    deciding = [result["vramguard"]] if "vramguard" in result else list(runs)
    result["fits"] = (True if all(r.get("fits") for r in deciding)
                      else False if any(r.get("fits") is False for r in deciding) else None)
    result["exit_code"] = exit_status(result)
    result["verdict"] = VERDICTS[result["exit_code"]]
    return result


def _remedies_unmeasured(baseline):
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


def _world_size(runner):
    spec = runner.extra_env.get(WORLD_ENV)
    return int(spec.split("/")[1]) if spec else None


def _world_rank(runner):
    spec = runner.extra_env.get(WORLD_ENV)
    return int(spec.split("/")[0]) if spec else None


def _fails_for_every_allocator(run):
    """A run that failed in the phantom at a call no allocator makes (CUDA
    IPC, managed memory, a library's): every allocator's run would fail
    there the same way. One of the allocators' own memory calls would not."""
    if not phantom_failed(run):
        return False
    last = (run.get("phantom_unsupported") or {}).get("last") or ""
    return not last.startswith(_ALLOCATOR_CALLS)


def _not_run(allocator, failed):
    """The record of a run not made: an earlier one failed in the phantom
    at a call every allocator's run makes alike."""
    at = f" at {failed['error_at']}" if failed.get("error_at") else ""
    gap = failed.get("phantom_unsupported") or {}
    return {"allocator": allocator, "peak_allocated_bytes": None, "peak_reserved_bytes": None,
            "fits": None, "first_oom": None, "d2h_reads": None, "host_peak_rss_bytes": None,
            "snapshot": None, "compiled": {}, "extensions": {}, "used_gpu": failed.get("used_gpu"),
            "phantom_unsupported": failed.get("phantom_unsupported"), "exit_status": None,
            "error": (f"not run: the {failed['allocator']} run failed in the phantom{at}"
                      + (f" ({gap['last']} is not modelled)" if gap.get("last") else "")
                      + ", a line no allocator's run gets past on a phantom"),
            "not_run": True}


def _measured_nothing(runs):
    """Whether a sweep's runs (two or more) all gave the same figures: the
    swept value changed nothing the dry run measures."""
    keys = ("fits", "peak_allocated_bytes", "peak_reserved_bytes", "device_peak_bytes")
    return len(runs) > 1 and len({tuple(r.get(k) for k in keys) for r in runs}) == 1


def _check_placeholders(sweep_spec, args):
    """A placeholder in the arguments that names the swept variable in
    another case ({BATCH} for --sweep batch=...) would pass on as it is."""
    name = sweep_spec[0]
    for arg in args:
        for found in re.findall(r"\{([A-Za-z_][A-Za-z0-9_]*)\}", str(arg)):
            if found != name and found.lower() == name.lower():
                raise DryRunInputError(f"--sweep {name}=...: the arguments have {{{found}}}, not {{{name}}}: "
                                       "the name and the placeholder must match, case included")


def default_jobs(allocators):
    """Allocators run at once unless asked: one. Runs at once would share
    the folder the script runs in, whose file I/O is real (one run loading
    the checkpoint another is writing); --jobs N with a --cwd per
    allocator asks for more."""
    return 1


def _each(fn, items, jobs, live):
    """[fn(item) for item in items], `jobs` at a time in threads; Ctrl-C
    (in this, the main thread) ends every child running."""
    if jobs <= 1 or len(items) <= 1:
        return [fn(item) for item in items]
    from concurrent.futures import ThreadPoolExecutor, wait

    pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="vramguard-dryrun")
    futures = [pool.submit(fn, item) for item in items]
    try:
        pending = set(futures)
        while pending:  # a timeout, so that Ctrl-C reaches this thread
            _, pending = wait(pending, timeout=0.2)
    except BaseException:
        live.cancel()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return [f.result() for f in futures]


def exit_status(result):
    """The dry run's status, from the deciding runs (vramguard's, or every
    allocator's when vramguard was not asked): EXIT_FITS when all fit,
    EXIT_DOES_NOT_FIT when one ran out of memory, EXIT_PHANTOM_FAILED when
    the others failed in the phantom, EXIT_SCRIPT_FAILED when the script
    failed otherwise (its own status is in the report, not here),
    EXIT_TIMED_OUT when a run was ended at --timeout, and
    EXIT_NEVER_USED_GPU when it ended without using the GPU."""
    deciding = [result["vramguard"]] if "vramguard" in result else list(DryRunResult(result).runs.values())
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


#: The verdict's word in the JSON, by exit status.
VERDICTS = {EXIT_FITS: "fits", EXIT_DOES_NOT_FIT: "does not fit", EXIT_SCRIPT_FAILED: "script failed",
            EXIT_NEVER_USED_GPU: "never used the GPU", EXIT_PHANTOM_FAILED: "phantom failed",
            EXIT_TIMED_OUT: "timed out"}
