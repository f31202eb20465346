"""diffusers' DreamBooth scripts (examples/dreambooth/: train_dreambooth_lora_flux.py,
train_dreambooth_sd3.py) run unchanged from a diffusers source folder (--diffusers), on the
model's components (--model: FLUX.1-dev, SD3-medium) built from their published configs, with no
weights.

What stands in, at the libraries' own API, before the script starts:
- each component's from_pretrained returns the module built from its published config on
  uninitialised host memory, never read, in the dtype from_pretrained gives it (torch_dtype,
  else fp32), or, loaded by the script itself without one and then moved with .to(device,
  dtype), in that dtype: the same allocations on the GPU (PyTorch converts a host-to-device
  copy's dtype on the host), without converting tens of GB of host memory first;
- the tokenizers' from_pretrained return stand-ins whose ids have the real ones' shapes
  (standins.PaddedIds: the scripts pad every prompt to a fixed length);
- the model folder holds only what the scripts read themselves: the text encoders' configs (they
  pick their classes from them), the scheduler's, and model_index.json (validation's pipeline);
- a pipeline's save_pretrained (the SD3 script saves the trained pipeline, then loads it again
  for a last validation) writes the model folder's files, not the weights: the load again
  stands in and reads none, and writing a GPU tensor reads it back to the host, allocating
  nothing on the GPU (the FLUX script saves its LoRA weights only, as it does on a card);
- the instance images (--images, --size) are random pixels, as many as the row says;
- the scripts find each sampled timestep's index in the schedule with
  `(schedule == t).nonzero().item()` on the GPU: a phantom reads zeros back, so it would find
  none. Every empty nonzero() of a phantom tensor with elements answers index 0 here (for the
  timesteps, the first sigma: which one is used sizes nothing), counted and said on stderr at
  the end.

    python dreambooth.py --model flux-dev --diffusers DIR --images 5 --size 512 -- --mixed_precision=bf16 ...
"""
import json
import os
import runpy
import shutil
import sys

import numpy as np
import torch
import transformers

from flux_configs import CLIP_TEXT, T5_XXL, TRANSFORMER, VAE, VARIANTS
from standins import MIXED, PaddedIds, built, mixed_precision, script_arguments

# SD3-medium's published configs (stabilityai/stable-diffusion-3-medium-diffusers, its subfolders'
# config.json, as copied in several public projects); CLIP-L as FLUX's, with its projection.
SD3_TRANSFORMER = dict(sample_size=128, patch_size=2, in_channels=16, num_layers=24, attention_head_dim=64,
                       num_attention_heads=24, joint_attention_dim=4096, caption_projection_dim=1536,
                       pooled_projection_dim=2048, out_channels=16, pos_embed_max_size=192)
SD3_VAE = dict(VAE, scaling_factor=1.5305, shift_factor=0.0609)
CLIP_G_TEXT = dict(vocab_size=49408, hidden_size=1280, intermediate_size=5120, projection_dim=1280,
                   num_hidden_layers=32, num_attention_heads=20, max_position_embeddings=77, hidden_act="gelu",
                   layer_norm_eps=1e-5)


def clip(config, projection):
    cls = transformers.CLIPTextModelWithProjection if projection else transformers.CLIPTextModel
    return cls, lambda: cls(transformers.CLIPTextConfig(**config)), transformers.CLIPTextConfig(**config)


def t5():
    return (transformers.T5EncoderModel, lambda: transformers.T5EncoderModel(transformers.T5Config(**T5_XXL)),
            transformers.T5Config(**T5_XXL))


class Model:
    """One model's components for a DreamBooth script: `script` under examples/dreambooth,
    `pipeline` (model_index.json's class), `encoders` (subfolder -> (class, builder, config)),
    `tokenizers` (subfolder -> (class, ids' length)), `denoiser` and `vae` ((class, builder)),
    `scheduler` (its arguments), `moved` (a component the script moves with a dtype -> that dtype,
    or "weight_dtype", the mixed precision's)."""

    def __init__(self, script, pipeline, encoders, tokenizers, denoiser, vae, scheduler, moved):
        self.script, self.pipeline, self.encoders, self.tokenizers = script, pipeline, encoders, tokenizers
        self.denoiser, self.vae, self.scheduler, self.moved = denoiser, vae, scheduler, moved


def flux_dev():
    import diffusers  # the report's own (its source folder), imported only where a run needs it

    return Model(
        "train_dreambooth_lora_flux.py", "FluxPipeline",
        {"text_encoder": clip(CLIP_TEXT, False), "text_encoder_2": t5()},
        {"tokenizer": (transformers.CLIPTokenizer, 77), "tokenizer_2": (transformers.T5TokenizerFast, 512)},
        (diffusers.FluxTransformer2DModel,
         lambda: diffusers.FluxTransformer2DModel(guidance_embeds=VARIANTS["dev"]["guidance_embeds"], **TRANSFORMER)),
        (diffusers.AutoencoderKL, lambda: diffusers.AutoencoderKL(**VAE)), VARIANTS["dev"]["scheduler"],
        # the vae, the transformer and both text encoders: .to(device, dtype=weight_dtype)
        {"vae": "weight_dtype", "denoiser": "weight_dtype", "text_encoder": "weight_dtype",
         "text_encoder_2": "weight_dtype"})


