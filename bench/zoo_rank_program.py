"""The zoo's decoder (bench/zoo_models.py: TinyLlama's shape, about 1.1B
parameters, or its small size) trained data-parallel, one process per rank
under torchrun: DDP, or FSDP2 (fully_shard per decoder layer, then the
root). bf16 autocast, gradient checkpointing, AdamW, as the zoo's single-GPU
entry. Meant to be dry-run on phantom GPUs, one per rank:

    python -m vramguard dryrun --gpu A100-40GB --nproc 4 bench/zoo_rank_program.py --fsdp --json-dir DIR

Each rank writes DIR/<allocator>.rank<r>.json: the whole model's parameter
bytes, this rank's (its shards under FSDP), this rank's optimizer state,
its peaks and its host's peak resident memory. Under FSDP the model is
built on the meta device and materialised shard by shard (to_empty), as
FSDP2 programs of this size do; its weights are then uninitialised (a dry
run's kernels compute nothing anyway).
"""
import argparse
import json
import os
import resource
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import zoo_models  # noqa: E402


def local_bytes(tensor):
    """A tensor's bytes on this rank: its shard's for a DTensor."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


def allocator_name():
    """Which allocator this process runs (the dry run chooses it)."""
    if "vramguard" in sys.modules and sys.modules["vramguard"].is_installed():
        return "vramguard"
    if "expandable_segments:true" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "").replace(" ", "").lower():
        return "expandable"
    return "native"


#: Llama-2's published shapes (7B and 70B), for sizing jobs past the zoo's decoder.
LARGE_SHAPES = {
    "7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=32, vocab_size=32000),
    "70b": dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
                num_key_value_heads=8, vocab_size=32000),
}


def _large_config(transformers, shape):
    return transformers.LlamaConfig(max_position_embeddings=4096, **LARGE_SHAPES[shape]), 4096


def build(args, device):
    import transformers
    from torch import nn

    config, seq = (zoo_models._llama_config(transformers, args.size) if args.shape == "zoo"
                   else _large_config(transformers, args.shape))
    seq = args.seq or seq
    if args.fsdp:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        # The large shapes compute in bf16 the way large FSDP2 jobs do, through its
        # mixed-precision policy: under torch.autocast instead, autocast's cache keeps
        # every layer's gathered bf16 weights until the forward ends (measured: 418 MiB
        # per 7B layer), which no 70B job could hold.
        mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
              if args.shape != "zoo" else MixedPrecisionPolicy())
        with torch.device("meta"):
            model = transformers.LlamaForCausalLM(config)
        for layer in model.model.layers:
            fully_shard(layer, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        model.to_empty(device=device)
        wrapped = model
    else:
        with torch.device(device):
            model = transformers.LlamaForCausalLM(config)
        # A phantom GPU's memory reads as zeros, and DDP reads two things
        # back: its first check of the parameters' shapes (init_sync=False
        # skips it) and, after the first step, the bucket order rank 0
        # broadcasts (all zeros: a crash). find_unused_parameters=True keeps
        # the first order, the same buckets of the same sizes in another
        # order, so the memory is DDP's default's.
        wrapped = nn.parallel.DistributedDataParallel(model, device_ids=[device.index], init_sync=False,
                                                      find_unused_parameters=True)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    return model, wrapped, config, seq


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fsdp", action="store_true", help="FSDP2 (fully_shard) instead of DDP")
    parser.add_argument("--size", choices=zoo_models.SIZES, default="full")
    parser.add_argument("--shape", choices=("zoo",) + tuple(LARGE_SHAPES), default="zoo",
                        help="the zoo's decoder at --size, or Llama-2's 7B or 70B shape (FSDP only: "
                             "built on the meta device)")
    parser.add_argument("--seq", type=int, default=None, help="sequence length (default: the shape's)")
    parser.add_argument("--batch", type=int, default=None, help="per rank (default: the zoo's)")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--json-dir", required=True)
    args = parser.parse_args()
    if args.shape != "zoo" and not args.fsdp:
        parser.error("--shape 7b/70b needs --fsdp (a whole 70B model on every rank does not fit any card)")

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    dist.init_process_group("nccl", device_id=device)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)

    model, wrapped, config, seq = build(args, device)
    batch = args.batch or (zoo_models.default_batch("llama-1b", args.size) if args.shape == "zoo" else 1)
    # numel() of a DTensor is the whole parameter's: the model's bytes either way.
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    shard_bytes = sum(local_bytes(p) for p in model.parameters())
    torch.cuda.synchronize()
    allocated_after_wrap = torch.cuda.memory_allocated()

    opt = torch.optim.AdamW(wrapped.parameters(), lr=1e-4, foreach=True)
    bf16 = torch.cuda.get_device_capability(device) >= (8, 0) and args.shape == "zoo"  # else FSDP's policy
    for _ in range(args.steps):
        ids = torch.randint(0, config.vocab_size, (batch, seq), device=device)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            loss = wrapped(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    state_bytes = sum(local_bytes(t) for s in opt.state.values() for t in s.values()
                      if torch.is_tensor(t) and t.is_cuda)
    dist.barrier()

    figures = {
        "rank": rank, "world": world, "mode": "fsdp" if args.fsdp else "ddp", "size": args.size,
        "shape": args.shape,
        "batch_per_rank": batch, "seq": seq, "steps": args.steps, "allocator": allocator_name(),
        "param_bytes": param_bytes, "shard_bytes": shard_bytes, "optimizer_state_bytes": state_bytes,
        "allocated_after_wrap": allocated_after_wrap,
        "max_allocated": torch.cuda.max_memory_allocated(), "max_reserved": torch.cuda.max_memory_reserved(),
        "host_peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }
    os.makedirs(args.json_dir, exist_ok=True)
    path = os.path.join(args.json_dir, f"{figures['allocator']}.rank{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(figures, f)
    os.replace(path + ".tmp", path)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
