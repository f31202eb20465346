"""Record real allocation traces under PyTorch's native allocator, for the
project's own trace corpus (tests/data/): random weights, synthetic data,
a few training steps each, one process per workload.

    python bench/record_traces.py --out tests/data

Workloads: ResNet-50 training, ViT-B/16 training, GPT-2 small training at
sequence 1024, and one mixed-precision fine-tuning step of a transformers
model with gradient checkpointing. Stack frames are stripped and the pickle
gzipped, so each file is small; vramguard.load_trace() reads them.
"""
import argparse
import gzip
import pickle
import subprocess
import sys
from pathlib import Path

WORKLOADS = ["resnet50_train", "vit_b16_train", "gpt2_seq1024_train", "bert_bf16_ckpt_finetune"]


def run(name, torch):
    g = torch.Generator(device="cuda").manual_seed(0)
    if name in ("resnet50_train", "vit_b16_train"):
        import torchvision

        model = (torchvision.models.resnet50 if name.startswith("resnet") else torchvision.models.vit_b_16)(weights=None)
        model = model.cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        x = torch.randn(64, 3, 224, 224, device="cuda", generator=g)
        y = torch.randint(0, 1000, (64,), device="cuda", generator=g)
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    elif name == "gpt2_seq1024_train":
        import transformers

        model = transformers.GPT2LMHeadModel(transformers.GPT2Config()).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        ids = torch.randint(0, 50257, (8, 1024), device="cuda", generator=g)
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
    else:
        import transformers

        config = transformers.BertConfig(num_labels=2)
        model = transformers.BertForSequenceClassification(config).cuda()
        model.gradient_checkpointing_enable()
        opt = torch.optim.AdamW(model.parameters(), lr=2e-5)
        ids = torch.randint(0, config.vocab_size, (32, 512), device="cuda", generator=g)
        labels = torch.randint(0, 2, (32,), device="cuda", generator=g)
        for _ in range(2):
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(input_ids=ids, labels=labels).loss
            loss.backward()
            opt.step()
    torch.cuda.synchronize()


def strip(snapshot):
    """Drop stack frames: they are most of the size and replay needs none."""
    for trace in snapshot.get("device_traces", []):
        for ev in trace:
            ev.pop("frames", None)
            ev.pop("compile_context", None)
    for seg in snapshot.get("segments", []):
        seg.pop("frames", None)
        for blk in seg.get("blocks", []):
            blk.pop("frames", None)
    return snapshot


def worker(name, out):
    import torch

    torch.cuda.memory._record_memory_history(max_entries=2_000_000)
    run(name, torch)
    raw = Path(out) / f"{name}.raw.pickle"
    torch.cuda.memory._dump_snapshot(str(raw))
    torch.cuda.memory._record_memory_history(enabled=None)
    with open(raw, "rb") as f:
        snapshot = strip(pickle.load(f))
    raw.unlink()
    path = Path(out) / f"{name}.snapshot.pickle.gz"
    with gzip.open(path, "wb", mtime=0) as f:
        pickle.dump(snapshot, f, protocol=4)
    print(path, path.stat().st_size)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", default="tests/data")
    p.add_argument("--worker")
    p.add_argument("--only", help="comma-separated subset of: " + ", ".join(WORKLOADS))
    args = p.parse_args()
    if args.worker:
        return worker(args.worker, args.out)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    for name in (args.only.split(",") if args.only else WORKLOADS):
        proc = subprocess.run([sys.executable, __file__, "--worker", name, "--out", args.out],
                              capture_output=True, text=True)
        print(proc.stdout.strip() or f"{name}: FAILED\n{proc.stderr[-2000:]}", flush=True)


if __name__ == "__main__":
    main()
