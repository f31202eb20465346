"""segment-anything's Sam built by its registry (sam_model_registry, no checkpoint:
the phantom never reads weights), moved to the GPU as the repository's README
does, and one image embedded through SamPredictor.set_image (resized to 1024 on
its longest side and padded, then the image encoder under no_grad); optionally
the automatic mask generator's first point batch (--generate).

    python sam.py --model vit_h --height 1500 --width 2000
"""
import argparse

import numpy as np
import torch
from segment_anything import SamAutomaticMaskGenerator, SamPredictor, sam_model_registry


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="vit_h", choices=("vit_h", "vit_l", "vit_b"))
    p.add_argument("--height", type=int, default=1024)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--generate", action="store_true", help="SamAutomaticMaskGenerator.generate")
    a = p.parse_args()
    sam = sam_model_registry[a.model](checkpoint=None)
    sam.to(device="cuda")
    image = np.random.randint(0, 255, (a.height, a.width, 3), dtype=np.uint8)
    if a.generate:
        SamAutomaticMaskGenerator(sam).generate(image)
    else:
        SamPredictor(sam).set_image(image)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
