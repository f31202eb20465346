"""A tiny training loop with nothing but PyTorch: an MLP on random data.

    python examples/train_mlp.py --batch 256
    python -m vramguard dryrun --gpu T4 examples/train_mlp.py --batch 256

Its memory: the weights, AdamW's two moments, the gradients, and
activations that grow with --batch and --hidden.
"""
import argparse

import torch
from torch import nn


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--inputs", type=int, default=1024)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()

    device = "cuda" if torch.cuda.is_available() else "cpu"
    widths = [args.inputs] + [args.hidden] * args.layers
    layers = []
    for a, b in zip(widths, widths[1:]):
        layers += [nn.Linear(a, b), nn.GELU()]
    model = nn.Sequential(*layers, nn.Linear(widths[-1], args.classes)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    params = sum(p.numel() for p in model.parameters())
    print(f"{params / 1e6:.1f}M parameters, batch {args.batch}, on {device}")

    for step in range(args.steps):
        x = torch.randn(args.batch, args.inputs, device=device)
        y = torch.randint(0, args.classes, (args.batch,), device=device)
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=device == "cuda"):
            loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        print(f"step {step + 1}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
