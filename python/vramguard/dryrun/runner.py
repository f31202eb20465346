"""The dry run's runs and their searches: one run of an allocator on a
phantom of a given size (the environment it gets, its verdict said as it
ends), the smallest device it fits (--min-memory) and the largest swept
value that fits (--sweep), each a bisection (vramguard._search) whose
every step is a run."""
import os
import shutil
import tempfile
import threading

from .._core import format_size
from .._search import bisect, double
from ..phantom.gpu import environ
from ..phantom.settings import alloc_conf
from ..render.words import and_list
from .checks import CWD_PER_RUN
from .contract import GRANULE
from .launch import WRITE_LOCK, Live, child_env, run_child
from .need import HISTORY_ENTRIES, measure_need
from .outcome import never_used_gpu, phantom_failed
from .report import partial_table
from .table import size_text

__all__ = ["MAX_SEARCH_BYTES", "Runner", "SearchFailed"]

#: --min-memory's search above a card its run does not fit: phantoms up to this size.
MAX_SEARCH_BYTES = 1 << 40


def _snapshots(result, nproc):
    """The recording of each rank of a run (rank 0's is the one it names)."""
    first = result.get("snapshot")
    if nproc <= 1 or not first:
        return [first]
    return [first.replace(".rank0.pickle", f".rank{r}.pickle") for r in range(nproc)]


class SearchFailed(Exception):
    """A run of --min-memory's or --sweep's search failed for a reason other
    than memory (fits None): the search stops there, with that run."""

    def __init__(self, run):
        super().__init__(run.get("error"))
        self.run = run


class _Stop(Exception):
    """Ends a sweep's bisection at a run that failed for another reason than memory."""


