"""The QLoRA table: the Colab fine-tuning recipes of the zoo
(bench/zoo_models.py: llama2-7b-qlora, llama2-7b-qlora-adamw, llama-1b-lora),
each through the public dry run (`vramguard.dryrun`, bench/zoo_run.py as
the script, no weights anywhere), per allocator:

- peak allocated and reserved, and the unified memory the program took
  (bitsandbytes' paged optimizer state: `managed_bytes`), at batch 1 on a T4;
- the largest batch on a T4 and on an L4 (dryrun's sweep: bisection over
  BATCHES, a few runs, not one per value);
- the longest sequence at batch 1 on a T4 (a sweep over SEQS, up to the
  model's context).

    python bench/zoo_qlora.py                       # full size: about 20 minutes on 2 cores
    python bench/zoo_qlora.py --size small --out /tmp/q

Results: results.json (every dry run's figures) and table.md in --out
(default bench/results/zoo-qlora-<torch>-<date>/).
"""
import argparse
import datetime
import json
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ALLOCATORS = ("native", "expandable", "vramguard")
STEPS = 2  # the first makes the adapters' gradients, the second runs on the optimizer's state
BATCHES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
#: name, zoo model, sequences of its rows, the sequences of its longest-sequence sweep (to its context)
RECIPES = (
    ("QLoRA 7B, paged AdamW 8-bit", "llama2-7b-qlora", (512, 1024, 2048),
     (512, 1024, 1536, 2048, 2560, 3072, 3584, 4096)),
    ("QLoRA 7B, torch AdamW", "llama2-7b-qlora-adamw", (512, 1024, 2048),
     (512, 1024, 1536, 2048, 2560, 3072, 3584, 4096)),
    ("LoRA 1.1B, bf16", "llama-1b-lora", (1024,), (256, 512, 768, 1024, 1280, 1536, 1792, 2048)),
)
SMALL_SEQS = (64, 128)


def dry(model, size, args, gpu, sweep=None, workdir=None):
    import vramguard

    argv = [model, "--allocator", "given", "--size", size, "--steps", str(STEPS)] + list(args)
    return vramguard.dryrun(os.path.join(HERE, "zoo_run.py"), *argv, gpu=gpu, allocators=list(ALLOCATORS),
                            sweep=sweep, echo=False, snapshot=False, jobs=len(ALLOCATORS),
                            cwd=os.path.join(workdir, "{allocator}"))


def _figures(result):
    """Per allocator, what the table takes from a dry run."""
    out = {}
    for name in ALLOCATORS:
        r = result[name]
        out[name] = {k: r.get(k) for k in ("fits", "peak_allocated_bytes", "peak_reserved_bytes", "managed_bytes",
                                           "managed_prefetched_bytes", "largest_value", "error", "exit_status",
                                           "host_peak_rss_bytes", "elapsed_s")}
        if r.get("sweep"):
            out[name]["sweep"] = r["sweep"]
    return out


def measure(model, size, seqs, seq_sweep, workdir, log):
    rows = []
    for seq in seqs:
        seq_args = ["--seq", str(seq)]
        at1 = dry(model, size, seq_args + ["--batch", "1"], "T4", workdir=workdir)
        t4 = dry(model, size, seq_args + ["--batch", "{BATCH}"], "T4", f"BATCH={','.join(map(str, BATCHES))}",
                 workdir)
        l4 = dry(model, size, seq_args + ["--batch", "{BATCH}"], "L4", f"BATCH={','.join(map(str, BATCHES))}",
                 workdir)
        rows.append({"seq": seq, "batch1_t4": _figures(at1), "batch_t4": _figures(t4), "batch_l4": _figures(l4)})
        log(f"{model} seq {seq}: done")
    longest = dry(model, size, ["--seq", "{SEQ}", "--batch", "1"], "T4", f"SEQ={','.join(map(str, seq_sweep))}",
                  workdir)
    log(f"{model} longest sequence: done")
    return {"rows": rows, "longest_seq_t4": _figures(longest), "seq_sweep": list(seq_sweep)}


def _gib(n):
    return "-" if n is None else f"{n / 2**30:.2f} GiB"


def _mib(n):
    return "-" if not n else f"{n / 2**20:,.1f} MiB"


def _largest(fig, values):
    """The largest value that fits, '(all tried)' when it is the last one."""
    v = fig.get("largest_value")
    if fig.get("error"):
        return f"failed ({fig['error'][:60]})"
    if v is None:
        return "none"
    return f"{v:,}" + (" (the largest tried)" if v == values[-1] else "")


def table(results):
    lines = ["| recipe | seq | allocator | peak allocated | peak reserved | unified memory | "
             "largest batch, T4 | largest batch, L4 |",
             "|---|---:|---|---:|---:|---:|---:|---:|"]
    for name, rec in results["recipes"].items():
        for row in rec["rows"]:
            for a in ALLOCATORS:
                one = row["batch1_t4"][a]
                lines.append(f"| {name} | {row['seq']:,} | {a} | {_gib(one['peak_allocated_bytes'])} | "
                             f"{_gib(one['peak_reserved_bytes'])} | {_mib(one['managed_bytes'])} | "
                             f"{_largest(row['batch_t4'][a], BATCHES)} | {_largest(row['batch_l4'][a], BATCHES)} |")
    lines += ["", "| recipe | allocator | longest sequence at batch 1, T4 |", "|---|---|---:|"]
    for name, rec in results["recipes"].items():
        for a in ALLOCATORS:
            lines.append(f"| {name} | {a} | {_largest(rec['longest_seq_t4'][a], rec['seq_sweep'])} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=("small", "full"), default="full")
    ap.add_argument("--out", help="results folder (default bench/results/zoo-qlora-<torch>-<date>)")
    ap.add_argument("--recipes", help="comma-separated zoo models (default: all)")
    args = ap.parse_args(argv)
    import torch

    version = torch.__version__.split("+")[0]
    out = args.out or os.path.join(HERE, "results", f"zoo-qlora-{version}-{datetime.date.today()}")
    os.makedirs(out, exist_ok=True)
    wanted = set(args.recipes.split(",")) if args.recipes else None
    results = {"torch": torch.__version__, "size": args.size, "steps": STEPS, "batches": list(BATCHES),
               "date": str(datetime.date.today()), "recipes": {}}
    started = time.monotonic()

    def log(text):
        print(f"[{time.monotonic() - started:6.0f}s] {text}", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="zoo-qlora-") as workdir:
        for name, model, seqs, seq_sweep in RECIPES:
            if wanted and model not in wanted:
                continue
            if args.size == "small":
                seqs, seq_sweep = SMALL_SEQS, SMALL_SEQS
            rec = measure(model, args.size, seqs, seq_sweep, workdir, log)
            rec["model"] = model
            results["recipes"][name] = rec
    results["elapsed_s"] = round(time.monotonic() - started, 1)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write(table(results))
    print(table(results))


if __name__ == "__main__":
    main()
