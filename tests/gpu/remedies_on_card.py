"""Each remedy of `dryrun --remedies`, applied the way a dry run applies it
(vramguard.dryrun.features.remedy_apply), to one program on a card and on a phantom
of it: the peaks side by side.

    python tests/gpu/remedies_on_card.py --out DIR                  # on the card (tests/gpu/card.sh)
    python tests/gpu/remedies_on_card.py --compare DIR              # on any machine, afterwards: the phantom's

Each setting runs in a process of its own under PyTorch's default
allocator: the program as written, autocast (bf16 where the card has it,
else fp16), checkpointing, fused AdamW (the card's image has no
bitsandbytes), and all three. DIR/remedies_card.json holds the card's,
DIR/remedies_phantom.json and DIR/remedies.md the comparison.
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PROGRAM = os.path.join(HERE, "remedy_program.py")
BATCH = "16"

RUNNER = """
import json, runpy, sys, torch
from vramguard.dryrun.features import remedy_apply
seen = remedy_apply.install(torch, sys.argv[1])
sys.argv = [sys.argv[2], sys.argv[3]]
runpy.run_path(sys.argv[0], run_name="__main__")
print("RESULT " + json.dumps({"peak_allocated_bytes": torch.cuda.max_memory_allocated(),
                              "peak_reserved_bytes": torch.cuda.max_memory_reserved(),
                              "applied": seen.figures()["applied"],
                              "device": torch.cuda.get_device_name(0)}))
"""


def settings(bf16):
    amp = "autocast:" + ("bfloat16" if bf16 else "float16")
    return {"as written": "", "autocast": amp, "checkpointing": "checkpoint", "fused AdamW": "optimizer:fused",
            "all three": f"{amp},checkpoint,optimizer:fused"}


def run_all(env, bf16):
    out = {}
    for name, spec in settings(bf16).items():
        proc = subprocess.run([sys.executable, "-c", RUNNER, spec, PROGRAM, BATCH], capture_output=True,
                              text=True, env=env, timeout=300)
        line = next((l for l in proc.stdout.splitlines() if l.startswith("RESULT ")), None)
        out[name] = json.loads(line[7:]) if line else {"error": (proc.stderr.strip().splitlines() or ["?"])[-1]}
        print(f"{name}: {out[name]}", flush=True)
    return out


def base_env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "python")] + [p for p in [env.get("PYTHONPATH")] if p])
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    return env


def on_card(out):
    import torch

    bf16 = torch.cuda.get_device_capability(0) >= (8, 0)
    results = {"torch": torch.__version__, "bf16": bf16, "batch": int(BATCH), "runs": run_all(base_env(), bf16)}
    with open(os.path.join(out, "remedies_card.json"), "w") as f:
        json.dump(results, f, indent=1)


def compare(folder):
    from vramguard._presets import PRESETS
    from vramguard.phantom.gpu import environ

    card = json.load(open(os.path.join(folder, "remedies_card.json")))
    name = next(iter(card["runs"].values())).get("device", "")
    preset = next((p.name for p in PRESETS.values() if p.cuda_name == name), None)
    if preset is None:
        sys.exit(f"remedies_on_card: no preset for the card {name!r}")
    env = dict(base_env(), **environ(preset))
    phantom = run_all(env, card["bf16"])
    with open(os.path.join(folder, "remedies_phantom.json"), "w") as f:
        json.dump({"preset": preset, "runs": phantom}, f, indent=1)
    lines = [f"# Remedies on {name} (torch {card['torch']}) and on a phantom {preset}, batch {card['batch']}", "",
             "| setting | card allocated | phantom allocated | card reserved | phantom reserved |", "|---|---:|---:|---:|---:|"]
    for key, c in card["runs"].items():
        p = phantom.get(key, {})
        lines.append(f"| {key} | {c.get('peak_allocated_bytes')} | {p.get('peak_allocated_bytes')} | "
                     f"{c.get('peak_reserved_bytes')} | {p.get('peak_reserved_bytes')} |")
    with open(os.path.join(folder, "remedies.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="on the card: where remedies_card.json goes")
    ap.add_argument("--compare", metavar="DIR", help="afterwards, anywhere: the phantom's side of DIR's card runs")
    args = ap.parse_args()
    if bool(args.out) == bool(args.compare):
        ap.error("one of --out (on the card) or --compare DIR (afterwards)")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        on_card(args.out)
    else:
        compare(args.compare)


if __name__ == "__main__":
    main()
