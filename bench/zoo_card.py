"""The zoo on a real GPU, inside a time limit: what bench/zoo.py measures on
a phantom, measured on the card, for the phantom's fidelity and the
allocators' figures where kernels run.

    python bench/zoo_card.py --out DIR [--models gpt2,bert,resnet50,vit_b_16]
                             [--seconds 300] [--jobs 4] [--guesses bench/results/.../zoo.json]

Three phases, in order of worth, each stopped when the time is up (what did
not run says so in the results, nothing is guessed):

1. memory: each model under each allocator, one process each, `--jobs` at a
   time (peaks are per process, unaffected by the others): peak allocated
   and reserved, and under PyTorch's allocators every allocation's size in
   order. Files DIR/gpu_zoo/MODEL.ALLOCATOR.json, the layout
   bench/zoo_fidelity.py --compare reads.
2. step time against PyTorch's default, one process at a time: rounds of
   every allocator in a rotated order, each allocator's median warm step
   over the default's in the same round, the median of the rounds' ratios.
3. largest batch under the T4 preset's budget (vramguard's budget, or
   PyTorch's memory fraction for its own allocators), searched from the
   phantom T4's answer (--guesses): two runs when the phantom was right.

Results: DIR/card.json (written after each phase) and DIR/card.md.
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import zoo  # noqa: E402  (bench/zoo.py: its allocators and RunFailed)

ALLOCATORS = zoo.ALLOCATORS
HISTORY = 2_000_000
MiB = 1 << 20


class Clock:
    """The call's time limit: a phase asks before each run."""

    def __init__(self, seconds):
        self.end = time.monotonic() + seconds

    def left(self):
        return self.end - time.monotonic()


def run_one(model, allocator, out_json, steps, clock, batch=None, budget=None, history=0):
    """One zoo_run process: its result dict, or {"error": ...} when it failed
    or the time ran out."""
    limit = clock.left()
    if limit < 5:
        return {"error": "not run: the time limit"}
    cmd = [sys.executable, os.path.join(HERE, "zoo_run.py"), model, "--allocator", allocator,
           "--steps", str(steps), "--json", out_json]
    if batch is not None:
        cmd += ["--batch", str(batch)]
    if budget:
        cmd += ["--budget", budget]
    if history:
        cmd += ["--history", str(history)]
    log = out_json[:-len(".json")] + ".log"
    try:
        os.unlink(out_json)
    except FileNotFoundError:
        pass
    started = time.monotonic()
    with open(log, "w") as f:
        try:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=limit).returncode
        except subprocess.TimeoutExpired:
            return {"error": "not finished: the time limit"}
    # A run whose JSON was written stands, whatever PyTorch's teardown did.
    try:
        with open(out_json) as f:
            result = json.load(f)
    except (OSError, ValueError):
        with open(log) as f:
            tail = f.read().strip().splitlines()[-1:] or ["no output"]
        return {"error": "exit %d: %s" % (rc, tail[0][:300])}
    result["wall_seconds"] = round(time.monotonic() - started, 1)
    return result


def _pmap(fn, items, jobs):
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(fn, items))


def phase_memory(models, allocators, out, steps, jobs, clock):
    d = os.path.join(out, "gpu_zoo")
    os.makedirs(d, exist_ok=True)
    pairs = [(m, a) for m in models for a in allocators]

    def one(pair):
        m, a = pair
        history = HISTORY if a in ("native", "expandable") else 0
        r = run_one(m, a, os.path.join(d, f"{m}.{a}.json"), steps, clock, history=history)
        r.pop("allocation_sizes", None)  # kept in its own file for the comparison
        print(f"memory {m:12} {a:19} {_brief(r)}", flush=True)
        return {"model": m, "allocator": a, **r}

    return _pmap(one, pairs, jobs)


def _brief(r):
    if "error" in r:
        return r["error"]
    if not r.get("fits"):
        return "OOM " + r.get("oom", "")[:80]
    return "allocated %s MiB, reserved %s MiB" % (_mib(r["peak_allocated_bytes"]), _mib(r["peak_reserved_bytes"]))


def _mib(n):
    return "-" if n is None else f"{n / MiB:,.0f}"


def phase_batch(models, allocators, out, guesses, budget, jobs, clock):
    d = os.path.join(out, "batch")
    os.makedirs(d, exist_ok=True)

    def one(pair):
        m, a = pair
        tried = {}

        def fits(batch):
            r = run_one(m, a, os.path.join(d, f"{m}.{a}.{batch}.json"), 2, clock, batch=batch, budget=budget)
            if "error" in r:
                raise zoo.RunFailed(r["error"])
            tried[batch] = bool(r["fits"])
            return tried[batch]

        guess = guesses.get((m, a)) or zoo_default_batch(m)
        try:
            result = {"largest_batch": largest_fitting(fits, guess)}
        except zoo.RunFailed as exc:
            result = {"error": str(exc)}
        result.update(model=m, allocator=a, guess=guess, runs=len(tried),
                      tried={str(k): v for k, v in sorted(tried.items())})
        print(f"batch  {m:12} {a:19} {result.get('largest_batch', result.get('error'))} "
              f"(phantom {guess}, {len(tried)} runs)", flush=True)
        return result

    return _pmap(one, [(m, a) for m in models for a in allocators], jobs)


def largest_fitting(fits, guess):
    """The largest batch b >= 0 with fits(b), fits monotone (True up to some
    b, False above), searched from `guess` a batch at a time first: two runs
    when the guess is right (the phantom's answer). Batch 0 is never run."""
    return zoo.first_true(lambda b: not fits(b), max(1, guess) + 1, 0, first_step=1) - 1


