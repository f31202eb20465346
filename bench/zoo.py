"""The allocators judged on real training runs: the zoo (bench/zoo_models.py)
on phantom GPUs, PyTorch's default, PyTorch's expandable segments, and
vramguard's arena and segments side by side.

    python bench/zoo.py                        # make bench-zoo: every model, full size
    python bench/zoo.py --size small --models gpt2,resnet18 --check

Per model and allocator, each run its own process (bench/zoo_run.py) on a
phantom device (vramguard.phantom.gpu: kernels compute nothing, device memory
costs no host memory):

- peak allocated and peak reserved on a device too big to limit anything
  (--limitless, an H200 by default);
- the smallest device on which the steps run, by bisection at 16 MiB over
  the device's size (the real out-of-memory path, not a replay), and what
  of it is the allocator's (less what the device held outside the
  allocator at its fullest: the context, cuBLAS's handle) over the peak
  allocated;
- the largest batch on a phantom T4 and L4 (--gpus), from a prediction
  that the runs then confirm (the smallest batch that does not fit, and
  the one below it that does);
- the device calls per step once warm (cudaMalloc and cudaFree, and the
  driver's virtual memory calls; the phantom counts them);
- the step time over PyTorch's default's (--timing-rounds: the allocators
  one at a time, nothing else of this benchmark running, the median of the
  rounds' ratios of the median warm step's CPU time): kernels cost nothing
  on a phantom, so a step is the allocator and PyTorch's host work;
- the replay's answer: the arena's run, recorded with its stacks, replayed
  under each allocator's policy (vramguard.min_budget), plus what the device
  held outside the allocator: the smallest device a user would be told,
  against the real one.

Results: JSON and a markdown table in --out (default
bench/results/zoo-<size>-<torch>-<date>/). --check exits 1 on a missed
goal (GOALS) that KNOWN_MISSES does not list with its cause, or on a known
miss that no longer happens.
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

MiB = 1 << 20
GRANULE = 16 * MiB
ALLOCATORS = ("native", "expandable", "vramguard", "vramguard-segments")
#: The replay's policy for each allocator.
REPLAY_POLICY = {"native": "torch", "expandable": "torch-expandable", "vramguard": "arena",
                 "vramguard-segments": "segments"}
VRAMGUARD = ("vramguard", "vramguard-segments")
#: Steps before the cache is warm: the first makes the model's gradients, the
#: second the optimizer's state.
WARM_AFTER = 2
#: The goals --check asserts (issue: the allocator judged on the zoo).
GOALS = ("smallest device within 1% (or 16 MiB) of peak allocated, arena",
         "smallest device not above min(default, expandable), both vramguard policies",
         "largest batch at least expandable's, both vramguard policies",
         "peak reserved without a limit not above the default's, both vramguard policies")
#: Reported, not asserted by --check: timings on shared machines are noisy,
#: and the replay's accuracy is a measurement of the replay.
REPORTED = ("step time at most 1.02x the default's, both vramguard policies",
            "the replay's smallest device within 1% (or 16 MiB) of the real run's, every allocator")


#: Why the segments policy needs more than expandable_segments on some
#: models, measured on the replays of their recorded runs.
SEGMENTS_STRANDED = (
    "the segments policy holds memory that cudaMalloc gave, in segments rounded to 2 MiB and shared only by "
    "blocks of one size; a segment goes back only when wholly free, so the tails and holes of the partly used "
    "ones stay reserved (ResNet-50's replay one step below its smallest budget: 3,082 MiB reserved for 2,978 "
    "allocated, 29 segments of 14 MiB holding one 12.25 MiB block each and 23 of 26 MiB holding 24.5; ViT's: "
    "141 MiB free inside its segments). Packing up to 128 MiB of one size per segment took ResNet-50's replay "
    "from 3,114 to 3,032 MiB and ViT's from 3,506 to 3,428, but AlexNet's recorded trace from 1,396 to 1,460 "
    "and generation's from 1,116 to 1,124: no segment size serves all. Expandable segments and the arena "
    "give back pages instead.")
#: Why the arena's part is over the peak allocated on GPT-2 generation (3.7% by
#: the real search, 3.4% by the replay's 2 MiB bisection).
GENERATION_PAGES = (
    "generation makes every layer's key and value cache one token longer each step: a new tensor 24 KiB "
    "bigger, then the old one freed, so holes of the old size lie between live caches and cannot take the "
    "next, bigger ones; a 2 MiB page goes back only when wholly free, and a 3 MiB hole holds at most one. "
    "The replay one page below its smallest budget (1,052 MiB against 1,054): out of memory in the first "
    "step, 981 MiB live and 1,042 mapped; of the 61 MiB free in mapped pages, 21 lay in the request's own "
    "fit and 39 in 23 holes of 0.35 to 3 MiB whose edge pages live tensors share. Expandable segments, "
    "with the same pages, needs 1,082.")

#: Goals missed where the cause is known and measured (the closing figures in
#: the table say how far): (goal's index in GOALS, size, what the miss names)
#: -> why. --check fails on any other miss, and on a known one that no
#: longer happens (this list stays true).
KNOWN_MISSES = {
    (0, "full", "gpt2-generate"): GENERATION_PAGES,
    **{(1, "full", f"{model} vramguard-segments"): SEGMENTS_STRANDED
       for model in ("gpt2-generate", "gpt2-varlen", "resnet50", "vit_b_16")},
    **{(2, "full", f"{model} vramguard-segments on {gpu}"): SEGMENTS_STRANDED
       for model, gpu in (("gpt2-generate", "T4"), ("gpt2-generate", "L4"), ("resnet50", "T4"),
                          ("resnet50", "L4"), ("vit_b_16", "T4"))},
    (3, "small", "gpt2 vramguard"):
        "at the peak of allocated memory 25 MiB of the arena's mapped pages are free holes between live "
        "tensors, too small for the peak's requests, so it maps new pages (384 MiB against PyTorch's 374); "
        "far from the ceiling it never unmaps, which would cost a device synchronize and a remap every "
        "step. Its smallest device is the lowest of the four (960 MiB against 976 and 992).",
}


class RunFailed(Exception):
    """A run that ended for a reason other than memory: the search it was
    part of has no answer."""


class Zoo:
    def __init__(self, size, steps, limitless, out, echo, timing_rounds=0, timing_steps=12, replays_only=False):
        self.size, self.steps, self.limitless, self.out, self.echo = size, steps, limitless, out, echo
        self.replays_only = replays_only
        self.timing_rounds, self.timing_steps = timing_rounds, timing_steps
        self.runs = 0
        self.lock = threading.Lock()
        self.envs = {}

    def env(self, gpu):
        """The phantom `gpu`'s environment (built the first time)."""
        with self.lock:
            if gpu not in self.envs:
                from vramguard.phantom.gpu import environ

                env = dict(os.environ)
                env.pop("PYTORCH_CUDA_ALLOC_CONF", None)  # zoo_run.py sets the allocator's own
                env.update(environ(gpu))
                env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.join(ROOT, "python"), HERE,
                                                                  env.get("PYTHONPATH")]))
                self.envs[gpu] = env
            return self.envs[gpu]

    def run(self, model, allocator, gpu, memory=None, batch=None, steps=None, record=None):
        """One process: zoo_run.py's figures, fits True or False; RunFailed
        when it failed otherwise."""
        env = dict(self.env(gpu))
        if memory:
            env["VG_FAKECUDA_MEM"] = str(int(memory))
        with self.lock:
            self.runs += 1
            n = self.runs
        path = os.path.join(self.out, "runs", f"{n:04d}-{model}-{allocator}.json")
        cmd = [sys.executable, os.path.join(HERE, "zoo_run.py"), model, "--allocator", allocator,
               "--size", self.size, "--steps", str(steps or self.steps), "--json", path]
        if batch:
            cmd += ["--batch", str(batch)]
        if record:
            cmd += ["--record", record]
        what = f"{model} {allocator} on {gpu}" + (f" of {memory / MiB:,.0f} MiB" if memory else "") + \
            (f" batch {batch}" if batch else "")
        proc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if not os.path.exists(path):
            tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
            raise RunFailed(f"{what}: exit {proc.returncode}: {tail}")
        with open(path) as f:
            result = json.load(f)
        # Written, then the process ended badly: its figures stand (the run
        # was over), and the exit is kept. After an out-of-memory in the
        # backward, PyTorch's teardown aborts now and then.
        result["exit_status"] = proc.returncode
        if self.echo:
            verdict = "fits" if result["fits"] else "out of memory"
            print(f"zoo: {what}: {verdict}, peak allocated {result['peak_allocated_bytes'] / MiB:,.0f} MiB, "
                  f"reserved {result['peak_reserved_bytes'] / MiB:,.0f} MiB", file=sys.stderr, flush=True)
        return result

    # ------------------------------------------------------------ searches

    def smallest_device(self, model, allocator, base, guess):
        """The smallest phantom (the limitless preset, its memory set) on
        which the steps run, exact to GRANULE, searched from `guess` (the
        replay's answer, else what the device held in the limitless run):
        below the context and the peak allocated nothing fits."""
        floor = -(-(base["context_bytes"] + base["peak_allocated_bytes"]) // GRANULE)
        fits = lambda units: self.run(model, allocator, self.limitless, memory=units * GRANULE)["fits"]
        return first_true(fits, -(-guess // GRANULE), floor - 1) * GRANULE

    def largest_batch(self, model, allocator, gpu, guess):
        """The largest batch that runs on a phantom `gpu` (0: not even one),
        searched from `guess`."""
        too_big = lambda batch: not self.run(model, allocator, gpu, batch=batch)["fits"]
        return first_true(too_big, max(1, int(guess)) + 1, 0) - 1

    # ------------------------------------------------------------ one model

    def model(self, model, allocators, gpus, jobs):
        """Every figure for one model, its allocators `jobs` at a time."""
        trace = os.path.join(self.out, "traces", f"{model}.vgtrace")
        bases = dict(zip(allocators, _map(lambda a: self.run(model, a, self.limitless), allocators, jobs)))
        # The replays start from the arena's run recorded with its stacks,
        # whichever allocators are asked for: a run of its own, since
        # recording costs time the others do not pay.
        self.run(model, "vramguard", self.limitless, record=trace)
        replayed = self.replays(trace, allocators)
        # The bytes allocated per sample, from PyTorch's default at four times
        # the batch: with each allocator's smallest device and its overhead
        # there, the first guess of its largest batch.
        b0 = bases[allocators[0]]["batch"]
        if not self.replays_only:
            more = self.run(model, allocators[0], self.limitless, batch=4 * b0)
            per_sample = max(1, (more["peak_allocated_bytes"] - bases[allocators[0]]["peak_allocated_bytes"])
                             / (3 * b0))
        totals = {gpu: _preset_bytes(gpu) for gpu in gpus}

        def figures(allocator):
            base = bases[allocator]
            row = base_row(model, allocator, base)
            row.update(replayed.get(allocator, {}))
            replay = row.get("replay_min_budget_bytes")
            guess = replay + row["outside_bytes"] if replay else base["device_peak_bytes"]
            errors = []
            try:
                row["smallest_device_bytes"] = self.smallest_device(model, allocator, base, guess)
                row["allocator_share_bytes"] = row["smallest_device_bytes"] - row["outside_bytes"]
            except RunFailed as exc:
                errors.append(f"smallest device: {exc}")
            need = row.get("smallest_device_bytes", base["device_peak_bytes"])
            overhead = max(1.0, row.get("allocator_share_bytes", need) / max(1, base["peak_allocated_bytes"]))
            for gpu in gpus:
                try:
                    row["largest_batch"][gpu] = self.largest_batch(
                        model, allocator, gpu, b0 + (totals[gpu] - need) / (per_sample * overhead))
                except RunFailed as exc:
                    errors.append(f"largest batch on {gpu}: {exc}")
            if errors:
                row["error"] = "; ".join(errors)
            return row

        rows = _map(figures if not self.replays_only else
                    (lambda a: dict(base_row(model, a, bases[a]), **replayed.get(a, {}))), allocators, jobs)
        replay_devices(rows)
        if self.timing_rounds and "native" in allocators:
            self.time_steps(model, allocators, rows)
        return rows

    def time_steps(self, model, allocators, rows):
        """The step time over PyTorch's default's: the allocators one after
        another (nothing else of this benchmark running), rounds times,
        each round's ratios of median warm steps' CPU time (every thread of
        the process: on a phantom a step is host work, and the CPU it takes
        is less disturbed than the wall clock by whatever else runs); the
        median ratio."""
        ratios = {a: [] for a in allocators}
        for _ in range(self.timing_rounds):
            medians = {a: _median(self.run(model, a, self.limitless, steps=self.timing_steps)
                                  ["step_cpu_seconds"][WARM_AFTER:]) for a in allocators}
            for a in allocators:
                ratios[a].append(medians[a] / medians["native"])
        for r in rows:
            r["step_time_ratios"] = ratios[r["allocator"]]
            r["step_time_ratio"] = _median(ratios[r["allocator"]])

    def replays(self, trace_path, allocators):
        """{allocator: figures}: the recorded run replayed under each
        allocator's policy, its smallest budget (vramguard.min_budget)."""
        import vramguard

        trace = vramguard.load_trace(trace_path)
        out = {}
        for allocator in allocators:
            policy = REPLAY_POLICY[allocator]
            try:
                budget = vramguard.min_budget(trace, policy=policy)
            except (ValueError, RuntimeError) as exc:  # a policy this build lacks
                out[allocator] = {"replay_error": str(exc)}
                continue
            out[allocator] = {"replay_policy": policy, "replay_min_budget_bytes": int(budget),
                              "replay_trace_ops": len(trace)}
        return out


def base_row(model, allocator, base):
    """A table row's figures from the limitless run."""
    return {"model": model, "allocator": allocator, "batch": base["batch"], "fits": base["fits"],
            "peak_allocated_bytes": base["peak_allocated_bytes"],
            "peak_requested_bytes": base.get("peak_requested_bytes"),
            "peak_reserved_bytes": base["peak_reserved_bytes"],
            "context_bytes": base["context_bytes"], "device_peak_bytes": base["device_peak_bytes"],
            "outside_bytes": base["device_peak_bytes"] - base["peak_reserved_bytes"],
            "device_calls_per_step": base["device_calls_per_step"],
            "warm_device_calls_per_step": _median(base["device_calls_per_step"][WARM_AFTER:]),
            "median_step_seconds": _median(base["step_seconds"][WARM_AFTER:]),
            "host_peak_rss_bytes": base["host_peak_rss_bytes"], "largest_batch": {}}


def replay_devices(rows):
    """The smallest device the replay tells: its budget plus what the device
    held outside the allocator, rounded up as the real search's sizes are."""
    for r in rows:
        replay = r.get("replay_min_budget_bytes")
        if replay:
            r["replay_smallest_device_bytes"] = -(-(replay + r["outside_bytes"]) // GRANULE) * GRANULE


def rebuild(out, limitless, gpus, default_batch):
    """The rows of an interrupted run, from the runs it left in out/runs:
    per model and allocator, the first run on the whole limitless device at
    the model's batch; the smallest device that fits where 16 MiB less was
    tried and did not; the largest batch that fits where one more was tried
    and did not (a search cut short answers nothing); the replays again
    from out/traces."""
    from vramguard._presets import find_preset

    names = {find_preset(g).cuda_name: g for g in [limitless] + list(gpus)}
    whole = find_preset(limitless).total_bytes
    runs = {}
    for name in sorted(os.listdir(os.path.join(out, "runs"))):
        if name.endswith(".json"):
            with open(os.path.join(out, "runs", name)) as f:
                r = json.load(f)
            runs.setdefault((r["model"], r["allocator"]), []).append(r)
    rows = []
    for (model, allocator), done in runs.items():
        on = lambda gpu: [r for r in done if names.get(r["device"]) == gpu]
        base = next((r for r in on(limitless) if r["total_memory"] == whole
                     and r["batch"] == default_batch(model)), None)
        if base is None:
            continue
        row = base_row(model, allocator, base)
        sized = {r["total_memory"]: r["fits"] for r in on(limitless) if r["total_memory"] < whole}
        smallest = min((m for m, fits in sized.items() if fits and sized.get(m - GRANULE) is False), default=None)
        if smallest is not None and not any(fits for m, fits in sized.items() if m < smallest):
            row["smallest_device_bytes"] = smallest
            row["allocator_share_bytes"] = smallest - row["outside_bytes"]
        for gpu in gpus:
            tried = {r["batch"]: r["fits"] for r in on(gpu)}
            largest = max((b for b, fits in tried.items() if fits and tried.get(b + 1) is False), default=None)
            if largest is not None and not any(fits for b, fits in tried.items() if b > largest):
                row["largest_batch"][gpu] = largest
        rows.append(row)
    return rows


def first_true(ok, guess, known_false, first_step=None):
    """The smallest whole x > known_false with ok(x), ok monotone (False
    below some x, True from it on), by galloping from `guess` until the
    edge is bracketed, then bisection: two calls when the guess is right
    and the first step is 1. The first step defaults to guess / 64: a guess
    off by a few percent is bracketed in a step or two."""
    guess = max(guess, known_false + 1)
    first = first_step or max(1, guess // 64)
    if ok(guess):
        hi, step = guess, first
        while True:
            lo = hi - step
            if lo <= known_false:
                lo = known_false
                break
            if not ok(lo):
                break
            hi, step = lo, step * 2
    else:
        lo, step = guess, first
        while True:
            hi = lo + step
            if ok(hi):
                break
            lo, step = hi, step * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi


def _map(fn, items, jobs):
    items = list(items)
    if jobs <= 1 or len(items) <= 1:
        return [fn(i) for i in items]
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(fn, items))


def _median(values):
    return statistics.median(values) if values else None


def _preset_bytes(gpu):
    from vramguard._presets import find_preset

    return find_preset(gpu).total_bytes


# ---------------------------------------------------------------- goals


def _within(value, target, rel=0.01, slack=GRANULE):
    return abs(value - target) <= max(rel * target, slack)


def goals(rows):
    """[(goal, ok, [failures])] for GOALS, from the table's rows."""
    by = {}
    for r in rows:
        by.setdefault(r["model"], {})[r["allocator"]] = r
    checks = {g: [] for g in GOALS}
    counted = {g: 0 for g in GOALS}
    for model, runs in sorted(by.items()):
        default, expandable = runs.get("native"), runs.get("expandable")
        arena = runs.get("vramguard")
        if arena and "allocator_share_bytes" in arena:
            counted[GOALS[0]] += 1
            if not _within(arena["allocator_share_bytes"], arena["peak_allocated_bytes"]):
                checks[GOALS[0]].append(f"{model}: {arena['allocator_share_bytes'] / MiB:,.0f} MiB for "
                                        f"{arena['peak_allocated_bytes'] / MiB:,.0f} MiB allocated")
        for name in VRAMGUARD:
            ours = runs.get(name)
            if not ours:
                continue
            theirs = [r for r in (default, expandable) if r and "smallest_device_bytes" in r]
            if theirs and "smallest_device_bytes" in ours:
                counted[GOALS[1]] += 1
                best = min(r["smallest_device_bytes"] for r in theirs)
                if ours["smallest_device_bytes"] > best:
                    checks[GOALS[1]].append(f"{model} {name}: {ours['smallest_device_bytes'] / MiB:,.0f} MiB "
                                            f"against {best / MiB:,.0f}")
            if expandable and expandable.get("largest_batch"):
                for gpu, batch in expandable["largest_batch"].items():
                    mine = ours.get("largest_batch", {}).get(gpu)
                    if mine is None:
                        continue
                    counted[GOALS[2]] += 1
                    if mine < batch:
                        checks[GOALS[2]].append(f"{model} {name} on {gpu}: {mine} against {batch}")
            if default and None not in (default.get("peak_reserved_bytes"), ours.get("peak_reserved_bytes")):
                counted[GOALS[3]] += 1
                if ours["peak_reserved_bytes"] > default["peak_reserved_bytes"]:
                    checks[GOALS[3]].append(f"{model} {name}: {ours['peak_reserved_bytes'] / MiB:,.0f} MiB "
                                            f"against {default['peak_reserved_bytes'] / MiB:,.0f}")
    return [(g, (not checks[g]) if counted[g] else None, checks[g] if counted[g] else ["nothing measured"])
            for g in GOALS]


def check(rows, size, models):
    """(misses not in KNOWN_MISSES, known misses of these models that did
    not happen), as lines."""
    unexpected, seen = [], set()
    for i, (goal, ok, failures) in enumerate(goals(rows)):
        for text in failures:
            key = (i, size, text.split(":")[0])
            if key in KNOWN_MISSES:
                seen.add(key)
            else:
                unexpected.append(f"{goal}: {text}")
    stale = [f"{GOALS[i]}: {label} ({why})" for (i, s, label), why in KNOWN_MISSES.items()
             if s == size and label.split()[0] in models and (i, s, label) not in seen]
    return unexpected, stale


def reported(rows):
    """[(goal, ok, [failures])] for REPORTED."""
    slow = [f"{r['model']} {r['allocator']}: {r['step_time_ratio']:.3f}" for r in rows
            if r["allocator"] in VRAMGUARD and r.get("step_time_ratio") is not None
            and r["step_time_ratio"] > 1.02]
    timed = [r for r in rows if r["allocator"] in VRAMGUARD and r.get("step_time_ratio") is not None]
    off = [f"{r['model']} {r['allocator']}: {r['replay_smallest_device_bytes'] / MiB:,.0f} MiB against "
           f"{r['smallest_device_bytes'] / MiB:,.0f}" for r in rows
           if r.get("replay_smallest_device_bytes") and r.get("smallest_device_bytes")
           and not _within(r["replay_smallest_device_bytes"], r["smallest_device_bytes"])]
    replayed = [r for r in rows if r.get("replay_smallest_device_bytes") and r.get("smallest_device_bytes")]
    return [(REPORTED[0], None if not timed else not slow, slow),
            (REPORTED[1], None if not replayed else not off, off)]


# ---------------------------------------------------------------- output


def _mib(n):
    return "-" if n is None else f"{n / MiB:,.0f}"


def table(rows, gpus):
    head = ["model", "allocator", "peak allocated MiB", "peak reserved MiB", "smallest device MiB",
            "allocator's part / allocated"] + [f"largest batch {g}" for g in gpus] + \
        ["device calls / warm step", "step time / default", "replay's smallest device MiB"]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for r in rows:
        share = r.get("allocator_share_bytes")
        ratio = f"{share / r['peak_allocated_bytes']:.3f}" if share and r["peak_allocated_bytes"] else "-"
        replay_device = _mib(r.get("replay_smallest_device_bytes"))
        step = r.get("step_time_ratio")
        calls = r.get("warm_device_calls_per_step")
        cells = [r["model"], r["allocator"], _mib(r["peak_allocated_bytes"]), _mib(r["peak_reserved_bytes"]),
                 _mib(r.get("smallest_device_bytes")), ratio] + \
            [str(r.get("largest_batch", {}).get(g, "-")) for g in gpus] + \
            ["-" if calls is None else f"{calls:g}", "-" if step is None else f"{step:.2f}", replay_device]
        if "error" in r and share is None:
            cells[4] = "failed"
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report(rows, meta, gpus):
    lines = [f"# The zoo on phantom GPUs ({meta['size']} size)", "",
             f"torch {meta['torch']}, limitless device {meta['limitless']}, "
             + (f"largest batch on {', '.join(gpus)}" if gpus else
                "no searches: the smallest device is the replays' of the arena's recorded run")
             + f"; {meta['date']}; {meta['runs']} runs"
             + (" (rebuilt from the runs of an interrupted benchmark)" if meta.get("rebuilt")
                else f" in {meta['elapsed_s']:,.0f} s") + ". "
             f"Reproduce: `{meta['command']}`"
             + "".join(f"; then `{part}`" for part in meta.get("merged", [])) + ".", "", table(rows, gpus), "", "## Goals", ""]
    verdicts = goals(rows)
    for goal, ok, failures in verdicts + reported(rows):
        verdict = {True: "met", False: "MISSED", None: "not measured"}[ok]
        lines.append(f"- {verdict}: {goal}" + (": " + "; ".join(failures) if failures and not ok else ""))
    missed = {(i, text.split(":")[0]) for i, (_, ok, failures) in enumerate(verdicts) if ok is False
              for text in failures}
    causes = {}  # why -> {goal: the misses here it explains}, in KNOWN_MISSES' order
    for (i, size, label), why in KNOWN_MISSES.items():
        if size == meta["size"] and (i, label) in missed:
            causes.setdefault(why, {}).setdefault(GOALS[i], []).append(label)
    if causes:
        lines += ["", "Known misses, with their causes:", ""] + \
            [f"- {'; '.join(f'{goal}: ' + ', '.join(labels) for goal, labels in misses.items())}. Why: {why}"
             for why, misses in causes.items()]
    errors = [f"- {r['model']} {r['allocator']}: {r['error']}" for r in rows if "error" in r]
    if errors:
        lines += ["", "## Failed runs", ""] + errors
    return "\n".join(lines) + "\n"


def merge_into(folder, rows, meta):
    """The rows and meta of the table in `folder` (its zoo.json) with the
    (model, allocator) pairs of `rows` replaced by `rows`: a table finished
    in parts, each part's command kept. The two must be of one size, one
    torch and one kind."""
    path = os.path.join(folder, "zoo.json")
    try:
        with open(path) as f:
            old = json.load(f)
        old_meta, old_rows = old["meta"], old["rows"]
        if not isinstance(old_meta, dict) or not all(isinstance(r, dict) and "model" in r for r in old_rows):
            raise ValueError("not a table bench/zoo.py wrote")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"zoo: cannot merge into {path}: {e}")
    if bool(old_meta.get("replays_only")) != bool(meta.get("replays_only")):
        raise SystemExit(f"zoo: cannot merge into {path}: one table has searches, the other replays only")
    for key in ("size", "torch", "limitless"):
        if old_meta.get(key) != meta.get(key):
            raise SystemExit(f"zoo: cannot merge into {path}: its {key} is {old_meta.get(key)!r}, "
                             f"this run's {meta.get(key)!r}")
    new = {(r["model"], r["allocator"]): r for r in rows}
    merged = [new.pop((r["model"], r.get("allocator")), r) for r in old_rows] + list(new.values())
    parts = old_meta.get("merged", [])
    models = sorted({r["model"] for r in rows})
    merged_meta = dict(old_meta, runs=old_meta.get("runs", 0) + meta.get("runs", 0),
                       elapsed_s=old_meta.get("elapsed_s", 0) + meta.get("elapsed_s", 0),
                       merged=parts + [f"{meta['command']} ({', '.join(models)}, {meta['date']})"])
    return merged, merged_meta


def _since(started):
    return (datetime.datetime.now() - started).total_seconds()


def save(out, rows, meta, gpus):
    """zoo.json and zoo.md in `out`, each replaced whole; the markdown."""
    text = report(rows, meta, gpus)
    for name, content in (("zoo.json", json.dumps({"meta": meta, "rows": rows}, indent=1)), ("zoo.md", text)):
        with tempfile.NamedTemporaryFile("w", dir=out, delete=False, suffix=".tmp") as f:
            f.write(content)
        os.replace(f.name, os.path.join(out, name))
    return text


def main(argv=None):
    import zoo_models

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(zoo_models.MODELS), help="comma-separated (default: all)")
    ap.add_argument("--allocators", default=",".join(ALLOCATORS))
    ap.add_argument("--size", choices=zoo_models.SIZES, default="full")
    ap.add_argument("--steps", type=int, default=5, help="steps per run")
    ap.add_argument("--gpus", default="T4,L4", help="presets for the largest batch")
    ap.add_argument("--limitless", default="H200", help="the preset that limits nothing")
    ap.add_argument("--timing-rounds", type=int, default=3,
                    help="rounds of the step-time comparison, the allocators one at a time (0: none)")
    ap.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 1) // 2))
    ap.add_argument("--out", help="results directory (default: bench/results/zoo-SIZE-TORCH-DATE)")
    ap.add_argument("--check", action="store_true", help="exit 1 unless the goals hold")
    ap.add_argument("--timing-only", action="store_true",
                    help="only the step-time comparison (--timing-rounds rounds of --timing-steps steps)")
    ap.add_argument("--timing-steps", type=int, default=12)
    ap.add_argument("--replays-only", action="store_true",
                    help="no searches: each allocator's run without a limit, and the smallest device the "
                         "replays of the arena's recorded run tell (a few runs per model, not dozens)")
    ap.add_argument("--rebuild", action="store_true",
                    help="no runs: the table again from the runs and traces an interrupted run left in --out")
    ap.add_argument("--merge-into", metavar="DIR",
                    help="then write DIR's table (zoo.json, zoo.md) with this run's models replaced by its rows")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    allocators = [a.strip() for a in args.allocators.split(",") if a.strip()]
    gpus = [] if args.replays_only else [g.strip() for g in args.gpus.split(",") if g.strip()]
    for m in models:
        if m not in zoo_models.MODELS:
            ap.error(f"unknown model {m!r}: choose from {', '.join(zoo_models.MODELS)}")
    for a in allocators:
        if a not in ALLOCATORS:
            ap.error(f"unknown allocator {a!r}: choose from {', '.join(ALLOCATORS)}")
    if args.steps <= WARM_AFTER:
        ap.error(f"--steps must be above {WARM_AFTER}: the steps after the cache is warm are the ones timed")
    import torch  # only its version: the runs are child processes

    date = datetime.date.today().isoformat()
    out = args.out or os.path.join(HERE, "results", f"zoo-{args.size}-{torch.__version__.split('+')[0]}-{date}")
    os.makedirs(os.path.join(out, "runs"), exist_ok=True)
    os.makedirs(os.path.join(out, "traces"), exist_ok=True)
    zoo = Zoo(args.size, args.steps, args.limitless, out, not args.quiet, timing_rounds=args.timing_rounds,
              timing_steps=args.timing_steps, replays_only=args.replays_only)
    started = datetime.datetime.now()
    meta = {"size": args.size, "torch": torch.__version__, "limitless": args.limitless,
            "gpus": gpus, "replays_only": args.replays_only,
            "date": date, "steps": args.steps,
            "command": "python bench/zoo.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    rows = []
    if args.rebuild:
        import vramguard

        rows = rebuild(out, args.limitless, gpus, lambda m: zoo_models.default_batch(m, args.size))
        for model in sorted({r["model"] for r in rows}):
            trace = os.path.join(out, "traces", f"{model}.vgtrace")
            mine = [r for r in rows if r["model"] == model]
            if os.path.exists(trace):
                replays = zoo.replays(trace, [r["allocator"] for r in mine])
                for r in mine:
                    r.update(replays.get(r["allocator"], {}))
        replay_devices(rows)
        models = sorted({r["model"] for r in rows})
        meta.update(rebuilt=True, runs=len(os.listdir(os.path.join(out, "runs"))))
    if args.timing_only:
        if "native" not in allocators or args.timing_rounds < 1:
            ap.error("--timing-only needs native among the allocators and --timing-rounds of 1 or more")
        for m in models:
            mine = [{"model": m, "allocator": a, "peak_allocated_bytes": None, "peak_reserved_bytes": None,
                     "largest_batch": {}} for a in allocators]
            zoo.time_steps(m, allocators, mine)
            rows += mine
            text = save(out, rows, dict(meta, runs=zoo.runs, elapsed_s=_since(started), timing_only=True), gpus)
        models = []
    for m in [] if args.rebuild else models:
        rows += zoo.model(m, allocators, gpus, args.jobs)
        # After each model: an interrupted run keeps what it finished.
        text = save(out, rows, dict(meta, runs=zoo.runs, elapsed_s=_since(started)), gpus)
    if args.rebuild or not rows:
        text = save(out, rows, dict(meta, elapsed_s=meta.get("elapsed_s", 0)), gpus)
    if args.merge_into:
        rows, merged_meta = merge_into(args.merge_into, rows, dict(meta, runs=zoo.runs, elapsed_s=_since(started)))
        text = save(args.merge_into, rows, merged_meta, merged_meta.get("gpus", gpus))
    print(text)
    if args.check:
        unexpected, stale = check(rows, args.size, models)
        for text in unexpected:
            print(f"zoo: goal missed: {text}", file=sys.stderr)
        for text in stale:
            print(f"zoo: a known miss no longer happens (remove it from KNOWN_MISSES): {text}", file=sys.stderr)
        return 1 if unexpected or stale else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
