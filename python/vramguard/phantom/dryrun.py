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

--min-memory finds each allocator's smallest device by running again on
smaller phantoms (the real out-of-memory path, not a replay); --sweep
BATCH=1,2,4,8 finds the largest value that fits by bisection.
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
from ..render.words import count

__all__ = ["ALLOCATORS", "DryRunResult", "dryrun", "format_report", "parse_allocators", "parse_sweep"]

ALLOCATORS = ("native", "expandable", "vramguard")
#: --min-memory's answer is exact to this: the device sizes tried are its multiples.
GRANULE = 16 << 20
#: How long a child interrupted by Ctrl-C has to end before it is killed.
KILL_GRACE_S = 2.0
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
        raise DryRunInputError(f"--sweep {text!r}: expected NAME=V1,V2,... (e.g. BATCH=1,2,4,8)")
    name, raw = match.groups()
    if name in _RESERVED_ENV or name.startswith(_RESERVED_PREFIXES):
        raise DryRunInputError(f"--sweep {text!r}: {name} is a variable the dry run sets or needs: "
                               "sweep another name (e.g. BATCH)")
    values = []
    for part in raw.split(","):
        part = part.strip()
        if not re.fullmatch(r"[0-9]+", part) or int(part) < 1:
            raise DryRunInputError(f"--sweep {text!r}: {part!r} is not a whole number above 0")
        values.append(int(part))
    if any(b <= a for a, b in zip(values, values[1:])):
        raise DryRunInputError(f"--sweep {text!r}: the values must increase")
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
        raise DryRunInputError(f"--{what} {value!r}: {said}") from None
    return nbytes


def check_device(memory, preset, context=None):
    """(device bytes, context bytes): `memory` (bytes or "8GiB"; None: the
    preset's total) and `context` (None: the preset's), refused with one
    line when the device would hold nothing beside its CUDA context. The
    dry run's rule, and a phantom kernel's."""
    device = _check_size(memory, "memory") if memory is not None else preset.total_bytes
    context = _check_size(context, "context") if context is not None else preset.context_bytes
    if device <= context:
        raise DryRunInputError(f"--memory {format_size(device)} leaves nothing beside the CUDA context's "
                               f"{format_size(context)}")
    return device, context


def _check_out(out):
    """--out: a directory, or a path where one can be made."""
    if out is None:
        return None
    path = os.path.abspath(os.fspath(out))
    if os.path.exists(path) and not os.path.isdir(path):
        raise DryRunInputError(f"--out {os.fspath(out)}: is a file, not a directory")
    return path


def _check_cwd(cwd):
    """--cwd: an existing directory, where the script runs."""
    if cwd is None:
        return None
    path = os.path.abspath(os.fspath(cwd))
    if not os.path.exists(path):
        raise DryRunInputError(f"--cwd {os.fspath(cwd)}: No such directory")
    if not os.path.isdir(path):
        raise DryRunInputError(f"--cwd {os.fspath(cwd)}: is a file, not a directory")
    return path


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


def _no_figures(rc):
    """Why a run that wrote no figures ended, from its exit status (the
    status itself is said beside it, not here)."""
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        return f"killed by {name} before its figures were written"
    if rc == 0:
        return "ended by os._exit before its figures were written"
    return "ended before its figures were written (os._exit, or a crash: see its log)"