def zoo_default_batch(model):
    import zoo_models

    return zoo_models.default_batch(model)


def phase_timing(models, allocators, out, steps, clock, rounds):
    d = os.path.join(out, "timing")
    os.makedirs(d, exist_ok=True)
    results = []
    for m in models:
        ratios = {a: [] for a in allocators}
        medians = {a: [] for a in allocators}
        for r in range(rounds):
            order = allocators[r % len(allocators):] + allocators[:r % len(allocators)]
            got = {}
            for a in order:
                res = run_one(m, a, os.path.join(d, f"{m}.{a}.{r}.json"), steps, clock)
                if "median_step_seconds" in res:
                    got[a] = res["median_step_seconds"]
                    medians[a].append(got[a])
            if "native" in got:
                for a, t in got.items():
                    ratios[a].append(t / got["native"])
            print(f"timing {m:12} round {r}: " + ", ".join(f"{a} {t * 1e3:.1f} ms" for a, t in got.items()),
                  flush=True)
        for a in allocators:
            results.append({"model": m, "allocator": a, "rounds": len(ratios[a]),
                            "median_step_seconds": statistics.median(medians[a]) if medians[a] else None,
                            "ratio_to_default": statistics.median(ratios[a]) if ratios[a] else None,
                            "ratios": [round(x, 4) for x in ratios[a]]})
    return results


def load_guesses(path):
    """(model, allocator) -> the phantom's largest batch on a T4."""
    if not path or not os.path.exists(path):
        return {}
    with open(path) as f:
        rows = json.load(f)["rows"]
    return {(r["model"], r["allocator"]): (r.get("largest_batch") or {}).get("T4") for r in rows}


def device_info():
    import torch

    p = torch.cuda.get_device_properties(0)
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        driver = None
    return {"gpu": p.name, "cc": "%d.%d" % (p.major, p.minor), "total_memory": p.total_memory,
            "driver": driver, "torch": torch.__version__, "cuda": torch.version.cuda,
            "python": sys.version.split()[0], "date": datetime.date.today().isoformat()}


def markdown(card):
    meta = card["meta"]
    lines = [f"# The zoo on {meta['gpu']} (driver {meta['driver']}, torch {meta['torch']}, {meta['date']})", ""]
    by = {(r["model"], r["allocator"]): r for r in card.get("memory", [])}
    batch = {(r["model"], r["allocator"]): r for r in card.get("batch", [])}
    timing = {(r["model"], r["allocator"]): r for r in card.get("timing", [])}
    lines += ["| model | allocator | peak allocated MiB | peak reserved MiB | largest batch, T4 budget "
              "(phantom T4) | step time / default |", "|---|---|---|---|---|---|"]
    for m in meta["models"]:
        for a in meta["allocators"]:
            r = by.get((m, a), {})
            if "error" in r:
                mem = [r["error"], ""]
            elif r and not r.get("fits"):
                mem = ["OOM", ""]
            else:
                mem = [_mib(r.get("peak_allocated_bytes")), _mib(r.get("peak_reserved_bytes"))]
            b = batch.get((m, a))
            bcell = "-" if b is None else (f"{b['largest_batch']} ({b['guess']})" if "largest_batch" in b
                                           else b["error"])
            t = timing.get((m, a), {}).get("ratio_to_default")
            tcell = "-" if t is None else f"{t:.3f} ({timing[(m, a)]['rounds']} rounds)"
            lines.append(f"| {m} | {a} | {mem[0]} | {mem[1]} | {bcell} | {tcell} |")
    return "\n".join(lines) + "\n"


def save(out, card):
    with open(os.path.join(out, "card.json.tmp"), "w") as f:
        json.dump(card, f, indent=1)
    os.replace(os.path.join(out, "card.json.tmp"), os.path.join(out, "card.json"))
    with open(os.path.join(out, "card.md"), "w") as f:
        f.write(markdown(card))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default="gpt2,bert,resnet50,vit_b_16")
    ap.add_argument("--allocators", default=",".join(ALLOCATORS))
    ap.add_argument("--seconds", type=float, default=300, help="the time limit of all three phases")
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3, help="steps of a memory run")
    ap.add_argument("--timing-steps", type=int, default=20)
    ap.add_argument("--timing-models", default="gpt2,resnet50")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--budget", default="T4", help="the budget of the largest-batch search")
    ap.add_argument("--guesses", default=os.path.join(HERE, "results", "zoo-full-2.15.0-2026-11-26", "zoo.json"))
    ap.add_argument("--phases", default="memory,batch,timing")
    args = ap.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    allocators = [a for a in args.allocators.split(",") if a]
    for a in allocators:
        if a not in ALLOCATORS:
            ap.error(f"unknown allocator {a!r}: one of {', '.join(ALLOCATORS)}")
    os.makedirs(args.out, exist_ok=True)
    clock = Clock(args.seconds)
    card = {"meta": {**device_info(), "models": models, "allocators": allocators, "budget": args.budget}}
    phases = args.phases.split(",")
    if "memory" in phases:
        card["memory"] = phase_memory(models, allocators, args.out, args.steps, args.jobs, clock)
        save(args.out, card)
    if "timing" in phases:
        timing_models = [m for m in args.timing_models.split(",") if m in models]
        card["timing"] = phase_timing(timing_models, allocators, args.out, args.timing_steps, clock, args.rounds)
        save(args.out, card)
    if "batch" in phases:
        card["batch"] = phase_batch(models, allocators, args.out, load_guesses(args.guesses), args.budget,
                                    args.jobs, clock)
        save(args.out, card)
    save(args.out, card)
    print(markdown(card))


if __name__ == "__main__":
    main()
