"""nanoGPT's train.py run unchanged with one of its configs, from the nanoGPT
source given (--nanogpt DIR: train.py, model.py, configurator.py, config/ of the
report's commit), in a folder of its own whose data/<dataset>/{train,val}.bin
hold random tokens. GPT.from_pretrained builds the model from the GPT-2 size's
config as nanoGPT does and skips only the copy of the Hub's weights (the phantom
never reads them; the model is built on the CPU, as there).

    python nanogpt_train.py --nanogpt build/public-ooms-deps/nanoGPT-a82b33b5 config/finetune_shakespeare.py
"""
import argparse
import os
import runpy
import sys
import tempfile

import numpy as np


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--nanogpt", required=True)
    p.add_argument("--dataset", default="shakespeare")
    p.add_argument("--tokens", type=int, default=400_000)
    a, rest = p.parse_known_args()
    src = os.path.abspath(a.nanogpt)
    work = os.environ.get("VRAMGUARD_DRYRUN_DIR") or tempfile.mkdtemp()
    os.makedirs(os.path.join(work, "data", a.dataset), exist_ok=True)
    for split in ("train", "val"):
        np.random.randint(0, 50257, a.tokens, dtype=np.uint16).tofile(os.path.join(work, "data", a.dataset,
                                                                                    f"{split}.bin"))
    for name in ("configurator.py", "config"):
        if not os.path.exists(os.path.join(work, name)):
            os.symlink(os.path.join(src, name), os.path.join(work, name))
    os.chdir(work)
    sys.path.insert(0, src)
    import model as nanogpt_model

    def from_pretrained(model_type, override_args=None):
        sizes = {"gpt2": (12, 12, 768), "gpt2-medium": (24, 16, 1024), "gpt2-large": (36, 20, 1280),
                 "gpt2-xl": (48, 25, 1600)}
        n_layer, n_head, n_embd = sizes[model_type]
        args = dict(n_layer=n_layer, n_head=n_head, n_embd=n_embd, vocab_size=50257, block_size=1024, bias=True)
        args.update(override_args or {})
        return nanogpt_model.GPT(nanogpt_model.GPTConfig(**args))

    nanogpt_model.GPT.from_pretrained = staticmethod(from_pretrained)
    sys.argv = [os.path.join(src, "train.py"), *rest]
    runpy.run_path(os.path.join(src, "train.py"), run_name="__main__")


if __name__ == "__main__":
    main()
