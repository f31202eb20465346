"""A tiny data-parallel training run for torchrun, on real GPUs or on
phantom ones (csrc/phantom/README.md, "NCCL"):

    torchrun --nproc_per_node 2 examples/ddp_tiny.py            # DDP
    torchrun --nproc_per_node 2 examples/ddp_tiny.py --fsdp     # FSDP2 (fully_shard)

On phantom GPUs, each rank a device of its own:

    VG_FAKECUDA_DEVICES=2 (and the rest of vramguard.phantom.gpu.environ(...))
    torchrun --nproc_per_node 2 examples/ddp_tiny.py

Each rank trains a small MLP for --steps steps with backend nccl and prints
one line, `ddp_tiny {json}`: its rank, device, the model's parameter bytes
(whole, and this rank's shard with --fsdp), and
torch.cuda.max_memory_allocated / max_memory_reserved.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn


def model_for(width, depth):
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 8))


def local_bytes(tensor):
    """A parameter's bytes on this rank: its shard's for a DTensor."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fsdp", action="store_true", help="FSDP2 (fully_shard) instead of DDP")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    dist.init_process_group("nccl", device_id=device)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)

    model = model_for(args.width, args.depth)
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    if args.fsdp:
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        fully_shard(model)  # moves the shards to this rank's device
        wrapped = model
    else:
        model.to(device)
        # init_sync=False: DDP's check that every rank has the same
        # parameters broadcasts their shapes and reads them back, and a
        # phantom GPU's memory reads as zeros (no rank would match).
        wrapped = nn.parallel.DistributedDataParallel(model, device_ids=[local_rank], init_sync=False,
                                                      find_unused_parameters=True)
    torch.cuda.synchronize()
    shard_bytes = sum(local_bytes(p) for p in model.parameters())
    allocated_after_wrap = torch.cuda.memory_allocated()

    opt = torch.optim.SGD(wrapped.parameters(), lr=0.01)
    for _ in range(args.steps):
        x = torch.randn(args.batch, args.width, device=device)
        y = torch.randint(0, 8, (args.batch,), device=device)
        loss = nn.functional.cross_entropy(wrapped(x), y)
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    dist.barrier()

    line = "ddp_tiny " + json.dumps({
        "rank": rank, "world": world, "device": torch.cuda.current_device(), "mode": "fsdp" if args.fsdp else "ddp",
        "steps": args.steps, "param_bytes": param_bytes, "shard_bytes": shard_bytes,
        "allocated_after_wrap": allocated_after_wrap,
        "max_allocated": torch.cuda.max_memory_allocated(), "max_reserved": torch.cuda.max_memory_reserved(),
    })
    # One write, line and newline together: the ranks share torchrun's
    # stdout, and an unbuffered print writes them apart, so two ranks'
    # lines could run into one.
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
    dist.destroy_process_group()
    # The autograd engine's device thread drops the last backward's task
    # (FSDP2's Python callbacks and state in it) once it has the GIL. On a
    # phantom GPU nothing after backward waits without the GIL, so the
    # interpreter could be shutting down by then, and the thread's GIL
    # request then aborts the process (a PyTorch race at exit): this wait
    # lets it finish.
    time.sleep(0.1)


if __name__ == "__main__":
    main()