class Runner:
    """The runs of one dry run: each allocator's, each search's."""

    def __init__(self, script, args, gpu, memory, context, steps, snapshot, echo, notebook,
                 stdout, stderr, cwd=None, nproc=1, timeout=None):
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
        self._compile_cache = None
        self._compile_cache_lock = threading.Lock()
        self.live = Live()
        self.extra_env = {}
        self.started = 0  # runs started: a dry run that fails before any leaves no temporary directory
        self.partial = None  # the result being made, and the allocators' runs that ended
        self.finished = {}
        # the user's own settings, kept: the allocator's (native, expandable) and their preloads
        self.user_alloc_conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or None
        self.user_preload = os.environ.get("LD_PRELOAD", "").strip() or None

    def say(self, text):
        with WRITE_LOCK:
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
        lines = partial_table(dict(self.partial, **self.finished))
        missing = [a for a in self.partial["allocators"] if a not in self.finished]
        if not missing:
            return
        self.say(f"stopped before {and_list(missing)} ended; the figures of the runs that ended:\n"
                 + "\n".join(lines))

    def run(self, allocator, label, memory=None, args=None, extra_env=None, snapshot=None, steps=None, script=None):
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
        # torch.compile's cache: empty when the dry run starts, then shared by
        # its runs on terms that leave each run's allocations a cold
        # compile's (features/compile_cache.py); removed when the dry run ends.
        env["TORCHINDUCTOR_CACHE_DIR"] = self.compile_cache_dir()
        # Triton's kernels, compiled for the card, are the same whoever asks:
        # shared (Triton's own default folder), they build once.
        env.setdefault("TRITON_CACHE_DIR", os.environ.get("TRITON_CACHE_DIR")
                       or os.path.join(os.path.expanduser("~"), ".triton", "cache"))
        result = run_child(script or self.script, self.args if args is None else args, allocator, child_env(env),
                           self.out_dir, label, notebook=self.notebook,
                           steps=self.steps if steps is None else steps,
                           snapshot=self.snapshot if snapshot is None else snapshot,
                           echo=self.echo, stdout=self.stdout, stderr=self.stderr, live=self.live,
                           cwd=self.cwd and self.cwd.replace(CWD_PER_RUN, allocator),
                           nproc=self.nproc, timeout=self.timeout)
        result["alloc_conf_set"] = conf  # what the run was given; alloc_conf: what it had at its end
        recorded = self.snapshot if snapshot is None else snapshot
        if recorded or memory is None:  # a search's runs record nothing, and need no need
            measure_need(result, _snapshots(result, self.nproc) if recorded else [], GRANULE, HISTORY_ENTRIES)
        verdict = ("timed out" if result.get("timed_out")
                   else "never used the GPU" if never_used_gpu(result)
                   else "failed in the phantom" if phantom_failed(result)
                   else {True: "fits", False: "out of memory", None: "failed"}[result.get("fits")])
        self.say(f"{label}: {verdict}, peak allocated {size_text(result.get('peak_allocated_bytes'))}, "
                 f"reserved {size_text(result.get('peak_reserved_bytes'))} ({result.get('elapsed_s', 0):.1f}s)")
        return result

    def compile_cache_dir(self):
        """The folder Inductor caches the runs' compiled code in, made at
        the first run."""
        with self._compile_cache_lock:  # runs of several allocators at once (--jobs)
            if self._compile_cache is None:
                self._compile_cache = tempfile.mkdtemp(prefix=".inductor-", dir=self.out_dir)
            return self._compile_cache

    def close(self):
        """The dry run is over: its compiled code goes."""
        if self._compile_cache is not None:
            shutil.rmtree(self._compile_cache, ignore_errors=True)
            self._compile_cache = None

    def min_memory(self, allocator, full, args=None, extra_env=None):
        """The smallest device on which the run fits, by bisection: exact to
        GRANULE (the sizes tried are its multiples), or the card's own size
        (the full run's, which need not be a multiple) when nothing smaller
        fits. Below the context plus the peak allocated nothing can fit;
        what the device held at its peak in the full run (the context, the
        libraries' own memory such as cuBLAS's handle, and the allocator's
        reserve) is tried first, as the likely answer, so that the search is
        over a few GRANULEs, not the card. Only an out-of-memory (fits False)
        narrows the search from below: a run that fails otherwise (fits
        None) stops it, raising SearchFailed with that run."""
        top = int(self.memory)

        def fits(size):
            r = self.run(allocator, f"{allocator} {format_size(size)}", memory=size, snapshot=False, args=args,
                         extra_env=extra_env)
            if r.get("fits") is None:
                r["failed_at"] = {"memory_bytes": size}
                raise SearchFailed(r)
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

        if lo < guess < hi and full.get("need_bytes"):  # a replay's guess: most often a few granules off
            lo, hi = self._around(fits, guess, lo, hi)
        elif lo < guess < hi:
            if fits(guess):
                hi = guess
                if lo < guess - GRANULE:  # the guess is the answer when a granule less does not fit
                    if fits(guess - GRANULE):
                        hi = guess - GRANULE
                    else:
                        lo = guess - GRANULE
            else:
                lo = guess
        # each size tried a multiple of GRANULE, above lo: hi (the card's size) need not be one
        _, hi = bisect(fits, lo, hi, close=lambda lo, hi: hi - lo <= GRANULE,
                       midpoint=lambda lo, hi: max((lo + hi) // 2 // GRANULE * GRANULE, lo + GRANULE))
        return hi

    @staticmethod
    def _around(fits, guess, lo, hi):
        """The bracket (lo does not fit, hi fits) narrowed from a guess:
        where it fits, steps down of 1, 2, 4, ... granules until one does
        not; where it does not, up, until one does. The replay's guess is
        most often right or a few granules off: the answer is confirmed in
        two runs, and a miss costs about twice the log of its size, not the
        log of the whole bracket (a guess from the peak alone is not so
        close, and min_memory bisects from it instead)."""
        if fits(guess):
            below = (guess - lo) // GRANULE - 1  # the most granules down that stay above lo
            held, failed = double(lambda d: fits(guess - d * GRANULE), 1, below) if below >= 1 else (None, None)
            return (guess - failed * GRANULE if failed else lo), guess - (held or 0) * GRANULE
        above = (hi - guess - 1) // GRANULE  # the most granules up that stay below hi
        held, failed = double(lambda d: not fits(guess + d * GRANULE), 1, above) if above >= 1 else (None, None)
        return guess + (held or 0) * GRANULE, (guess + failed * GRANULE if failed else hi)

    def check_need(self, allocator, run, args=None, extra_env=None):
        """The replay's need, checked by runs: a run on a phantom of that
        size fits, and one of a granule less does not; where either says
        otherwise, the search goes on from there (min_memory, seeded by the
        replay). The run's need_bytes is then the runs' answer (need_checked;
        the replay's kept in need_replayed_bytes), or None, with
        need_unmeasured, where a run of the check failed for another reason
        than memory."""
        if not run.get("need_bytes") or run.get("fits") is not True:
            return run
        replayed = run["need_bytes"]
        try:
            found = self.min_memory(allocator, run, args=args, extra_env=extra_env)
        except SearchFailed as stop:
            size = format_size(stop.run["failed_at"]["memory_bytes"])
            run.update(need_bytes=None, need_replayed_bytes=replayed,
                       need_unmeasured=f"a run on a phantom of {size} to check it failed ({stop.run.get('error')})")
            return run
        run.update(need_bytes=found, need_replayed_bytes=replayed, need_checked=True)
        return run

    def _min_memory_above(self, top, fits, full):
        """The smallest device for a run that ran out of memory on the card:
        larger phantoms (device memory there costs no host memory), doubling
        from the card's size up to MAX_SEARCH_BYTES, then bisection. None,
        with full["min_memory_above_bytes"], when none of them fits."""
        start = -(-2 * top // GRANULE) * GRANULE
        above, hi = double(lambda size: not fits(size), start, MAX_SEARCH_BYTES, cap=False)
        lo = above if above is not None else top
        if hi is None:
            full["min_memory_above_bytes"] = lo
            return None
        _, hi = bisect(fits, lo, hi, close=lambda lo, hi: hi - lo <= GRANULE,
                       midpoint=lambda lo, hi: -(-((lo + hi) // 2) // GRANULE) * GRANULE)
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

        failed = []

        def too_large(i):  # values[i] does not fit; a run failing otherwise ends the search
            r = run(values[i])
            if r.get("fits") is None:  # not an out-of-memory: it says nothing of the values above
                r["failed_at"] = {"value": values[i]}
                failed.append(r)
                raise _Stop
            return not r["fits"]

        try:  # values[lo] fits, values[hi] does not (-1, len: not known)
            lo, _ = bisect(too_large, -1, len(values))
        except _Stop:
            return None, [tried[v] for v in sorted(tried)], failed[0]
        return (values[lo] if lo >= 0 else None), [tried[v] for v in sorted(tried)], None
