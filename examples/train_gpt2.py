"""GPT-2 (124M, transformers' GPT2Config(), random weights: nothing is
downloaded) trained for a few steps on random tokens, with bf16 autocast
and AdamW.

    python examples/train_gpt2.py --batch 8 --seq 1024
    python -m vramguard dryrun --gpu T4 examples/train_gpt2.py --batch 8
    python -m vramguard dryrun --gpu T4 --sweep BATCH=1,2,4,8,16 examples/train_gpt2.py --batch {BATCH}

--layers and --embd make it smaller (the tests use a two-layer model).
"""
import argparse

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--layers", type=int, help="transformer blocks (default GPT-2's 12)")
    parser.add_argument("--embd", type=int,
                        help="embedding width, a multiple of its 12 heads (default GPT-2's 768)")
    parser.add_argument("--checkpointing", action="store_true", help="gradient checkpointing")
    args = parser.parse_args()

    config = GPT2Config()
    if args.layers:
        config.n_layer = args.layers
    if args.embd:
        config.n_embd = args.embd
    config.n_positions = max(config.n_positions, args.seq)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = GPT2LMHeadModel(config).to(device)
    if args.checkpointing:
        model.gradient_checkpointing_enable()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    print(f"GPT-2 {model.num_parameters() / 1e6:.0f}M parameters, batch {args.batch} x {args.seq} tokens, "
          f"on {device}")

    for step in range(args.steps):
        tokens = torch.randint(0, config.vocab_size, (args.batch, args.seq), device=device)
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=device == "cuda"):
            loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        print(f"step {step + 1}: loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
