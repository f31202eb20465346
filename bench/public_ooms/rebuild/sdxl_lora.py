"""diffusers' SDXL LoRA text-to-image script (examples/text_to_image/train_text_to_image_lora_sdxl.py)
run unchanged from a diffusers source folder (--diffusers), on Stable Diffusion XL base 1.0's
components built from their published configs, with no weights, and on a dataset folder of
random images with a caption column.

What stands in, at the libraries' own API, before the script starts (as in dreambooth.py):
- each component's from_pretrained returns the module built from its published config on
  uninitialised host memory, never read, in the dtype the script then moves it with
  (.to(device, dtype=weight_dtype): the UNet, both text encoders, and the VAE when
  --pretrained_vae_model_name_or_path names one, as the fp16-fix VAE does): the same
  allocations on the GPU, without converting GBs of host memory first;
- AutoTokenizer's from_pretrained returns stand-ins whose ids have the real ones' shape (the
  script pads every caption to the tokenizers' 77);
- the model folder holds what the script reads itself: the text encoders' configs (it picks
  their classes from them) and the scheduler's.

The dataset is real: --images RGB images of --size pixels a side and a metadata.jsonl with a
"text" caption each, which the day's `datasets` loads as an image folder (--dataset_name). The
script resizes and crops every image to --resolution, so their size changes only the
size-conditioning values, not a shape.

    python sdxl_lora.py --diffusers DIR --images 2 --size 1024 -- --resolution=1024 ...
"""
import json
import os
import runpy
import sys

import numpy as np
import transformers

from dreambooth import CLIP_G_TEXT
from flux_configs import CLIP_TEXT
from standins import MIXED, PaddedIds, built, mixed_precision, script_arguments

# stabilityai/stable-diffusion-xl-base-1.0's unet/config.json (the values that differ from
# UNet2DConditionModel's defaults), as copied in several public projects
UNET = dict(sample_size=128, in_channels=4, out_channels=4, down_block_types=(
    "DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"), up_block_types=(
    "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"), block_out_channels=(320, 640, 1280),
    layers_per_block=2, attention_head_dim=(5, 10, 20), transformer_layers_per_block=(1, 2, 10),
    cross_attention_dim=2048, use_linear_projection=True, addition_embed_type="text_time",
    addition_embed_type_num_heads=64, addition_time_embed_dim=256, projection_class_embeddings_input_dim=2816,
    norm_num_groups=32, norm_eps=1e-5, act_fn="silu", flip_sin_to_cos=True, freq_shift=0)
# its vae/config.json; madebyollin/sdxl-vae-fp16-fix has the same architecture, without the upcast
VAE = dict(in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(128, 256, 512, 512),
           down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
           layers_per_block=2, norm_num_groups=32, act_fn="silu", sample_size=1024, scaling_factor=0.13025)
VAE_FP16_FIX = dict(VAE, force_upcast=False)
# its scheduler/scheduler_config.json, what of it the DDPM scheduler the script loads takes
SCHEDULER = dict(num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                 clip_sample=False, prediction_type="epsilon", steps_offset=1, timestep_spacing="leading",
                 sample_max_value=1.0)
SCRIPT = os.path.join("examples", "text_to_image", "train_text_to_image_lora_sdxl.py")
# the text encoders: their subfolders, classes (the script picks them from the configs) and configs
ENCODERS = {"text_encoder": (transformers.CLIPTextModel, CLIP_TEXT),
            "text_encoder_2": (transformers.CLIPTextModelWithProjection, CLIP_G_TEXT)}


def stand_in(mixed):
    """The components' and the tokenizers' from_pretrained replaced (see the module's docstring);
    every component moved by the script in weight_dtype, the mixed precision's."""
    import diffusers

    dtype = MIXED[mixed]
    for cls, config in ENCODERS.values():
        cls.from_pretrained = built({None: (lambda cls=cls, config=config: cls(transformers.CLIPTextConfig(**config)),
                                            dtype)})
    diffusers.UNet2DConditionModel.from_pretrained = built({None: (lambda: diffusers.UNet2DConditionModel(**UNET),
                                                                   dtype)})
    diffusers.AutoencoderKL.from_pretrained = built({None: (lambda: diffusers.AutoencoderKL(**VAE_FP16_FIX), dtype)})
    transformers.AutoTokenizer.from_pretrained = classmethod(lambda cls, *a, **k: PaddedIds(77))


def model_folder(root):
    """What the script reads of the model's folder itself: the text encoders' configs, the
    scheduler's, and a folder for the fp16-fix VAE (--pretrained_vae_model_name_or_path)."""
    import diffusers

    folder = os.path.join(root, "model")
    for sub, (cls, config) in ENCODERS.items():
        config = transformers.CLIPTextConfig(**config)
        config.architectures = [cls.__name__]
        config.save_pretrained(os.path.join(folder, sub))
    diffusers.DDPMScheduler(**SCHEDULER).save_config(os.path.join(folder, "scheduler"))
    os.makedirs(os.path.join(folder, "vae-fp16-fix"), exist_ok=True)
    return folder


def image_folder(root, count, size):
    """`count` random RGB images of `size` pixels a side, each with a caption in the "text"
    column: what `datasets` loads as an image folder (its metadata file is read only beside a
    split's files, here train/)."""
    from PIL import Image

    folder = os.path.join(root, "images")
    train = os.path.join(folder, "train")
    os.makedirs(train, exist_ok=True)
    rng = np.random.default_rng(0)
    with open(os.path.join(train, "metadata.jsonl"), "w") as f:
        for i in range(count):
            Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(
                os.path.join(train, f"{i}.png"))
            f.write(json.dumps({"file_name": f"{i}.png", "text": "a photo of a person"}) + "\n")
    return folder


def main():
    a, rest, root = script_arguments("the images of the dataset")
    # no network: the hub and the datasets' cache offline, in the run's folder
    os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
                      HF_DATASETS_CACHE=os.path.join(root, "datasets-cache"))
    stand_in(mixed_precision(rest))
    folder = model_folder(root)
    args = [f"--pretrained_model_name_or_path={folder}",
            f"--pretrained_vae_model_name_or_path={os.path.join(folder, 'vae-fp16-fix')}",
            f"--dataset_name={image_folder(root, a.images, a.size)}",
            f"--output_dir={os.path.join(root, 'out')}", *rest]
    script = os.path.join(os.path.abspath(a.diffusers), SCRIPT)
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
