"""The same small training loop under four allocators, each in its own
process (an allocator cannot be swapped once used):

    native              PyTorch's caching allocator
    native+expandable   the same with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    vramguard-segments  vramguard.install(arena=False)
    vramguard-arena     vramguard.install(arena=True)

    python tests/gpu/arena_side_by_side.py --steps 60 --json out.json

The loop is a small CNN whose batch size changes every step (the case
expandable segments were made for: blocks a little larger than the last
ones). Per allocator: peak reserved, peak allocated, device allocations
and frees as the allocator counts them (cudaMalloc/cudaFree for
segments, page maps/unmaps for expandable segments and the arena), and
the median step time. Without a GPU it says so and exits 0.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

MiB = 1 << 20
MARK = "@@side-by-side@@"
ALLOCATORS = ("native", "native+expandable", "vramguard-segments", "vramguard-arena")


# ------------------------------------------------------------------ worker


def build(torch, width):
    nn = torch.nn
    model = nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
        nn.Conv2d(width, 2 * width, 3, padding=1, stride=2), nn.BatchNorm2d(2 * width), nn.ReLU(),
        nn.Conv2d(2 * width, 4 * width, 3, padding=1, stride=2), nn.BatchNorm2d(4 * width), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4 * width, 10),
    ).cuda()
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


def counters(torch, allocator):
    """Device allocations and frees in the allocator's own terms."""
    s = torch.cuda.memory_stats()
    out = {"device_allocs": s.get("num_device_alloc"), "device_frees": s.get("num_device_free")}
    if allocator.startswith("vramguard"):
        import vramguard

        v = vramguard.stats(0)
        out.update(maps=v.get("num_maps"), unmaps=v.get("num_unmaps"), runs_on=v["allocator"])
    return out


def worker(allocator, steps, warmup, batch, width):
    import torch

    if allocator.startswith("vramguard"):
        import vramguard

        vramguard.install(arena=allocator == "vramguard-arena")
    torch.manual_seed(0)
    model, opt = build(torch, width)
    times, losses = [], []
    for step in range(warmup + steps):
        n = batch - 16 + (step * 7) % 33          # 48..80 for batch 64: never the same twice in a row
        x = torch.randn(n, 3, 96, 96, device="cuda")
        y = torch.randint(0, 10, (n,), device="cuda")
        torch.cuda.synchronize()
        start = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        if step >= warmup:
            times.append(time.perf_counter() - start)
            losses.append(loss.item())
    out = {
        "allocator": allocator,
        "peak_reserved": torch.cuda.max_memory_reserved(),
        "peak_allocated": torch.cuda.max_memory_allocated(),
        "median_step_ms": 1000 * statistics.median(times),
        "last_loss": losses[-1],
    }
    out.update(counters(torch, allocator))
    torch.cuda.empty_cache()
    out["after_empty_cache"] = counters(torch, allocator)
    print(MARK + json.dumps(out))


# ------------------------------------------------------------------ driver


def run_one(allocator, args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMGUARD_")}
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if allocator == "native+expandable":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    cmd = [sys.executable, __file__, "--worker", allocator, "--steps", str(args.steps),
           "--warmup", str(args.warmup), "--batch", str(args.batch), "--width", str(args.width)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(MARK)]
    if proc.returncode != 0 or not lines:
        return {"allocator": allocator, "error": (proc.stderr or proc.stdout).strip().splitlines()[-1:]}
    return json.loads(lines[-1][len(MARK):])


def table(results):
    rows = ["| allocator | peak reserved MiB | peak allocated MiB | device allocs / frees | "
            "maps / unmaps | median step ms | runs on |",
            "|---|---:|---:|---:|---:|---:|---|"]
    for r in results:
        if "error" in r:
            rows.append(f"| {r['allocator']} | failed: {' '.join(r['error'])} | | | | | |")
            continue
        maps = f"{r['maps']} / {r['unmaps']}" if r.get("maps") is not None else "-"
        rows.append(f"| {r['allocator']} | {r['peak_reserved'] / MiB:.1f} | {r['peak_allocated'] / MiB:.1f} | "
                    f"{r['device_allocs']} / {r['device_frees']} | {maps} | {r['median_step_ms']:.2f} | "
                    f"{r.get('runs_on', 'PyTorch')} |")
    return "\n".join(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--json")
    ap.add_argument("--worker", choices=ALLOCATORS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.steps, args.warmup, args.batch, args.width)
        return 0
    try:
        import torch
    except ImportError:
        print("no PyTorch here: nothing to compare")
        return 0
    if not torch.cuda.is_available():
        print("no CUDA GPU here: nothing to compare")
        return 0
    results = [run_one(a, args) for a in ALLOCATORS]
    print(table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