def run_child(script, args, allocator, env, out_dir, label, *, notebook=False, steps=0,
              snapshot=True, echo=True, stdout=None, stderr=None, live=None, cwd=None, nproc=1):
    """Runs the script once in a child on the phantom (in `cwd`, default
    this process's working directory); returns the child's figures (a
    dict), with `exit_status` and `log` added. Ctrl-C here ends the child
    and its process group (and those `live` holds) before KeyboardInterrupt
    goes on; a run is taken for interrupted only then (`live` cancelled),
    never for its status: a script's own exit status 130 or
    KeyboardInterrupt is its own failure."""
    live = _Live() if live is None else live
    if live.cancelled:
        raise KeyboardInterrupt
    stem = re.sub(r"[^A-Za-z0-9_.=-]+", "_", label)
    # nproc > 1: torchrun starts the ranks, each writes its own figures ({rank})
    ranked = f"{stem}.rank{{rank}}" if nproc > 1 else stem
    result_path = os.path.join(out_dir, f"{ranked}.json")
    log_path = os.path.join(out_dir, f"{stem}.log")
    for path in [result_path.replace("{rank}", str(r)) for r in range(nproc)]:
        if os.path.exists(path):
            os.unlink(path)
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
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True, cwd=cwd)
        live.add(proc)
        prefix = f"[{label}] "
        threads = [_Forward(proc.stdout, stdout if echo else None, prefix, log),
                   _Forward(proc.stderr, stderr if echo else None, prefix, log)]
        for t in threads:
            t.start()
        try:
            rc = proc.wait()
        except BaseException:
            live.cancel()
            for t in threads:
                t.join(timeout=1.0)
            raise
        finally:
            live.discard(proc)
        for t in threads:
            t.join()
        proc.stdout.close()
        proc.stderr.close()
        _signal_group(proc, signal.SIGKILL)  # the script's leftovers (a worker that outlived it) go with it
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
            "error": _no_figures(rc),
        }
    result.setdefault("exit_status", status)  # the script's own, which the child wrote
    result["log"] = log_path
    result.setdefault("elapsed_s", round(time.monotonic() - started, 3))
    return result


RANK_KEYS = ("peak_allocated_bytes", "peak_reserved_bytes", "device_peak_bytes", "fits", "first_oom",
             "error", "exit_status")


def _ranks_result(paths):
    """One run's figures from its ranks' files (dryrun --nproc): rank 0's,
    with the peaks the largest of any rank's, fits only when every rank
    fits (False when one ran out of memory), the first out-of-memory and
    error of the lowest rank that had one, and `ranks`, each rank's own.
    OSError when a rank wrote none."""
    ranks = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            ranks.append(json.load(f))
    result = dict(ranks[0])
    for key in ("peak_allocated_bytes", "peak_reserved_bytes", "device_peak_bytes", "host_peak_rss_bytes"):
        values = [r.get(key) for r in ranks if r.get(key) is not None]
        result[key] = max(values) if values else None
    fits = [r.get("fits") for r in ranks]
    result["fits"] = False if False in fits else None if None in fits else True
    for key in ("first_oom", "error"):
        result[key] = next((r.get(key) for r in ranks if r.get(key)), None)
    result["exit_status"] = next((r.get("exit_status") for r in ranks if r.get("exit_status")), 0)
    result["ranks"] = [dict({k: r.get(k) for k in RANK_KEYS}, rank=i) for i, r in enumerate(ranks)]
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


def _fits_word(fits):
    return {True: "yes", False: "NO", None: "error"}[fits]


def _oom_text(run, sweep_name=None):
    oom = run.get("first_oom")
    if not oom:
        error = run.get("error")
        return "-" if error is None else (error if len(error) <= 48 else error[:47] + "...")
    where = oom.get("line") or "unknown line"
    request = oom.get("request_bytes")
    text = f"{where} ({_size(request)})" if request else where
    if oom.get("value") is not None:
        text += f" at {sweep_name}={oom['value']}"
    return text + (" caught" if oom.get("caught") else "")


