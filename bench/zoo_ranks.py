"""The zoo past one GPU: the zoo's decoder trained with DDP and with FSDP2
on N phantom GPUs, through `python -m vramguard dryrun --nproc N` (the real
torchrun, one phantom device per rank), under each allocator.

    python bench/zoo_ranks.py --out DIR                       # DDP and FSDP, 2 and 4 ranks, full size
    python bench/zoo_ranks.py --out DIR --size small --nproc 2 --check   # CI's run

Per mode, ranks and allocator, each rank's peak allocated and reserved (the
dry run's), the model's bytes and this rank's share of them and of the
optimizer state (bench/zoo_rank_program.py), and the rank's host memory.
--check fails unless every run fits and ends cleanly, FSDP's parameters
and optimizer state are 1/N per rank (to 0.1%: each parameter is split
along its first dimension, the last shard may be short), DDP's whole on
every rank, and vramguard's peak allocated equals expandable segments'
(both split blocks; PyTorch's default keeps remainders, within 3%).

Results: DIR/ranks.json and DIR/ranks.md (torch version, GPU, date).
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PROGRAM = os.path.join(HERE, "zoo_rank_program.py")
ALLOCATORS = ("native", "expandable", "vramguard")
MiB = 1 << 20


def dry_run(mode, nproc, args, world=False, program_args=(), label=None):
    """One dry run of every allocator: {allocator: run} with each rank's
    figures from the program's files under "program". world: one process
    as rank 0 of `nproc` on PyTorch's fake process group (--world-size),
    instead of `nproc` processes (--nproc); its "program" has rank 0's only."""
    out = os.path.join(args.out, label or f"{mode}-{nproc}{'-world' if world else ''}")
    ranks_dir = os.path.join(out, "ranks")
    spread = ["--world-size", str(nproc)] if world else ["--nproc", str(nproc)]
    cmd = [sys.executable, "-m", "vramguard", "dryrun", "--gpu", args.gpu, *spread, "--json",
           "--quiet", "--no-snapshot", "--allocator", ",".join(args.allocators), "--out", out, PROGRAM,
           "--size", args.size, "--json-dir", ranks_dir, *program_args] + (["--fsdp"] if mode == "fsdp" else [])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.join(ROOT, "python")] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout, cwd=ROOT)
    seconds = time.monotonic() - started
    try:
        result = json.loads(proc.stdout)
    except ValueError:
        raise SystemExit(f"zoo_ranks: {mode} on {nproc} ranks: exit {proc.returncode}: "
                         f"{(proc.stderr.strip().splitlines() or ['no output'])[-1]}") from None
    runs = {}
    for allocator in args.allocators:
        run = dict(result[allocator])
        program = []
        for r in range(1 if world else nproc):
            path = os.path.join(ranks_dir, f"{allocator}.rank{r}.json")
            try:
                with open(path) as f:
                    program.append(json.load(f))
            except (OSError, ValueError):
                program.append(None)
        run["program"] = program
        runs[allocator] = run
    return {"mode": mode, "nproc": nproc, "world": world, "seconds": round(seconds, 1),
            "torch": result.get("torch"), "runs": runs}


def problems(row):
    """What --check refuses in one dry run, as lines."""
    out = []
    n = row["nproc"]
    for allocator, run in row["runs"].items():
        name = f"{row['mode']} on {n} ranks, {allocator}"
        if run.get("fits") is not True or run.get("error") or run.get("exit_status"):
            out.append(f"{name}: fits {run.get('fits')}, error {run.get('error')!r}")
            continue
        for r, p in enumerate(run["program"]):
            if p is None:
                out.append(f"{name}: rank {r} wrote no figures")
                continue
            whole = p["param_bytes"]
            if row["mode"] == "ddp":
                if p["shard_bytes"] != whole:
                    out.append(f"{name}: rank {r} holds {p['shard_bytes']} of {whole} parameter bytes")
                if p["optimizer_state_bytes"] != 2 * whole:
                    out.append(f"{name}: rank {r}'s AdamW state is {p['optimizer_state_bytes']}, not 2x {whole}")
            else:
                # Each parameter is split along its first dimension: a shard
                # is at most one row over 1/N of it.
                slack = whole // 1000
                if abs(p["shard_bytes"] - whole / n) > slack:
                    out.append(f"{name}: rank {r} holds {p['shard_bytes']} parameter bytes, not 1/{n} of {whole}")
                if abs(p["optimizer_state_bytes"] - 2 * p["shard_bytes"]) > 0:
                    out.append(f"{name}: rank {r}'s AdamW state {p['optimizer_state_bytes']} is not twice "
                               f"its shard {p['shard_bytes']}")
    # Peak allocated counts whole blocks: PyTorch's default keeps a small
    # block's unsplit remainder, expandable segments and vramguard split it,
    # so vramguard's must equal expandable's, and the default's to a few percent.
    ours = row["runs"].get("vramguard", {}).get("peak_allocated_bytes")
    for other, rel in (("expandable", 0.0), ("native", 0.03)):
        theirs = row["runs"].get(other, {}).get("peak_allocated_bytes")
        if ours is not None and theirs is not None and abs(ours - theirs) > max(ours, theirs) * rel:
            out.append(f"{row['mode']} on {n} ranks: vramguard's peak allocated {ours} is not {other}'s {theirs}")
    return out