def sd3_medium():
    import diffusers

    return Model(
        "train_dreambooth_sd3.py", "StableDiffusion3Pipeline",
        {"text_encoder": clip(CLIP_TEXT, True), "text_encoder_2": clip(CLIP_G_TEXT, True), "text_encoder_3": t5()},
        {"tokenizer": (transformers.CLIPTokenizer, 77), "tokenizer_2": (transformers.CLIPTokenizer, 77),
         "tokenizer_3": (transformers.T5TokenizerFast, 512)},
        (diffusers.SD3Transformer2DModel, lambda: diffusers.SD3Transformer2DModel(**SD3_TRANSFORMER)),
        (diffusers.AutoencoderKL, lambda: diffusers.AutoencoderKL(**SD3_VAE)), dict(shift=3.0),
        # the vae: .to(device, dtype=fp32); the text encoders: .to(device, dtype=weight_dtype); the
        # transformer, trained, stays in from_pretrained's fp32
        {"vae": torch.float32, "text_encoder": "weight_dtype", "text_encoder_2": "weight_dtype",
         "text_encoder_3": "weight_dtype"})


MODELS = {"flux-dev": flux_dev, "sd3-medium": sd3_medium}


def stand_in(model, mixed):
    """The components' and tokenizers' from_pretrained replaced (see the module's docstring);
    SD3's two CLIPs share a class, told apart by their subfolders."""
    def dtype(name):
        moved = model.moved.get(name)
        return MIXED[mixed] if moved == "weight_dtype" else moved

    makers = {}
    for name, (cls, make, _) in model.encoders.items():
        makers.setdefault(cls, {})[name] = (make, dtype(name))
    for role, sub in (("denoiser", "transformer"), ("vae", "vae")):
        cls, make = getattr(model, role)
        makers.setdefault(cls, {})[sub] = (make, dtype(role))
    for cls, by_subfolder in makers.items():
        cls.from_pretrained = built(by_subfolder)
    for cls, length in model.tokenizers.values():
        cls.from_pretrained = classmethod(lambda cls, *a, _length=length, **k: PaddedIds(_length))


def first_index_for_empty_nonzero():
    """Tensor.nonzero() on the GPU answering [[0, ...]] where the phantom's zeros found nothing;
    returns the count of such answers (a list of one, kept up to date)."""
    answered = [0]
    nonzero = torch.Tensor.nonzero

    def patched(self, *args, **kwargs):
        found = nonzero(self, *args, **kwargs)
        if self.is_cuda and not kwargs.get("as_tuple") and found.numel() == 0 and self.numel() > 0:
            answered[0] += 1
            return torch.zeros((1, self.dim()), dtype=torch.long, device=self.device)
        return found

    torch.Tensor.nonzero = patched
    return answered


def model_folder(root, model):
    """What the script reads of the model's folder itself: the text encoders' configs, the
    scheduler's, model_index.json, and a folder for each other component."""
    import diffusers

    folder = os.path.join(root, "model")
    index = {"_class_name": model.pipeline, "_diffusers_version": diffusers.__version__,
             "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
             "transformer": ["diffusers", model.denoiser[0].__name__], "vae": ["diffusers", "AutoencoderKL"]}
    for sub, (cls, _, config) in model.encoders.items():
        config.architectures = [cls.__name__]
        config.save_pretrained(os.path.join(folder, sub))
        index[sub] = ["transformers", cls.__name__]
    for sub, (cls, _) in model.tokenizers.items():
        index[sub] = ["transformers", cls.__name__]
    for sub in [*model.tokenizers, "transformer", "vae"]:  # a pipeline loads what has a folder
        os.makedirs(os.path.join(folder, sub), exist_ok=True)
    diffusers.FlowMatchEulerDiscreteScheduler(**model.scheduler).save_config(os.path.join(folder, "scheduler"))
    with open(os.path.join(folder, "model_index.json"), "w") as f:
        json.dump(index, f)
    return folder


def instance_images(root, count, size):
    from PIL import Image

    folder = os.path.join(root, "instance")
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(count):
        pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(os.path.join(folder, f"{i}.png"))
    return folder


def main():
    a, rest, root = script_arguments("the instance images in the report's dataset",
                                     [("--model", dict(choices=MODELS, required=True))])
    model = MODELS[a.model]()
    stand_in(model, mixed_precision(rest))
    folder = model_folder(root, model)
    import diffusers

    diffusers.DiffusionPipeline.save_pretrained = (
        lambda self, save_directory, *a, **k: shutil.copytree(folder, save_directory, dirs_exist_ok=True))
    args = [f"--pretrained_model_name_or_path={folder}",
            f"--instance_data_dir={instance_images(root, a.images, a.size)}",
            f"--output_dir={os.path.join(root, 'out')}", *rest]
    script = os.path.join(os.path.abspath(a.diffusers), "examples", "dreambooth", model.script)
    sys.argv = [script, *args]
    answered = first_index_for_empty_nonzero()
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        print(f"dreambooth.py: {answered[0]} empty nonzero() of a phantom tensor answered index 0", file=sys.stderr)


if __name__ == "__main__":
    main()
