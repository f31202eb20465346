"""Real training side by side: the same model, seed and data in two
processes, one under PyTorch's native allocator and one under vramguard.

    python bench/gpu_train.py --models resnet18,gpt2 --steps 50 --json out.json
    python bench/gpu_train.py --models resnet50,gpt2-1024,vit --steps 100 --warmup 10
    python bench/gpu_train.py --models resnet50 --max-batch --budget 20GiB

Per model it reports the median step time ratio vramguard/native, the
peak reserved ratio, the peak allocated of both, and the largest difference
between the two loss curves (deterministic algorithms on, so they should be
equal). With --max-batch it finds, under one budget for both (the memory
fraction for native, the budget for vramguard), the largest batch each can
train.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

GiB = 1 << 30

# name -> (builder, default batch)
MODELS = {
    "resnet18": ("resnet", {"arch": "resnet18", "batch": 64, "bf16": False}),
    "resnet50": ("resnet", {"arch": "resnet50", "batch": 128, "bf16": True}),
    "gpt2": ("gpt2", {"seq": 512, "batch": 8}),
    "gpt2-1024": ("gpt2", {"seq": 1024, "batch": 8}),
    "vit": ("vit", {"batch": 64, "bf16": True}),
}


# ------------------------------------------------------------------ worker


def build(kind, opts, batch, torch):
    """(model, optimizer, step function) on synthetic data."""
    g = torch.Generator(device="cuda").manual_seed(0)
    if kind == "resnet" or kind == "vit":
        import torchvision

        if kind == "resnet":
            model = getattr(torchvision.models, opts["arch"])(weights=None)
        else:
            model = torchvision.models.vit_b_16(weights=None)
        x = torch.randn(batch, 3, 224, 224, device="cuda", generator=g)
        y = torch.randint(0, 1000, (batch,), device="cuda", generator=g)
        model = model.cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

        def loss_fn():
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=opts.get("bf16", False)):
                return torch.nn.functional.cross_entropy(model(x), y)
    else:
        import transformers

        config = transformers.GPT2Config(n_positions=max(1024, opts["seq"]))
        model = transformers.GPT2LMHeadModel(config).cuda()
        ids = torch.randint(0, config.vocab_size, (batch, opts["seq"]), device="cuda", generator=g)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def loss_fn():
            return model(input_ids=ids, labels=ids).loss

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn()
        loss.backward()
        opt.step()
        return loss

    return step


def worker(args):
    if args.allocator == "vramguard":
        import vramguard

        vramguard.install(budget=args.budget)
    import torch

    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(True, warn_only=True)
    if args.allocator == "native" and args.budget:
        from vramguard import parse_size

        torch.cuda.set_per_process_memory_fraction(parse_size(args.budget) / torch.cuda.mem_get_info()[1])
    kind, opts = MODELS[args.model]
    result = {"model": args.model, "allocator": args.allocator, "batch": args.batch}
    try:
        step = build(kind, opts, args.batch, torch)
        losses, times = [], []
        for i in range(args.warmup + args.steps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            loss = step()
            torch.cuda.synchronize()
            if i >= args.warmup:
                times.append(time.perf_counter() - t0)
                losses.append(loss.item())
        result.update(ok=True, losses=losses, step_seconds=times,
                      peak_reserved=torch.cuda.max_memory_reserved(),
                      peak_allocated=torch.cuda.max_memory_allocated())
    except RuntimeError as exc:
        if "out of memory" not in str(exc):
            raise
        result.update(ok=False, error=str(exc).splitlines()[0])
    print(json.dumps(result))


# ------------------------------------------------------------------ parent


def run_worker(model, allocator, batch, steps, warmup, budget=None, timeout=600):
    cmd = [sys.executable, __file__, "--worker", "--model", model, "--allocator", allocator,
           "--batch", str(batch), "--steps", str(steps), "--warmup", str(warmup)]
    if budget:
        cmd += ["--budget", budget]
    env = dict(os.environ, CUBLAS_WORKSPACE_CONFIG=":4096:8", PYTHONUNBUFFERED="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"ok": False, "error": (proc.stderr or proc.stdout)[-2000:]}
    return json.loads(lines[-1])


def compare(model, steps, warmup):
    batch = MODELS[model][1]["batch"]
    native = run_worker(model, "native", batch, steps, warmup)
    ours = run_worker(model, "vramguard", batch, steps, warmup)
    row = {"model": model, "batch": batch, "steps": steps, "native": native, "vramguard": ours}
    if native.get("ok") and ours.get("ok"):
        tn, tv = statistics.median(native["step_seconds"]), statistics.median(ours["step_seconds"])
        row.update(
            median_step_native_ms=tn * 1e3, median_step_vramguard_ms=tv * 1e3, step_time_ratio=tv / tn,
            peak_reserved_native=native["peak_reserved"], peak_reserved_vramguard=ours["peak_reserved"],
            peak_reserved_ratio=ours["peak_reserved"] / native["peak_reserved"],
            peak_allocated_native=native["peak_allocated"], peak_allocated_vramguard=ours["peak_allocated"],
            max_loss_difference=max(abs(a - b) for a, b in zip(native["losses"], ours["losses"])),
        )
    for side in ("native", "vramguard"):  # keep the JSON small
        row[side] = {k: v for k, v in row[side].items() if k not in ("losses", "step_seconds")}
    return row


def largest_batch(model, allocator, budget, steps=3):
    """Doubling, then bisection, on the batch that trains without an OOM."""
    fits = lambda b: run_worker(model, allocator, b, steps, 1, budget).get("ok", False)  # noqa: E731
    lo, hi = 0, max(1, MODELS[model][1]["batch"] // 4)
    while fits(hi):
        lo, hi = hi, hi * 2
        if hi > 4096:
            return lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--allocator", choices=("native", "vramguard"), help=argparse.SUPPRESS)
    p.add_argument("--batch", type=int)
    p.add_argument("--models", default="resnet18,gpt2")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--budget", default=None)
    p.add_argument("--max-batch", action="store_true")
    p.add_argument("--json")
    args = p.parse_args()
    if args.worker:
        return worker(args)
    rows = []
    for model in args.models.split(","):
        if args.max_batch:
            row = {"model": model, "budget": args.budget,
                   "largest_batch_native": largest_batch(model, "native", args.budget),
                   "largest_batch_vramguard": largest_batch(model, "vramguard", args.budget)}
        else:
            row = compare(model, args.steps, args.warmup)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