def _mib(n):
    return "-" if n is None else f"{n / MiB:,.0f}"


def table(rows):
    lines = ["| mode | ranks | allocator | peak allocated per rank, MiB | peak reserved per rank, MiB | "
             "parameters on a rank / whole | AdamW state per rank, MiB | host RSS per rank, MiB |",
             "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        for allocator, run in row["runs"].items():
            ranks = run.get("ranks") or []
            program = [p for p in run["program"] if p]
            share = (f"{_mib(program[0]['shard_bytes'])} / {_mib(program[0]['param_bytes'])}"
                     if program else "-")
            lines.append(
                f"| {row['mode'].upper()} | {row['nproc']} | {allocator} | "
                + " / ".join(_mib(r.get("peak_allocated_bytes")) for r in ranks) + " | "
                + " / ".join(_mib(r.get("peak_reserved_bytes")) for r in ranks) + f" | {share} | "
                + " / ".join(_mib(p["optimizer_state_bytes"]) for p in program) + " | "
                + " / ".join(_mib(p["host_peak_rss_bytes"]) for p in program) + " |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--size", choices=("small", "full"), default="full")
    ap.add_argument("--nproc", default="2,4", help="comma-separated rank counts")
    ap.add_argument("--modes", default="ddp,fsdp")
    ap.add_argument("--allocators", default=",".join(ALLOCATORS))
    ap.add_argument("--gpu", default="A100-40GB")
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args(argv)
    args.allocators = [a for a in args.allocators.split(",") if a]
    for a in args.allocators:
        if a not in ALLOCATORS:
            ap.error(f"unknown allocator {a!r}: one of {', '.join(ALLOCATORS)}")
    try:
        counts = [int(n) for n in args.nproc.split(",")]
    except ValueError:
        ap.error(f"--nproc must be comma-separated whole numbers, got {args.nproc!r}")
    if any(not 2 <= n <= 16 for n in counts):
        ap.error("--nproc: each count from 2 to 16")
    modes = [m for m in args.modes.split(",") if m]
    if any(m not in ("ddp", "fsdp") for m in modes):
        ap.error(f"--modes: ddp and/or fsdp, got {args.modes!r}")
    os.makedirs(args.out, exist_ok=True)
    rows = []
    meta = {"gpu": args.gpu, "size": args.size, "date": datetime.date.today().isoformat()}
    for mode in modes:
        for n in counts:
            row = dry_run(mode, n, args)
            meta["torch"] = row["torch"]
            rows.append(row)
            print(f"zoo_ranks: {mode} on {n} ranks: {row['seconds']:.0f} s", flush=True)
            with open(os.path.join(args.out, "ranks.json"), "w") as f:
                json.dump({"meta": meta, "rows": rows}, f, indent=1)
    text = (f"# The zoo's decoder on {counts} phantom {args.gpu} ranks ({args.size} size, torch "
            f"{meta.get('torch')}, {meta['date']})\n\n" + table(rows) + "\n")
    with open(os.path.join(args.out, "ranks.md"), "w") as f:
        f.write(text)
    print(text)
    if args.check:
        found = [line for row in rows for line in problems(row)]
        for line in found:
            print("zoo_ranks: " + line, file=sys.stderr)
        if found:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
