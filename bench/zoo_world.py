"""One rank for a job of any size (`dryrun --world-size N`), checked against
every rank run (`dryrun --nproc N`), then sized at 64 to 1,024 ranks.

    python bench/zoo_world.py --out DIR                      # both tables, full sizes (make bench-zoo)
    python bench/zoo_world.py --out DIR --size small --nproc 2 --modes fsdp --no-large --check   # CI's

1. Agreement: the zoo's decoder (bench/zoo_rank_program.py) with DDP and with
   FSDP2 on N = 2, 4, 8 phantom ranks, each allocator: rank 0's peak
   allocated and reserved under --world-size N (one process on PyTorch's
   fake process group) against --nproc N (torchrun, N processes). --check
   fails unless they are equal, and the world run's parameter and AdamW
   shares are the --nproc run's.
2. Large: Llama-2's 7B and 70B shapes under FSDP2 (built on the meta device,
   bf16 through FSDP's mixed-precision policy, gradient checkpointing,
   AdamW, batch 1 x 4096) at N = 64, 256, 1,024: per-rank peaks, the
   rank's parameter and optimizer shares (1/N), wall time and host memory.

Results: DIR/world.json and DIR/world.md (torch version, GPU, date).
"""
import argparse
import datetime
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import zoo_ranks  # noqa: E402

MiB = 1 << 20


def agreement(args, modes, counts):
    rows = []
    for mode in modes:
        for n in counts:
            exact = zoo_ranks.dry_run(mode, n, args)
            world = zoo_ranks.dry_run(mode, n, args, world=True)
            print(f"zoo_world: {mode} on {n} ranks: --nproc {exact['seconds']:.0f} s, "
                  f"--world-size {world['seconds']:.0f} s", flush=True)
            rows.append({"mode": mode, "nproc": n, "exact": exact, "world": world})
    return rows


def disagreements(row):
    """What --check refuses: rank 0's figures differ between the two modes."""
    out = []
    for allocator, run in row["world"]["runs"].items():
        exact = row["exact"]["runs"][allocator]
        rank0 = (exact.get("ranks") or [exact])[0]
        name = f"{row['mode']} on {row['nproc']} ranks, {allocator}"
        if run.get("fits") is not True or run.get("error"):
            out.append(f"{name}: --world-size run fits {run.get('fits')}, error {run.get('error')!r}")
            continue
        for key in ("peak_allocated_bytes", "peak_reserved_bytes"):
            if run.get(key) != rank0.get(key):
                out.append(f"{name}: {key} {run.get(key)} under --world-size, {rank0.get(key)} under --nproc")
        ours, theirs = run["program"][0], exact["program"][0]
        for key in ("shard_bytes", "optimizer_state_bytes"):
            if not ours or not theirs or ours[key] != theirs[key]:
                out.append(f"{name}: rank 0's {key} differs ({ours and ours[key]} vs {theirs and theirs[key]})")
    return out


def large(args, shapes, counts):
    rows = []
    for shape in shapes:
        for n in counts:
            row = zoo_ranks.dry_run("fsdp", n, args, world=True, program_args=["--shape", shape, "--steps", "1"],
                                    label=f"{shape}-{n}")
            print(f"zoo_world: {shape} on {n} ranks: {row['seconds']:.0f} s", flush=True)
            rows.append(dict(row, shape=shape))
    return rows


def _mib(n):
    return "-" if n is None else f"{n / MiB:,.0f}"


def agreement_table(rows):
    lines = ["| mode | ranks | allocator | peak allocated, MiB: --nproc / --world-size | "
             "peak reserved, MiB: --nproc / --world-size | equal |", "|---|---|---|---|---|---|"]
    for row in rows:
        for allocator, run in row["world"]["runs"].items():
            exact = row["exact"]["runs"][allocator]
            rank0 = (exact.get("ranks") or [exact])[0]
            same = all(run.get(k) == rank0.get(k) for k in ("peak_allocated_bytes", "peak_reserved_bytes"))
            lines.append(f"| {row['mode'].upper()} | {row['nproc']} | {allocator} | "
                         f"{_mib(rank0.get('peak_allocated_bytes'))} / {_mib(run.get('peak_allocated_bytes'))} | "
                         f"{_mib(rank0.get('peak_reserved_bytes'))} / {_mib(run.get('peak_reserved_bytes'))} | "
                         f"{'yes' if same else 'NO'} |")
    return "\n".join(lines)


