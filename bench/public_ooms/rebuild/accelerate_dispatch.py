"""A model placed by accelerate's big-model loading, as a program of 2022-2023 did it
(--libs: the transformers and accelerate of its day): the config, the model built
under init_empty_weights by AutoModelForCausalLM.from_config, a device map from
infer_auto_device_map (the devices' free memory, no max_memory), then
load_checkpoint_and_dispatch of the checkpoint save_pretrained wrote, converting every
tensor to the dtype as it goes to its device, then one generate call; the dtype bf16 where
the card supports it, else fp16 (--dtype auto, as mallorbc/GPTNeoX20B_HuggingFace's
main.py chooses).

What stands in:
- the checkpoint's files: an index of the shards transformers' own shard_checkpoint
  makes of the model's state dict (names, shapes, the saved dtype, in its order), and
  torch.load of a shard returning that shard's tensors uninitialised (a phantom never
  reads their values), so accelerate moves the same tensors in the same order;
- the tokenizer: the prompt's ids (--prompt-tokens of them, zeros);
- tokenizers, hidden: the transformers of 2022 requires a tokenizers below 0.13, which
  has no build for this Python, and the rebuild never tokenizes.

    python accelerate_dispatch.py --libs DIR --arch gpt_neox --config hidden_size=6144 ... --no-split GPTNeoXLayer
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

import torch

from config_args import DTYPES, config_kwargs



def write_index(model, folder, saved_dtype, shard_checkpoint):
    """The files save_pretrained writes (the shards, empty here, and their index when
    there are several), and each shard's tensors (name, shape, dtype: floating tensors
    in the saved dtype, others as they are)."""
    shapes = {}
    for name, t in model.state_dict().items():
        dtype = saved_dtype if t.dtype.is_floating_point else t.dtype
        shapes[name] = torch.empty(t.shape, dtype=dtype, device="meta")
    shards, index = shard_checkpoint(shapes)
    if index is not None:  # one file has none, as save_pretrained writes none for it
        with open(os.path.join(folder, "pytorch_model.bin.index.json"), "w") as f:
            json.dump(index, f)
    contents = {}
    for filename, shard in shards.items():
        path = os.path.join(folder, filename)
        open(path, "wb").close()
        contents[os.path.realpath(path)] = [(name, t.shape, t.dtype) for name, t in shard.items()]
    return contents


def load_stand_in(contents, real_load):
    def load(f, *args, **kwargs):
        key = os.path.realpath(f) if isinstance(f, (str, os.PathLike)) else None
        if key not in contents:
            return real_load(f, *args, **kwargs)
        return {name: torch.empty(shape, dtype=dtype) for name, shape, dtype in contents[key]}
    return load


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--libs", required=True, help="the folder holding the transformers and accelerate of the day")
    p.add_argument("--arch", required=True, help="the config's model_type (transformers' AutoConfig.for_model)")
    p.add_argument("--config", nargs="*", default=[], help="key=value of the model's published config")
    p.add_argument("--no-split", nargs="*", default=[], help="no_split_module_classes")
    p.add_argument("--dtype", choices=("auto", *DTYPES), default="auto", help="the map's and the load's dtype")
    p.add_argument("--saved-dtype", choices=DTYPES, default="fp32", help="the checkpoint's tensors")
    p.add_argument("--prompt-tokens", type=int, default=8)
    p.add_argument("--max-length", type=int, default=100)
    a = p.parse_args()
    sys.modules["tokenizers"] = None  # find_spec then says it is not installed
    sys.path.insert(0, a.libs)
    from accelerate import infer_auto_device_map, init_empty_weights, load_checkpoint_and_dispatch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_utils import shard_checkpoint

    dtype = DTYPES[a.dtype] if a.dtype != "auto" else \
        torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    config = AutoConfig.for_model(a.arch, **config_kwargs(a.config))
    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config)
    device_map = infer_auto_device_map(model, no_split_module_classes=a.no_split, dtype=dtype)
    print("device map:", device_map if len(device_map) < 8 else
          f"{len(device_map)} entries on {sorted(set(map(str, device_map.values())))}", flush=True)
    folder = tempfile.mkdtemp(dir=os.environ.get("VRAMGUARD_DRYRUN_DIR"))
    try:
        torch.load = load_stand_in(write_index(model, folder, DTYPES[a.saved_dtype], shard_checkpoint), torch.load)
        load_checkpoint_and_dispatch(model, folder, device_map=device_map, offload_folder=None,
                                     offload_state_dict=False, dtype=str(dtype).replace("torch.", ""))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    ids = torch.zeros(1, a.prompt_tokens, dtype=torch.long)
    model.generate(ids.to(0), do_sample=True, max_length=a.max_length, temperature=0.9, top_k=50, top_p=0.9)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
