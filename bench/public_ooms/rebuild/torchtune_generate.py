"""torchtune's generate recipe (recipes/generate.py of the torchtune on the path), its
memory steps in order: the model built by its builder under the recipe's dtype on the
device, the KV caches set up for batch 1 (setup_caches), then the prompt and
max_new_tokens tokens generated. Weights and prompt are random: the phantom
never reads them.

    python torchtune_generate.py --model llama3_1_8b --dtype bf16 --prompt-len 16 --max-new-tokens 300
"""
import argparse
import importlib

import torch
from torchtune import generation, training

from config_args import DTYPES


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="llama3_1_8b", help="a builder in torchtune.models (llama3_1_8b, ...)")
    p.add_argument("--dtype", default="bf16", choices=DTYPES)
    p.add_argument("--no-kv-cache", action="store_true")
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=300)
    args = p.parse_args()
    family = args.model.rsplit("_", 1)[0]
    builder = getattr(importlib.import_module(f"torchtune.models.{family}"), args.model)
    dtype, device = DTYPES[args.dtype], torch.device("cuda")
    with training.set_default_dtype(dtype), device:
        model = builder()
        if not args.no_kv_cache:
            model.setup_caches(batch_size=1, dtype=dtype)
    model.eval()
    prompt = torch.randint(0, 1000, (args.prompt_len,), dtype=torch.int, device=device)
    with torch.no_grad():
        generation.generate(model=model, prompt=prompt, max_generated_tokens=args.max_new_tokens,
                            temperature=0.6, top_k=300, stop_tokens=None)


if __name__ == "__main__":
    main()