def large_table(rows):
    lines = ["| shape | ranks | allocator | peak allocated, MiB | peak reserved, MiB | parameters on the rank / "
             "whole, MiB | AdamW state, MiB | wall time, s | host RSS, MiB |", "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        for allocator, run in row["runs"].items():
            p = run["program"][0] or {}
            lines.append(f"| {row['shape']} | {row['nproc']:,} | {allocator} | {_mib(run.get('peak_allocated_bytes'))} | "
                         f"{_mib(run.get('peak_reserved_bytes'))} | {_mib(p.get('shard_bytes'))} / "
                         f"{_mib(p.get('param_bytes'))} | {_mib(p.get('optimizer_state_bytes'))} | "
                         f"{run.get('elapsed_s', 0):.0f} | {_mib(run.get('host_peak_rss_bytes'))} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--size", choices=("small", "full"), default="full", help="the zoo decoder's, for agreement")
    ap.add_argument("--nproc", default="2,4,8", help="rank counts checked against --nproc")
    ap.add_argument("--modes", default="ddp,fsdp")
    ap.add_argument("--allocators", default=",".join(zoo_ranks.ALLOCATORS))
    ap.add_argument("--gpu", default="A100-80GB")
    ap.add_argument("--large", default="64,256,1024", help="rank counts for the 7B and 70B shapes")
    ap.add_argument("--shapes", default="7b,70b")
    ap.add_argument("--no-large", action="store_true", help="the agreement table only")
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--check", action="store_true", help="fail unless both modes agree")
    args = ap.parse_args(argv)
    args.allocators = [a for a in args.allocators.split(",") if a]
    if any(a not in zoo_ranks.ALLOCATORS for a in args.allocators):
        ap.error(f"--allocators: some of {', '.join(zoo_ranks.ALLOCATORS)}")
    try:
        counts = [int(n) for n in args.nproc.split(",") if n]
        big = [int(n) for n in args.large.split(",") if n]
    except ValueError:
        ap.error("--nproc and --large are comma-separated whole numbers")
    if any(not 2 <= n <= 16 for n in counts):
        ap.error("--nproc: each count from 2 to 16 (one process each)")
    modes = [m for m in args.modes.split(",") if m]
    if any(m not in ("ddp", "fsdp") for m in modes):
        ap.error(f"--modes: ddp and/or fsdp, got {args.modes!r}")
    os.makedirs(args.out, exist_ok=True)
    rows = agreement(args, modes, counts)
    big_rows = [] if args.no_large else large(args, [s for s in args.shapes.split(",") if s], big)
    torch_version = next((r["world"]["torch"] for r in rows), None) or next((r["torch"] for r in big_rows), None)
    meta = {"gpu": args.gpu, "size": args.size, "torch": torch_version, "date": datetime.date.today().isoformat()}
    with open(os.path.join(args.out, "world.json"), "w") as f:
        json.dump({"meta": meta, "agreement": rows, "large": big_rows}, f, indent=1)
    text = (f"# One rank for any world size, on phantom {args.gpu}s (torch {torch_version}, {meta['date']})\n\n"
            f"## --world-size N against --nproc N: the zoo's decoder ({args.size} size), rank 0\n\n"
            + agreement_table(rows) + "\n")
    if big_rows:
        text += ("\n## Llama-2's 7B and 70B shapes, FSDP2, batch 1 x 4096, one rank of N\n\n"
                 + large_table(big_rows) + "\n")
    with open(os.path.join(args.out, "world.md"), "w") as f:
        f.write(text)
    print(text)
    if args.check:
        found = [line for row in rows for line in disagreements(row)]
        found += [line for row in rows for line in zoo_ranks.problems(row["world"])]
        for line in found:
            print("zoo_world: " + line, file=sys.stderr)
        if found:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
