"""segment-anything-u-specify's text-prompted instance segmentation of the report's
day (--program: the repository's tree at that commit), the order its
SamClipInsSegmentor builds things in: SAM built by the program's registry with no
checkpoint and moved to the GPU, CLIP built on the CPU, its Conv/Linear/attention
weights halved by the program's convert_weights and moved, the object365 prompts'
tokens moved, then the image, shrunk to fit the program's MAX_INPUT_SIZE, given to
the program's SamAutomaticMaskGenerator under no_grad.

What stands in: SAM's weights (checkpoint=None: the program's torch.load of the
released checkpoint, whose tensors are taken to be CPU tensors as the
segment-anything#351 row takes them, fills the model on the CPU before it moves);
CLIP's weights, which clip.load reads from OpenAI's JIT archive (the model is built
from its shapes, those of the released checkpoint, and halved as build_model does);
the tokens (the tokenizer's int32 [prompts, 77], zeros); the
image (random, of the stated size after the program's resize, which is cv2's);
the `models` and `models.clip` packages' __init__ files, which import the
program's other tools (cv2, ftfy, yaml) and are skipped by loading the two
packages' modules from the tree; timm, which only MobileSAM's TinyViT uses, when
it is not installed.

    python sam_u_specify.py --program DIR --height 1450 --width 2068
"""
import argparse
import os
import sys
import types

import numpy as np
import torch

from bare_package import bare_package

# CLIP ViT-B/32 as build_model reads it from the released checkpoint's state dict
CLIP_VIT_B32 = dict(embed_dim=512, image_resolution=224, vision_layers=12, vision_width=768,
                    vision_patch_size=32, context_length=77, vocab_size=49408, transformer_width=512,
                    transformer_heads=8, transformer_layers=12)


def install_packages(program):
    """`models` and `models.clip` as bare packages over the program's folders, so their
    modules import without the __init__ files' imports of the program's other tools."""
    bare_package("models", [os.path.join(program, "models")])
    bare_package("models.clip", [os.path.join(program, "models", "clip")])


def install_timm_if_missing():
    """timm's three names MobileSAM's TinyViT imports, where timm is not installed."""
    try:
        import timm.models.layers  # noqa: F401
    except ImportError:
        unused = types.SimpleNamespace  # TinyViT's names, never called for vit_h
        layers = types.ModuleType("timm.models.layers")
        layers.DropPath = layers.to_2tuple = layers.trunc_normal_ = unused
        registry = types.ModuleType("timm.models.registry")
        registry.register_model = lambda f: f
        sys.modules.update({"timm": types.ModuleType("timm"), "timm.models": types.ModuleType("timm.models"),
                            "timm.models.layers": layers, "timm.models.registry": registry})


def fitted(height, width, limit):
    """The image's shape after the program's resize to fit limit x limit (its long side
    to the limit, the short side truncated)."""
    if height <= limit and width <= limit:
        return height, width
    ratio = height / width if height > width else width / height
    return (limit, int(limit / ratio)) if height > width else (int(limit / ratio), limit)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--program", required=True, help="segment-anything-u-specify's tree at the report's commit")
    p.add_argument("--height", type=int, required=True)
    p.add_argument("--width", type=int, required=True)
    p.add_argument("--max-input", type=int, default=1280, help="insseg.yaml's MAX_INPUT_SIZE")
    p.add_argument("--prompts", type=int, default=366,
                   help="prompts tokenized at start: obj365-classes.txt's 366 lines")
    p.add_argument("--device", default="cuda")
    a = p.parse_args()
    install_packages(a.program)
    install_timm_if_missing()
    import models.sam as sam_builder
    from models.clip.model import CLIP, convert_weights

    sam = sam_builder.sam_model_registry["vit_h"](checkpoint=None).to(a.device)
    # sam.yaml's MASK_GENERATOR, as build_sam_mask_generator passes it (its offset is the threshold)
    generator = sam_builder.SamAutomaticMaskGenerator(
        sam, points_per_side=32, points_per_batch=64, pred_iou_thresh=0.88, stability_score_thresh=0.95,
        stability_score_offset=0.95, box_nms_thresh=0.7, crop_n_layers=0, crop_nms_thresh=0.7,
        crop_overlap_ratio=0.3413333, crop_n_points_downscale_factor=1, point_grids=None,
        min_mask_region_area=200, output_mode="binary_mask")
    clip = CLIP(**CLIP_VIT_B32)
    convert_weights(clip)
    clip = clip.eval().to(a.device)
    # held to the end, as the segmentor holds its obj365_text_token
    tokens = torch.zeros(a.prompts, CLIP_VIT_B32["context_length"], dtype=torch.int).to(a.device)  # noqa: F841
    height, width = fitted(a.height, a.width, a.max_input)
    image = np.random.randint(0, 255, (height, width, 3), dtype=np.uint8)
    with torch.no_grad():
        generator.generate(image)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
