"""The remedies (`dryrun --remedies`) measured on three zoo models that do not
fit a T4 at the batch asked: a decoder (GPT-2 in fp32, its own loop), a CNN
(ResNet-50, bf16 autocast, SGD) and a Hugging Face model through Trainer
(BERT-base).

    python bench/zoo_remedies.py --out DIR                 # full sizes
    python bench/zoo_remedies.py --out DIR --size small --memory 1GiB

Each model runs through bench/zoo_run.py (its allocator the dry run's) on a
phantom T4: the program as written under PyTorch's allocator and
vramguard's, then each remedy and the combinations under vramguard's. The
rows, the cheapest change and its code go to DIR/remedies.json and
DIR/remedies.md (torch version, date, wall time per model).
"""
import argparse
import datetime
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))

#: name -> (zoo model, batch at full size, batch at small size)
MODELS = (("decoder", "gpt2-fp32", 16, 8), ("cnn", "resnet50", 512, 64), ("trainer", "bert-trainer", 64, 32))


def measure(model, batch, args):
    from vramguard import dryrun

    started = time.monotonic()
    result = dryrun(os.path.join(HERE, "zoo_run.py"), model, "--allocator", "given", "--batch", str(batch),
                    "--size", args.size, "--steps", "3", gpu=args.gpu, memory=args.memory,
                    allocators="native,vramguard", remedies=True, snapshot=False, echo=False,
                    out=args.out)
    return {"model": model, "batch": batch, "seconds": round(time.monotonic() - started, 1),
            "verdict": result["verdict"], "remedies": result["remedies"],
            "as_written": {a: {k: result[a].get(k) for k in ("fits", "peak_allocated_bytes", "peak_reserved_bytes")}
                           for a in result["allocators"]},
            "report": str(result)}


def markdown(rows, header):
    from vramguard.dryrun.features.remedies import table_lines

    out = [header, ""]
    for row in rows:
        out += [f"## {row['model']}, batch {row['batch']} ({row['seconds']:.0f} s)", "", "```"]
        out += table_lines({"remedies": row["remedies"], "allocators": [], "gpu": ""})
        out += ["```", ""]
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--size", choices=("small", "full"), default="full")
    ap.add_argument("--gpu", default="T4")
    ap.add_argument("--memory", default=None, help="the device's memory instead of the card's")
    ap.add_argument("--models", default=",".join(m[0] for m in MODELS), help="of decoder, cnn, trainer")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    import torch

    wanted = args.models.split(",")
    rows = []
    for kind, model, full, small in MODELS:
        if kind in wanted:
            rows.append(measure(model, full if args.size == "full" else small, args))
            print(f"zoo_remedies: {model}: {rows[-1]['remedies'].get('sentence')} ({rows[-1]['seconds']:.0f} s)",
                  flush=True)
    meta = {"torch": torch.__version__, "date": datetime.date.today().isoformat(), "gpu": args.gpu,
            "memory": args.memory, "size": args.size}
    with open(os.path.join(args.out, "remedies.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    header = (f"# Remedies on the zoo: phantom {args.gpu}{' of ' + args.memory if args.memory else ''}, "
              f"torch {meta['torch']}, {meta['date']}, {args.size} sizes")
    with open(os.path.join(args.out, "remedies.md"), "w") as f:
        f.write(markdown(rows, header) + "\n")


if __name__ == "__main__":
    main()
