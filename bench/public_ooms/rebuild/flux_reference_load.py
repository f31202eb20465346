"""Black Forest Labs' reference code for FLUX.1 (flux.util from --flux, the repository's src/ at
a commit) loading the models as its demos' get_models() does, in its order: the T5 encoder
(HFEmbedder: transformers' from_pretrained in bf16, then .to(device)), the CLIP text encoder
likewise, the flow model (built on the meta device, its checkpoint read onto the device by
safetensors' load_file, then load_state_dict(assign=True)), then the autoencoder the same way.
The demos go on to load an NSFW classifier from the Hub and to sample; this rebuild stops after
the four loads, where the report failed.

What stands in:
- T5EncoderModel's and CLIPTextModel's from_pretrained: the published configs' modules on
  uninitialised host memory in the dtype asked (standins.built), so .to(device) moves the
  same tensors; their tokenizers: ids of the real shapes (standins.PaddedIds);
- the flow model's and the autoencoder's checkpoint files: sparse safetensors (a real
  header with the names, shapes and dtypes of the model's own state dict, no data: the
  flow model's bf16, the autoencoder's fp32, as published), laid out as safetensors'
  writer lays out a file, given to flux.util as the FLUX_SCHNELL / FLUX_DEV and AE
  variables name them, so load_file reads the same tensors in the same order.

    python flux_reference_load.py --flux build/public-ooms-deps/flux-eae154e/src --variant schnell
"""
import argparse
import os
import sys
import tempfile

import torch
import transformers

from flux_configs import CLIP_TEXT, T5_XXL
from standins import PaddedIds, built
from vramguard.dryrun.features.weightless import header_from_tensors, write_sparse_safetensors


# safetensors' writer lays tensors out by dtype, in this order, then by name; its readers walk
# a file in that order (load_file by name or by offset: for one dtype, the same)
WRITER_DTYPE_ORDER = (torch.int64, torch.float64, torch.float32, torch.int32, torch.bfloat16, torch.float16,
                      torch.int16, torch.int8, torch.uint8, torch.bool)


def sparse_checkpoint(module, path):
    """`module`'s state dict as a sparse safetensors file at `path` (names, shapes, dtypes), its
    tensors laid out as safetensors' save_file lays out the published file's."""
    state = module.state_dict()
    names = sorted(state, key=lambda n: (WRITER_DTYPE_ORDER.index(state[n].dtype), n))
    write_sparse_safetensors(path, header_from_tensors({n: (state[n].dtype, tuple(state[n].shape)) for n in names}))
    return path


def tokenizer_standin(cls, version, max_length=None, **_):
    return PaddedIds(max_length)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--flux", required=True, help="the reference repository's src/ folder (flux.util)")
    p.add_argument("--variant", choices=("schnell", "dev"), default="schnell")
    a = p.parse_args()
    sys.path.insert(0, a.flux)
    from flux import util
    from flux.model import Flux
    from flux.modules.autoencoder import AutoEncoder

    name = f"flux-{a.variant}"
    spec = util.configs[name]
    folder = os.environ.get("VRAMGUARD_DRYRUN_DIR") or tempfile.mkdtemp()
    with torch.device("meta"):
        flow = Flux(spec.params).to(torch.bfloat16)
        ae = AutoEncoder(spec.ae_params)  # load_ae keeps the checkpoint's dtype (assign=True)
    # what FLUX_SCHNELL (FLUX_DEV) and AE name when set: util read them at import
    spec.ckpt_path = sparse_checkpoint(flow, os.path.join(folder, f"flux1-{a.variant}.sft"))
    spec.ae_path = sparse_checkpoint(ae, os.path.join(folder, "ae.sft"))
    del flow, ae
    transformers.T5EncoderModel.from_pretrained = built(
        {None: (lambda: transformers.T5EncoderModel(transformers.T5Config(**T5_XXL)), None)})
    transformers.CLIPTextModel.from_pretrained = built(
        {None: (lambda: transformers.CLIPTextModel(transformers.CLIPTextConfig(**CLIP_TEXT)), None)})
    transformers.T5Tokenizer.from_pretrained = classmethod(tokenizer_standin)
    transformers.CLIPTokenizer.from_pretrained = classmethod(tokenizer_standin)

    device = torch.device("cuda")
    # held, as get_models() returns them: each stays on the device while the next loads
    models = [util.load_t5(device, max_length=256 if a.variant == "schnell" else 512), util.load_clip(device)]
    models.append(util.load_flow_model(name, device=device))
    models.append(util.load_ae(name, device=device))
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
