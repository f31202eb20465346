"""A program's own training script run unchanged from its source folder (--src DIR,
the repository at the report's commit; --script its path there), with its data
loader's batches replaced by random tokens of the shapes it asks for: --loader
names the module and function (module:function) whose (data_path, batch_size,
context_length, device) batches are made up here, so no dataset is read.

    python program_script.py --src DIR --script scripts/train_transformer.py \
        --loader data_loader.data_loader:get_batch_iterator --vocab 50304
"""
import argparse
import os
import runpy
import sys
import types

import torch


def random_batches(vocab):
    def get_batch_iterator(data_path, batch_size, context_length, device="cpu"):
        while True:
            x = torch.randint(0, vocab, (batch_size, context_length + 1))
            yield x[:, :-1].to(device), x[:, 1:].to(device)

    return get_batch_iterator


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--src", required=True)
    p.add_argument("--script", required=True)
    p.add_argument("--loader", required=True, help="module:function of the program's batch iterator")
    p.add_argument("--vocab", type=int, required=True)
    a, rest = p.parse_known_args()
    src = os.path.abspath(a.src)
    module_name, function = a.loader.split(":")
    parts = module_name.split(".")
    for i in range(1, len(parts)):  # the packages above it, from the source folder
        name = ".".join(parts[:i])
        pkg = types.ModuleType(name)
        pkg.__path__ = [os.path.join(src, *parts[:i])]
        sys.modules[name] = pkg
    loader = types.ModuleType(module_name)
    setattr(loader, function, random_batches(a.vocab))
    sys.modules[module_name] = loader
    os.chdir(src)
    sys.path.insert(0, src)
    sys.argv = [os.path.join(src, a.script), *rest]
    runpy.run_path(os.path.join(src, a.script), run_name="__main__")


if __name__ == "__main__":
    main()