def _columns(result):
    headers = ["allocator", "peak allocated", "peak reserved", "fits", "first OOM (request)"]
    sweep = result.get("sweep")
    if result.get("min_memory"):
        headers.insert(4, "min memory")
    if sweep:
        headers.insert(4, f"largest {sweep['name']}")
    rows = []
    for name, run in DryRunResult(result).runs.items():
        row = [name, _size(run.get("peak_allocated_bytes")), _size(run.get("peak_reserved_bytes")),
               _fits_word(run.get("fits")), _oom_text(run, sweep and sweep["name"])]
        if result.get("min_memory"):
            row.insert(4, _size(run.get("min_memory_bytes")))
        if sweep:
            largest = run.get("largest_batch")
            row.insert(4, "unknown" if run.get("fits") is None
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


def _verdict(result):
    runs = DryRunResult(result).runs
    gpu = _device(result)
    sweep = result.get("sweep")
    fit = [n for n, r in runs.items() if r.get("fits")]
    oom = [n for n, r in runs.items() if r.get("fits") is False]
    failed = [n for n, r in runs.items() if r.get("fits") is None]
    if sweep:
        lines = []
        for n, r in runs.items():
            value = (r.get("failed_at") or {}).get("value")
            if r.get("fits") is None:
                lines.append(f"{n}: not known, the script failed"
                             + (f" at {sweep['name']}={value}" if value is not None else ""))
            elif r.get("largest_batch") is not None:
                lines.append(f"{n}: {sweep['name']}={r['largest_batch']}")
            else:
                lines.append(f"{n}: no {sweep['name']} fits")
        head = f"Largest {sweep['name']} that fits on a {gpu}: " + "; ".join(lines) + "."
    elif len(fit) == len(runs):
        head = f"Fits on a {gpu} with {'every allocator tried' if len(runs) > 1 else fit[0]}."
    elif fit:
        head = f"Fits on a {gpu} with {_names(fit)}" + (f"; not with {_names(oom)}" if oom else "") + "."
    elif oom and not failed:
        head = f"Does not fit on a {gpu} with any allocator tried."
    elif oom:
        head = f"Does not fit on a {gpu} with {_names(oom)}."
    else:
        head = "The script failed before its end: whether it fits is not known."
    if failed and (fit or oom):
        head += f" With {_names(failed)} the script failed before its end (below)."
    out = [head]
    if result.get("min_memory"):
        sizes = {n: r.get("min_memory_bytes") for n, r in runs.items() if r.get("min_memory_bytes")}
        if sizes:
            least = min(sizes.values())
            best = _names([n for n, size in sizes.items() if size == least])
            smallest = [p.name for p in sorted(PRESETS.values(), key=lambda p: p.total_bytes)
                        if p.total_bytes >= least]
            card = f" (the smallest preset that holds it: {smallest[0]})" if smallest else ""
            out.append(f"Smallest device: {format_size(least)} with {best}{card}, "
                       f"exact to {GRANULE >> 20} MiB, the CUDA context's "
                       f"{format_size(result.get('context_bytes', 0))} included.")
        elif any(r.get("fits") is None for r in runs.values()):
            out.append("Smallest device: not known: the search stopped where the script failed (below).")
        else:
            out.append("Smallest device: none found (it does not fit the full device).")
    return out


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
        notes.append(f"The program read device values back {max(reads):,} times: {READS_NOTE}.")
    adjusted = [r.get("ddp_adjusted") or 0 for r in runs]
    if adjusted and max(adjusted) > 0:
        notes.append(f"DistributedDataParallel reads device values back at its start and after its first "
                     f"step (zeros here): the dry run gave its {max(adjusted)} DDP module(s) init_sync=False "
                     f"and find_unused_parameters=True, the same gradient buckets in their first order.")
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
    if runs and not any(r.get("used_cuda", True) for r in runs):
        notes.append("The script never used the GPU (torch.cuda was never initialised): nothing to measure.")
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
        if r.get("error"):
            failed_at = r.get("failed_at") or {}
            at = (f" at {r.get('sweep_name') or (result.get('sweep') or {}).get('name')}={failed_at['value']}"
                  if "value" in failed_at
                  else f" on a device of {format_size(failed_at['memory_bytes'])} (--min-memory)"
                  if "memory_bytes" in failed_at else "")
            notes.append(f"{r['allocator']}: the script failed{at}: {r['error']} "
                         f"(exit status {r.get('exit_status')}).")
    missing = sorted({lib for r in runs for key, lib in _PHANTOM_GAPS if key in (r.get("error") or "")})
    if missing:
        notes.append(f"That failure is the phantom's, not the script's: this build of the phantom GPU has no "
                     f"stand-in for {_names(missing)}.")
    if result.get("cwd"):
        notes.append(f"The script ran in {result['cwd']}{' (--cwd)' if result.get('cwd_given') else ''} "
                     "with real file I/O: files it writes (a torch.save checkpoint holds zeros on a phantom) "
                     "overwrite real ones" + ("." if result.get("cwd_given") else "; --cwd DIR runs it elsewhere."))
    return notes


def format_report(result):
    """The text report: one row per allocator, the verdict, the notes."""
    headers, rows = _columns(result)
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows)]
    lines = [f"vramguard dryrun: {result.get('script')} on a phantom {result['gpu']} "
             f"({format_size(result['device_bytes'])}, of which the CUDA context holds "
             f"{format_size(result.get('context_bytes', 0))})"]
    for i, row in enumerate([headers] + rows):
        cells = [str(c).ljust(w) if j in (0, len(row) - 1) else str(c).rjust(w)
                 for j, (c, w) in enumerate(zip(row, widths))]
        lines.append("  ".join(cells).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    lines += _verdict(result)
    lines += _notes(result)
    rss = result.get("host_peak_rss_bytes")
    if rss:
        lines.append(f"Host memory: peak RSS {format_size(rss)} (the largest run's).")
    if result.get("out_dir"):
        lines.append("Snapshots and logs (memory snapshots open at pytorch.org/memory_viz): "
                     f"{result['out_dir']}")
    return "\n".join(lines)


def report_html(result):
    from html import escape

    from ..render.html import _verdict as verdict_badge, table

    headers, rows = _columns(result)
    fits = result.get("fits")
    caption = (f"{result.get('script')} on a phantom {result['gpu']} ({format_size(result['device_bytes'])})")
    lines = _verdict(result) + _notes(result)
    body = "".join(f"<div>{escape(line)}</div>" for line in lines)
    where = (f"<div style='font-size:11px;color:#555'>snapshots and logs: {escape(result['out_dir'])}</div>"
             if result.get("out_dir") else "")
    badge = verdict_badge(bool(fits)) if fits is not None else ""
    return f"<div><b>vramguard dryrun</b> {badge}" + table(headers, rows, caption) + body + where + "</div>"


# ------------------------------------------------------------------ the dry run


class _SearchFailed(Exception):
    """A run of --min-memory's or --sweep's search failed for a reason other
    than memory (fits None): the search stops there, with that run."""

    def __init__(self, run):
        super().__init__(run.get("error"))
        self.run = run


class _Runner:
    def __init__(self, script, args, gpu, memory, context, steps, snapshot, echo, notebook,
                 stdout, stderr, cwd=None, nproc=1):
        from .gpu import environ

        self.script, self.args = script, list(args)
        self.gpu = gpu
        self.memory = memory
        self.context, self.steps, self.snapshot, self.echo = context, steps, snapshot, echo
        self.notebook, self.cwd, self.nproc = notebook, cwd, nproc
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
        # the user's own settings, kept: the allocator's (native, expandable) and their preloads
        self.user_alloc_conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or None
        self.user_preload = os.environ.get("LD_PRELOAD", "").strip() or None

    def say(self, text):
        with _WRITE_LOCK:
            try:
                print(f"vramguard dryrun: {text}", file=self.stderr, flush=True)
            except (OSError, ValueError):
                pass

    def run(self, allocator, label, memory=None, args=None, extra_env=None, snapshot=None):
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
                               steps=self.steps, snapshot=self.snapshot if snapshot is None else snapshot,
                               echo=self.echo, stdout=self.stdout, stderr=self.stderr, live=self.live,
                               cwd=self.cwd, nproc=self.nproc)
        finally:
            shutil.rmtree(env["TORCHINDUCTOR_CACHE_DIR"], ignore_errors=True)
        result["alloc_conf_set"] = conf  # what the run was given; alloc_conf: what it had at its end
        verdict = {True: "fits", False: "out of memory", None: "failed"}[result.get("fits")]
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
        if not full.get("fits"):
            return None
        need = self.context + int(full.get("peak_allocated_bytes") or 0)
        lo = max(0, (need - 1) // GRANULE * GRANULE)  # does not fit
        hi = top  # fits
        held = int(full.get("device_peak_bytes") or 0) or self.context + int(full.get("peak_reserved_bytes") or 0)
        guess = -(-held // GRANULE) * GRANULE

        def fits(size):
            r = self.run(allocator, f"{allocator} {format_size(size)}", memory=size, snapshot=False)
            if r.get("fits") is None:
                r["failed_at"] = {"memory_bytes": size}
                raise _SearchFailed(r)
            return r["fits"]

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

    def sweep(self, allocator, name, values):
        """The largest value that fits, by bisection over the increasing
        values (a larger one never needs less memory): about log2 of their
        count in runs, not one per value. Returns it (None when the
        smallest does not fit), the runs made, in the values' order, and the
        run that failed for a reason other than memory (fits None), which
        ends the search with no answer, or None."""
        token = "{" + name + "}"
        tried = {}

        def run(value):
            if any(token in a for a in self.args):
                args, env = [a.replace(token, str(value)) for a in self.args], {}
            else:
                args, env = self.args, {name: str(value)}
            r = self.run(allocator, f"{allocator} {name}={value}", args=args, extra_env=env)
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
           stderr=None, jobs=None, no_compile=False, cwd=None, nproc=1):
    """Run `script` with `args` on a phantom `gpu` once per allocator and
    return a DryRunResult: per allocator its peak allocated and reserved
    bytes, whether it fits, its first out-of-memory (line and request).

    gpu: a preset (vramguard.PRESETS). allocators: some of "native",
    "expandable", "vramguard" (a list, or "native,vramguard"). memory: the
    device's bytes instead of the preset's total ("8GiB"). min_memory: also
    find each allocator's smallest device (more runs: about log2 of the
    range / 16 MiB), exact to 16 MiB, or the card's size when only the
    whole card fits. sweep: "BATCH=1,2,4,8": each value substituted for
    "{BATCH}" in the arguments (or set as the variable BATCH when no
    argument has it); the largest that fits is found by bisection
    (`largest_value` per allocator; `largest_batch` too, whatever the
    name). A run of either search that fails for a reason other than memory
    stops that allocator's search: its result is that run's (fits None, its
    error and exit status, `failed_at`). out: the directory for snapshots,
    logs and results (default: a new temporary one, removed again when the
    dry run fails before any run). steps: stop each run after that many
    optimizer steps. context: the bytes the CUDA context holds on the
    device (default: the preset's, 400 MiB unless measured on the card).
    cwd: the directory the script runs in (default this one: its files are
    real files, so a checkpoint it saves, zeros on a phantom, overwrites a
    real one).
    echo: pass the script's output through (prefixed by its run). jobs:
    allocators run at once (default: one per two cores, at most three).
    no_compile: torch.compile off (TORCH_COMPILE_DISABLE=1): eager mode's
    figures, for a script whose compilation fails on the phantom.
    nproc: ranks (torchrun --standalone --nproc_per_node N), each on a
    phantom device of its own (LOCAL_RANK's; the script sets it, as on
    GPUs), through the phantom's NCCL; each run's figures are its largest
    rank's, and `ranks` has each rank's.
    PYTORCH_CUDA_ALLOC_CONF, where set, is kept for native and, with
    expandable_segments:True, for expandable; LD_PRELOAD comes after the
    phantom's libraries."""
    allocators = parse_allocators(allocators)
    preset = _check_gpu(gpu)
    sweep_spec = parse_sweep(sweep) if sweep is not None else None
    if sweep_spec and min_memory:
        raise DryRunInputError("--min-memory and --sweep cannot be combined: run --min-memory on one value")
    script = _check_script(script)
    device, context = check_device(memory, preset, context)
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        raise DryRunInputError(f"--steps must be a whole number above 0, got {steps!r}")
    if jobs is None:
        jobs = default_jobs(allocators)
    elif isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise DryRunInputError(f"--jobs must be a whole number above 0, got {jobs!r}")
    if isinstance(nproc, bool) or not isinstance(nproc, int) or not 1 <= nproc <= 16:
        raise DryRunInputError(f"--nproc must be a whole number from 1 to 16, got {nproc!r}")
    out_path = _check_out(out)
    cwd = _check_cwd(cwd)
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise DryRunInputError(f"PyTorch is not installed in this Python ({sys.executable}): "
                               "a dry run runs the script with it")
    stdout = sys.stdout if stdout is None else stdout
    stderr = sys.stderr if stderr is None else stderr
    # The phantom's environment first: where it cannot be had, no directory is made.
    runner = _Runner(script, args, preset, device, context, steps, snapshot, echo,
                     script.endswith(".ipynb"), stdout, stderr, cwd=cwd, nproc=nproc)
    if no_compile:
        runner.extra_env["TORCH_COMPILE_DISABLE"] = "1"
    temporary = out_path is None
    if temporary:
        out_dir = tempfile.mkdtemp(prefix="vramguard-dryrun-")
    else:
        out_dir = out_path
        try:
            os.makedirs(out_dir, exist_ok=True)
        except OSError as exc:
            raise DryRunInputError(f"--out {os.fspath(out)}: {exc.strerror or exc}") from None
    runner.out_dir = out_dir
    try:
        return _dryrun(runner, script, args, preset, device, context, allocators, min_memory, sweep_spec,
                       steps, no_compile, jobs, cwd)
    except BaseException:
        if temporary:
            if runner.started:
                runner.say(f"the logs so far are in {out_dir}")
            else:
                shutil.rmtree(out_dir, ignore_errors=True)  # nothing in it, and nobody told where it is
        raise


def _dryrun(runner, script, args, preset, device, context, allocators, min_memory, sweep_spec, steps,
            no_compile, jobs, cwd):
    result = DryRunResult(gpu=preset.name, device_bytes=device, context_bytes=context, script=script,
                          args=[str(a) for a in args], out_dir=runner.out_dir, steps=steps,
                          allocators=list(allocators), min_memory=bool(min_memory),
                          no_compile=bool(no_compile), cwd=cwd or os.getcwd(), cwd_given=cwd is not None,
                          user_alloc_conf=runner.user_alloc_conf, nproc=runner.nproc)
    if sweep_spec:
        result["sweep"] = {"name": sweep_spec[0], "values": sweep_spec[1]}
    started = time.monotonic()

    def one(allocator):
        if not sweep_spec:
            run = runner.run(allocator, allocator)
            if min_memory:
                try:
                    run["min_memory_bytes"] = runner.min_memory(allocator, run)
                except _SearchFailed as stop:  # the failed run is the answer: its error and its status
                    run = dict(stop.run, min_memory_bytes=None)
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
        # largest_batch: the key the sweep's answer always had, whatever its name (kept)
        run.update(largest_value=largest, largest_batch=largest, sweep_name=name)
        run["sweep"] = [dict({k: r.get(k) for k in ("fits", "peak_allocated_bytes", "peak_reserved_bytes",
                                                     "first_oom", "error", "exit_status")},
                             value=r["sweep_value"])
                        for r in runs]
        return run

    for allocator, run in zip(allocators, _each(one, allocators, jobs, runner.live)):
        result[allocator] = run
    runs = result.runs.values()
    result["torch"] = next((r.get("torch") for r in runs if r.get("torch")), None)
    rss = [r.get("host_peak_rss_bytes") for r in runs if r.get("host_peak_rss_bytes")]
    result["host_peak_rss_bytes"] = max(rss) if rss else None
    reads = [r.get("d2h_reads") for r in runs if r.get("d2h_reads") is not None]
    result["d2h_reads"] = max(reads) if reads else None
    result["elapsed_s"] = round(time.monotonic() - started, 3)
    deciding = [result["vramguard"]] if "vramguard" in result else list(runs)
    result["fits"] = (True if all(r.get("fits") for r in deciding)
                      else False if any(r.get("fits") is False for r in deciding) else None)
    return result


def default_jobs(allocators):
    """Allocators run at once: one per two cores, no more than there are
    allocators (a run keeps a core busy, and its PyTorch takes ~0.6 GiB of
    host memory)."""
    return max(1, min(len(allocators), (os.cpu_count() or 1) // 2))


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
    """0: it fits (with vramguard, or with every allocator asked when
    vramguard was not); 1: it does not; otherwise the script's own status
    when it failed for another reason."""
    deciding = [result["vramguard"]] if "vramguard" in result else list(DryRunResult(result).runs.values())
    if all(r.get("fits") for r in deciding):
        return 0
    if any(r.get("fits") is False for r in deciding):
        return 1
    for r in deciding:
        status = r.get("exit_status") or 0
        if status:
            return status
    return 1
