"""A model whose code ships with it (a Hugging Face remote-code model, its modeling
file as the model's own repository publishes it) moved onto the GPU whole, as
`.cuda()` moves it: Module._apply's order (a module's children first, then its own
parameters and buffers), every tensor in the model's dtype. The model is built on
the meta device from its config (no weights on the host; tensors the model's code
makes on the CPU itself, as torch's skip_init does, stay uninitialised and are never
read), its weights tied as from_pretrained ties them (tie_weights: an output layer
tied to the input embeddings is one tensor), then given GPU memory in that order,
a tensor already there (a tied one, met twice) kept as .cuda() keeps it, so the GPU
sees the allocations .cuda() makes.

A modeling file that imports its config relatively (`from .configuration_x import`,
as Hugging Face's remote code does) is imported as a module of a package (--package)
whose folders are the --code folders, as the Hub's loader makes one of the model's
files.

    python model_code_to_cuda.py --code DIR --module modeling_internlm --model InternLMForCausalLM \\
        --config-module configuration_internlm --config InternLMConfig --dtype fp32
"""
import argparse
import importlib
import sys

import torch

from bare_package import bare_package
from config_args import DTYPES, config_kwargs



def code_class(folders, package, module, name):
    """The class `name` of the model's file `module` in `folders`: as a module of `package`
    whose folders they are (a relative import resolves among them), else from sys.path."""
    if package:
        bare_package(package, folders)
        return getattr(importlib.import_module(f"{package}.{module}"), name)
    sys.path[:0] = [f for f in folders if f not in sys.path]
    return getattr(importlib.import_module(module), name)


def move_as_cuda_does(model, dtype):
    """Every tensor of the model onto the GPU in Module._apply's order, as .cuda() moves
    it: a parameter met a second time (a tied weight) gets the memory it got the first
    time, a buffer met twice new memory each time. (.cuda() keeps a tie by swapping a CPU
    parameter's data in place, and replaces buffers; a meta parameter cannot be swapped
    so, and is replaced, hence the memo.)"""
    moved = {}  # id -> (the parameter met, its GPU memory); the parameter held so its id stays its own

    def move(t):
        if t.is_cuda:
            return t
        if not isinstance(t, torch.nn.Parameter):
            return torch.empty_like(t, device="cuda")
        if id(t) not in moved:
            moved[id(t)] = (t, torch.empty_like(t, device="cuda"))
        return moved[id(t)][1]

    model.to(dtype)._apply(move)
    return model


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--code", required=True, nargs="+", help="the folders holding the model's modeling and config files")
    p.add_argument("--package", help="import the modules as this package's, its folders the --code folders")
    p.add_argument("--module", required=True)
    p.add_argument("--model", required=True, help="the model class in --module")
    p.add_argument("--config-module", required=True)
    p.add_argument("--config", required=True, help="the config class in --config-module")
    p.add_argument("--set", nargs="*", default=[], help="key=value of the model's published config")
    p.add_argument("--dtype", choices=DTYPES, default="fp32")
    a = p.parse_args()
    config = code_class(a.code, a.package, a.config_module, a.config)(**config_kwargs(a.set))
    model_class = code_class(a.code, a.package, a.module, a.model)
    with torch.device("meta"):
        model = model_class(config)
    if hasattr(model, "tie_weights"):  # from_pretrained ties them before anything moves
        model.tie_weights()
    move_as_cuda_does(model, DTYPES[a.dtype])
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
