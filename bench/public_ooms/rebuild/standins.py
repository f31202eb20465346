"""What the rebuilds of diffusers' pipelines and scripts stand in with, at the libraries' own
API: a tokenizer whose ids have the real one's shapes, a module on uninitialised host memory,
and a from_pretrained that returns one."""
import argparse
import os
import tempfile

import torch
import transformers


class PaddedIds:
    """A tokenizer stand-in: ids of the shape the real one returns for a short prompt
    (padded to max_length with padding="max_length", a few tokens with "longest")."""

    added_tokens_encoder = {}

    def __init__(self, model_max_length):
        self.model_max_length = model_max_length

    def tokenize(self, text):
        return text.split()

    def __call__(self, prompts, padding="longest", max_length=None, return_tensors="pt", **_):
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        words = max(len(p.split()) for p in prompts) + 2  # with the start and end tokens
        length = max_length if padding == "max_length" else min(words, max_length or words)
        ids = torch.zeros(len(prompts), length, dtype=torch.long)
        return transformers.BatchEncoding({"input_ids": ids, "attention_mask": torch.ones_like(ids)})

    def batch_decode(self, ids, **_):
        return [""] * len(ids)


def on_host(module, dtype):
    """The module built on the meta device, given uninitialised host memory in `dtype`. A
    parameter two modules share (T5's embedding, its encoder's and the model's) stays one, as
    from_pretrained keeps it: moving off the meta device would give each module its own."""
    places = {}
    for owner in module.modules():
        for name, param in owner._parameters.items():
            if param is not None:
                places.setdefault(id(param), []).append((owner, name))
    module = module.to(dtype).to_empty(device="cpu").eval()
    for (first, first_name), *others in places.values():
        for owner, name in others:
            owner._parameters[name] = first._parameters[first_name]
    return module


def built(makers):
    """A from_pretrained that ignores the folder's files and returns, for the subfolder asked (`makers`:
    subfolder -> (builder, dtype); one entry: whatever is asked), the builder's module, built on
    the meta device, on uninitialised host memory: in the torch_dtype asked, else in the dtype the
    script moves it with (its own loads, followed by .to(device, dtype)), else in fp32, what
    from_pretrained gives without one."""
    def from_pretrained(cls, *args, subfolder=None, **kwargs):
        # a pipeline's from_pretrained names the subfolder in the path instead
        subfolder = subfolder or (os.path.basename(os.path.normpath(str(args[0]))) if args else None)
        make, dtype = makers[subfolder] if len(makers) > 1 else next(iter(makers.values()))
        with torch.device("meta"):
            module = make()
        module = on_host(module, kwargs.get("torch_dtype") or dtype or torch.float32)
        return kept_in_fp32(module) if kwargs.get("torch_dtype") == torch.float16 else module

    return classmethod(from_pretrained)


def kept_in_fp32(module):
    """What transformers' from_pretrained does with torch_dtype=float16: the modules a class names
    in _keep_in_fp32_modules (T5's feed-forward output, `wo`) stay fp32."""
    keep = getattr(module, "_keep_in_fp32_modules", None) or ()
    for name, sub in module.named_modules():
        if any(k in name.split(".") for k in keep):
            sub.float()
    return module


#: the dtype of each of accelerate's --mixed_precision values: the scripts' weight_dtype
MIXED = {"fp16": torch.float16, "bf16": torch.bfloat16, "no": torch.float32}


def mixed_precision(args):
    """The script's --mixed_precision (accelerate's default, no, when not given)."""
    for i, arg in enumerate(args):
        if arg.startswith("--mixed_precision="):
            return arg.split("=", 1)[1]
        if arg == "--mixed_precision" and i + 1 < len(args):
            return args[i + 1]
    return "no"


def script_arguments(images_help, extra=()):
    """The arguments of a rebuild that runs a diffusers example script: the source folder, the
    images it makes (how many, their side) and `extra` (flag, add_argument's keywords) pairs; the
    rest, after an optional "--", are the script's own. Returns (the rebuild's, the script's, the
    run's folder)."""
    p = argparse.ArgumentParser()
    for flag, kwargs in extra:
        p.add_argument(flag, **kwargs)
    p.add_argument("--diffusers", required=True, help="a diffusers source folder (examples/ and src/)")
    p.add_argument("--images", type=int, required=True, help=images_help)
    p.add_argument("--size", type=int, required=True, help="their side, in pixels")
    a, rest = p.parse_known_args()
    rest = rest[1:] if rest[:1] == ["--"] else rest
    return a, rest, os.environ.get("VRAMGUARD_DRYRUN_DIR") or tempfile.mkdtemp()

