"""The dry run itself: dryrun() checks its input, makes its folder,
runs each allocator (and each search, and the remedies), and puts their
figures together into a DryRunResult with its verdict and exit status."""
import os
import shutil
import sys
import tempfile
import time

from ..phantom import argnames
from ..phantom.settings import check_device
from .checks import (DryRunInputError, check_cwd, check_gpu, check_jobs, check_out, check_placeholders,
                     check_platform, check_script, check_timeout, make_cwds, parse_allocators, parse_sweep)
from .contract import ALLOCATORS, VERDICTS
from .features import FEATURES, Options, remedies
from .features.fake_world import check_world
from .outcome import exit_status, fails_for_every_allocator, remedies_unmeasured
from .result import DryRunResult
from .runner import Runner, SearchFailed
from .verdict import card_name

__all__ = ["dryrun"]


def dryrun(script, *args, gpu="T4", allocators=ALLOCATORS, memory=None, min_memory=False, sweep=None,
           out=None, steps=None, context=None, snapshot=True, echo=True, stdout=None,
           stderr=None, jobs=None, no_compile=False, cwd=None, nproc=1, timeout=None, weights=True,
           world_size=None, rank=None, gpus_per_node=8, remedies=False, check_needs=True):
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
    `gpus_per_node` phantom GPUs (vramguard.dryrun.features.fake_world): one rank's
    figures for a data-parallel job of any size; not with nproc.
    remedies: True also runs the standard remedies on the unchanged
    program (vramguard.dryrun.features.remedies: autocast, activation
    checkpointing, an 8-bit or fused optimizer, then greedy combinations
    until one fits), each measured, with its work relative to the program
    as written, the cheapest that fits and the code that applies it
    (`remedies` in the result); with sweep, each remedy's largest value
    and the accumulation that keeps the largest value's batch.
    check_needs: each allocator's need, proposed by the replay of its
    recording, is checked by runs on phantoms of that size (it fits) and
    16 MiB less (it does not), the search going on where either says
    otherwise, so a printed need is a run's answer (need_checked, and the
    replay's in need_replayed_bytes); False leaves the replay's, said to
    be unchecked. With min_memory the need is that search's answer.
    weights: False loads Hugging Face models (from_pretrained of a Hub id
    or a local folder) from a stand-in of their safetensors checkpoint, the
    same names, shapes and dtypes with no data (vramguard.dryrun.features.weightless):
    nothing downloaded or read but configs and headers.
    PYTORCH_CUDA_ALLOC_CONF, where set, is kept for native and, with
    expandable_segments:True, for expandable; LD_PRELOAD comes after the
    phantom's libraries."""
    allocators = parse_allocators(allocators)
    preset = check_gpu(gpu)
    sweep_spec = parse_sweep(sweep) if sweep is not None else None
    if sweep_spec:
        check_placeholders(sweep_spec, args)
    if sweep_spec and min_memory:
        raise DryRunInputError(f"{argnames.name('min_memory')} and {argnames.name('sweep')} cannot be combined: "
                               f"run {argnames.name('min_memory')} on one value")
    for name, value in (("remedies", remedies), ("check_needs", check_needs)):
        if not isinstance(value, bool):
            raise DryRunInputError(f"{argnames.name(name)} is True or False, got {value!r}")
    if remedies and min_memory:
        raise DryRunInputError(f"{argnames.name('remedies')} and {argnames.name('min_memory')} cannot be combined: "
                               f"run {argnames.name('min_memory')} on its own")
    remedies_wanted = remedies
    script = check_script(script)
    device, context = check_device(memory, preset, context)
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        raise DryRunInputError(f"{argnames.name('steps')} must be a whole number above 0, got {steps!r}")
    if isinstance(nproc, bool) or not isinstance(nproc, int) or not 1 <= nproc <= 16:
        raise DryRunInputError(f"{argnames.name('nproc')} must be a whole number from 1 to 16, got {nproc!r}")
    try:
        check_world(world_size, rank, gpus_per_node, nproc, arg=argnames.name)
    except ValueError as exc:
        raise DryRunInputError(str(exc)) from None
    timeout = check_timeout(timeout)
    out_path = check_out(out)
    cwd = check_cwd(cwd, allocators)
    jobs = check_jobs(jobs, allocators, cwd)
    check_platform()
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise DryRunInputError(f"PyTorch is not installed in this Python ({sys.executable}): "
                               "a dry run runs the script with it")
    stdout = sys.stdout if stdout is None else stdout
    stderr = sys.stderr if stderr is None else stderr
    # The phantom's environment first: where it cannot be had, no directory is made.
    runner = Runner(script, args, preset, device, context, steps, snapshot, echo,
                     script.endswith(".ipynb"), stdout, stderr, cwd=cwd, nproc=nproc, timeout=timeout)
    if no_compile:
        runner.extra_env["TORCH_COMPILE_DISABLE"] = "1"
    out_dir = _make_out_dir(out_path, out)
    runner.out_dir = out_dir
    options = Options(out_dir=out_dir, weights=bool(weights), world_size=world_size,
                      rank=(rank or 0) if world_size is not None else None, gpus_per_node=gpus_per_node,
                      remedies=remedies_wanted)
    for feature in FEATURES:  # what each adds to every run's environment
        runner.extra_env.update(feature.env(options))
    try:
        make_cwds(cwd, allocators)
        return _dryrun(runner, script, args, preset, device, context, allocators, min_memory, sweep_spec,
                       steps, no_compile, jobs, cwd, options, check_needs)
    except BaseException:
        if runner.started:
            runner.say_partial()
            runner.say(f"the logs so far are in {out_dir}")
        else:
            shutil.rmtree(out_dir, ignore_errors=True)  # nothing in it, and nobody told where it is
        raise
    finally:
        runner.close()


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


