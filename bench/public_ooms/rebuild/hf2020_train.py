"""A language model of transformers 2.x/3.x (2020) trained for a few steps as that
time's examples did, from the library's own modules: --transformers DIR is the
release's package folder (its wheel unpacked), imported without its __init__ (which
needs that time's tokenizers, for which this Python has no wheel; no model module
uses it). The model class is built from its config (random weights) and moved to
the GPU; each step is the loop of run_language_modeling.py and of Trainer then:
model(input_ids, labels=labels), loss.backward(), clip_grad_norm_(1.0), the
library's own AdamW, scheduler, zero_grad. Random tokens of the stated batch and
length.

    python hf2020_train.py --transformers DIR --model GPT2LMHeadModel --config GPT2Config --batch 4 --seq 1024
"""
import argparse
import ast
import importlib
import os
import sys
import types

import torch

from config_args import config_kwargs


def stub_s3_clients():
    """transformers 2.x's file_utils imports boto3 and botocore for downloads from S3, which a
    model built from its config never makes: empty stand-ins where they are not installed."""
    try:
        import boto3  # noqa: F401
        return
    except ImportError:
        pass
    sys.modules["boto3"] = types.ModuleType("boto3")
    for name, attr in (("botocore", None), ("botocore.config", "Config"), ("botocore.exceptions", "ClientError")):
        module = types.ModuleType(name)
        if attr:
            setattr(module, attr, type(attr, (Exception,), {}))
        sys.modules[name] = module


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--transformers", required=True, help="folder holding the release's transformers/")
    p.add_argument("--module", required=True, help="modeling_gpt2, modeling_roberta, ...")
    p.add_argument("--model", required=True)
    p.add_argument("--config", required=True, help="the config class (in configuration_<name>)")
    p.add_argument("--set", nargs="*", default=[], help="config key=value")
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--seq", type=int, required=True)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--labels-arg", default="labels", help="'labels', or 'masked_lm_labels'/'lm_labels' of 2.x")
    p.add_argument("--steps", type=int, default=3)
    a = p.parse_args()
    folder = os.path.join(os.path.abspath(a.transformers), "transformers")
    pkg = types.ModuleType("transformers")
    pkg.__path__ = [folder]
    with open(os.path.join(folder, "__init__.py")) as f:
        pkg.__version__ = next(ast.literal_eval(line.split("=", 1)[1]) for line in f
                               if line.startswith("__version__"))
    sys.modules["transformers"] = pkg
    stub_s3_clients()
    modeling = importlib.import_module(f"transformers.{a.module}")
    config_module = importlib.import_module("transformers." + a.module.replace("modeling_", "configuration_"))
    optimization = importlib.import_module("transformers.optimization")
    config = getattr(config_module, a.config)(**config_kwargs(a.set))
    model = getattr(modeling, a.model)(config).to("cuda")
    model.train()
    decay = [p for n, p in model.named_parameters() if not any(nd in n for nd in ("bias", "LayerNorm.weight"))]
    rest = [p for n, p in model.named_parameters() if any(nd in n for nd in ("bias", "LayerNorm.weight"))]
    optimizer = optimization.AdamW([{"params": decay, "weight_decay": 0.0}, {"params": rest, "weight_decay": 0.0}],
                                   lr=a.lr, eps=1e-8)
    scheduler = optimization.get_linear_schedule_with_warmup(optimizer, num_warmup_steps=0, num_training_steps=100)
    for _ in range(a.steps):
        ids = torch.randint(0, config.vocab_size, (a.batch, a.seq), device="cuda")
        loss = model(ids, **{a.labels_arg: ids})[0]
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        model.zero_grad()


if __name__ == "__main__":
    main()
