"""FastChat's --load-8bit load (fastchat/serve/inference.py load_model): a Hugging Face
causal LM loaded in fp16 on the CPU, then FastChat's own compress_module (--fastchat
DIR: its fastchat/serve/compression.py of the report's commit), which moves each
nn.Linear weight to the GPU in fp16 and compresses it to 8-bit groups there, then
model.to(device) for the rest. The CPU model holds no data: it is built on the meta
device and each tensor is a zero broadcast to its shape, which .to("cuda") copies
out at full size, as the real weights are.

    python fastchat_load.py --fastchat DIR --config hidden_size=4096 ...
"""
import argparse
import importlib.util
import os

import torch
import transformers

from config_args import config_kwargs


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--fastchat", required=True)
    p.add_argument("--config", nargs="*", default=[])
    a = p.parse_args()
    path = os.path.join(os.path.abspath(a.fastchat), "fastchat", "serve", "compression.py")
    spec = importlib.util.spec_from_file_location("fastchat_compression", path)
    compression = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compression)
    config = transformers.LlamaConfig(**config_kwargs(a.config))
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config).to(torch.float16)
    for module in model.modules():
        for name, t in list(module._parameters.items()):
            if t is not None:
                module._parameters[name] = torch.nn.Parameter(
                    torch.zeros((), dtype=t.dtype).expand(t.shape), requires_grad=False)
        for name, t in list(module._buffers.items()):
            if t is not None:
                module._buffers[name] = torch.zeros((), dtype=t.dtype).expand(t.shape)
    with torch.no_grad():
        compression.compress_module(model, "cuda")
        model.to("cuda")
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
