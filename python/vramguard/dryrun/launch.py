"""One run of a dry run: its child process on the phantom (or torchrun's,
one per rank), its output passed through whole lines at a time and kept
in its log, its end (Ctrl-C, --timeout, a kill, a crash) and its record
read back through the contract. Every child starts its own process group,
so that whatever it started ends with it."""
import os
import re
import signal
import site
import subprocess
import sys
import threading
import time

from .contract import DIR_ENV, read_run, unwritten_run
from .ranks import ranks_result

__all__ = ["KILL_GRACE_S", "Live", "TIMEOUT_GRACE_S", "WRITE_LOCK", "child_env", "run_child"]

#: How long a child interrupted by Ctrl-C has to end before it is killed.
KILL_GRACE_S = 2.0
#: How long a run past --timeout has, once told to end, to write its figures
#: so far (its memory snapshot included) before it is killed.
TIMEOUT_GRACE_S = 60.0

#: One lock for every echo and log write: the lines of a run's two pipes (and
#: of runs at once) never cut into each other.
WRITE_LOCK = threading.Lock()

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
        with WRITE_LOCK:
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

def child_env(env_extra):
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

class Live:
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
    """A run that left only the figures written as it went (child/run.py,
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
    live = Live() if live is None else live
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
    env = dict(env, **{DIR_ENV: files_dir})
    # torchrun's own logs with the run's (left to itself it makes a folder in /tmp and leaves it there)
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
                 "--log-dir", os.path.join(out_dir, "torchrun")]
                if nproc > 1 else [sys.executable])
    cmd = launcher + ["-m", "vramguard.dryrun.child", "--allocator", allocator,
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
            result = ranks_result([result_path.replace("{rank}", str(r)) for r in range(nproc)])
        else:
            result = read_run(result_path).to_run()
    except (OSError, ValueError):
        result = unwritten_run(allocator, _no_figures(rc, log_path))
    if result.get("partial"):  # only the figures written as it went: killed, or crashed
        _ended_unwritten(result, rc, log_path)
        result["exit_status"] = status
    result.setdefault("exit_status", status)  # the script's own, which the child wrote
    if timed_out and result.get("terminated", True):  # not one that ended in time and was writing its figures
        _mark_timed_out(result, timeout)
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

def _mark_timed_out(result, timeout):
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