def _dryrun(runner, script, args, preset, device, context, allocators, min_memory, sweep_spec, steps,
            no_compile, jobs, cwd, options, check_needs):
    result = DryRunResult(gpu=preset.name, device_bytes=device, context_bytes=context, script=script,
                          args=[str(a) for a in args], out_dir=runner.out_dir, steps=steps,
                          allocators=list(allocators), min_memory=bool(min_memory),
                          no_compile=bool(no_compile), cwd=cwd or os.getcwd(), cwd_given=cwd is not None,
                          user_alloc_conf=runner.user_alloc_conf, nproc=runner.nproc,
                          weights=options.weights, world_size=options.world_size, rank=options.rank,
                          check_needs=bool(check_needs))
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
                except SearchFailed as stop:  # the failed run is the answer: its error and its status
                    run = dict(stop.run, min_memory_bytes=None)
                _need_is_the_search(run)
            elif check_needs:
                runner.check_need(allocator, run)
            if fails_for_every_allocator(run):
                stopped.append(run)
            return run
        name = sweep_spec[0]
        largest, runs, failed = runner.sweep(allocator, *sweep_spec)
        if failed is not None:
            measured_at = failed["sweep_value"]
            run = {k: v for k, v in failed.items() if k != "sweep_value"}
        else:
            # The smallest value tried that ran out of memory: where the sweep broke.
            broke = next((r for r in runs if r.get("fits") is False
                          and (largest is None or r["sweep_value"] > largest)), None)
            chosen = next((r for r in runs if r["sweep_value"] == largest), broke)
            measured_at = chosen["sweep_value"]
            run = {k: v for k, v in chosen.items() if k != "sweep_value"}
            run["fits"] = largest is not None
            if broke is not None:
                run["first_oom"] = broke.get("first_oom")
                if run["first_oom"]:
                    run["first_oom"] = dict(run["first_oom"], value=broke["sweep_value"])
        if failed is None and _measured_nothing(runs):
            # the value changed nothing measured: no value is the largest that fits
            largest = None
            measured_at = runs[-1]["sweep_value"]
            run = {k: v for k, v in runs[-1].items() if k != "sweep_value"}
            run["sweep_measured_nothing"] = True
        # largest_batch: the key the sweep's answer always had, whatever its name (kept)
        run.update(largest_value=largest, largest_batch=largest, sweep_name=name, measured_at=measured_at)
        if check_needs and run.get("fits"):  # the need of the largest value that fits, at that value
            args, env = runner.with_value(name, measured_at)
            runner.check_need(allocator, run, args=args, extra_env=env)
        run["sweep"] = [dict({k: r.get(k) for k in ("fits", "peak_allocated_bytes", "peak_reserved_bytes",
                                                     "first_oom", "error", "exit_status")},
                             value=r["sweep_value"], work_flops=remedies.work_of(r))
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
    for feature in FEATURES:
        feature.summarize(result, runs)
    if options.remedies:
        runner.say("measuring the remedies on the unchanged program")
        result["remedies"] = remedies.measure(runner, result, preset, sweep_spec,
                                                 remedies_unmeasured(result[remedies.allocator_of(result)]),
                                                 device=card_name(result))
    result["elapsed_s"] = round(time.monotonic() - started, 3)
    deciding = [result["vramguard"]] if "vramguard" in result else list(runs)
    result["fits"] = (True if all(r.get("fits") for r in deciding)
                      else False if any(r.get("fits") is False for r in deciding) else None)
    result["exit_code"] = exit_status(result)
    result["verdict"] = VERDICTS[result["exit_code"]]
    return result


def _need_is_the_search(run):
    """With --min-memory the need is the search's answer: one figure, not two."""
    if run.get("min_memory_bytes") and run.get("fits"):
        run.update(need_replayed_bytes=run.get("need_bytes"), need_bytes=run["min_memory_bytes"], need_checked=True)


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
