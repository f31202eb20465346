"""Latent diffusion's txt2img as CompVis' (Stable Diffusion 1) and Stability-AI's
(Stable Diffusion 2) scripts/txt2img.py of the report's day run it, with the
repository's own model code and config (--ldm: its tree at that commit): the
LatentDiffusion of the config built on the CPU (its checkpoint is read to the CPU
and never reaches the GPU on its own: no weights here), model.cuda(), the PLMS or
DDIM sampler, then under torch.no_grad() and autocast("cuda") per prompt batch the
unconditional and conditional embeddings, sampler.sample(...) with classifier-free
guidance, and the first stage's decode; n_iter times.

Stand-ins, for what plays no part in sampling on the GPU: pytorch_lightning (the
model classes' base class, as an nn.Module that tells its device, and
rank_zero_only), taming's vector quantizer, clip and kornia (imported by models
and embedders the configs do not build). SD 1's text encoder is CLIP ViT-L/14's
text model built from its published config, its tokenizer one that pads every
prompt to 77 tokens as the embedder asks (the ids' values change no shape); SD 2's
OpenCLIP ViT-H-14 comes from open_clip itself, built without its pretrained
weights.

    python ldm_txt2img.py --ldm DIR --config configs/stable-diffusion/v1-inference.yaml --sampler plms
"""
import argparse
import contextlib
import os
import sys
import types

import torch

CLIP_L14_TEXT = dict(vocab_size=49408, hidden_size=768, intermediate_size=3072, projection_dim=768,
                     num_hidden_layers=12, num_attention_heads=12, max_position_embeddings=77,
                     hidden_act="quick_gelu", layer_norm_eps=1e-5)


class LightningModule(torch.nn.Module):
    """pytorch_lightning's LightningModule as sampling uses it: a module that tells its device."""

    @property
    def device(self):
        return next(self.parameters(), torch.empty(0)).device


def module(name, **attrs):
    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    sys.modules[name] = m
    return m


def install_stand_ins():
    module("pytorch_lightning", LightningModule=LightningModule, seed_everything=torch.manual_seed)
    module("pytorch_lightning.utilities")
    module("pytorch_lightning.utilities.distributed", rank_zero_only=lambda f: f)
    module("taming")
    module("taming.modules")
    module("taming.modules.vqvae")
    module("taming.modules.vqvae.quantize", VectorQuantizer2=torch.nn.Module)
    module("clip")
    module("kornia")


class PaddedTokenizer:
    """CLIPTokenizer as FrozenCLIPEmbedder calls it: padding="max_length", so (n, 77) ids."""

    @classmethod
    def from_pretrained(cls, _version):
        return cls()

    def __call__(self, text, max_length=77, **_):
        ids = torch.zeros(len(text), max_length, dtype=torch.long)
        return {"input_ids": ids, "length": torch.full((len(text),), max_length)}


class CLIPTextFromConfig:
    @staticmethod
    def from_pretrained(_version):
        import transformers

        return transformers.CLIPTextModel(transformers.CLIPTextConfig(**CLIP_L14_TEXT))


def text_encoders_offline():
    """The embedders' Hub downloads replaced by their published shapes."""
    from ldm.modules.encoders import modules as encoders

    if hasattr(encoders, "CLIPTokenizer"):
        encoders.CLIPTokenizer, encoders.CLIPTextModel = PaddedTokenizer, CLIPTextFromConfig
    if hasattr(encoders, "open_clip"):
        create = encoders.open_clip.create_model_and_transforms

        def unweighted(arch, device=None, pretrained=None, **kwargs):
            return create(arch, device=device, pretrained=None, **kwargs)

        encoders.open_clip = types.SimpleNamespace(create_model_and_transforms=unweighted,
                                                   tokenize=encoders.open_clip.tokenize)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ldm", required=True, help="the repository's tree at the report's commit")
    p.add_argument("--config", required=True, help="the model config, relative to --ldm")
    p.add_argument("--sampler", choices=("plms", "ddim"), default="plms")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--n-samples", type=int, default=3)
    p.add_argument("--n-iter", type=int, default=2)
    p.add_argument("--H", type=int, default=512)
    p.add_argument("--W", type=int, default=512)
    p.add_argument("--C", type=int, default=4)
    p.add_argument("--f", type=int, default=8)
    p.add_argument("--scale", type=float, default=7.5)
    p.add_argument("--ddim-eta", type=float, default=0.0)
    p.add_argument("--precision", choices=("autocast", "full"), default="autocast")
    p.add_argument("--prompt", default="a photograph of an astronaut riding a horse")
    a = p.parse_args()
    install_stand_ins()
    sys.path.insert(0, a.ldm)
    from omegaconf import OmegaConf
    from ldm.util import instantiate_from_config

    text_encoders_offline()
    config = OmegaConf.load(os.path.join(a.ldm, a.config))
    model = instantiate_from_config(config.model)
    model.cuda()
    model.eval()
    if a.sampler == "plms":
        from ldm.models.diffusion.plms import PLMSSampler as Sampler
    else:
        from ldm.models.diffusion.ddim import DDIMSampler as Sampler
    sampler = Sampler(model)
    prompts = a.n_samples * [a.prompt]
    scope = torch.autocast if a.precision == "autocast" else (lambda _: contextlib.nullcontext())
    with torch.no_grad(), scope("cuda"), model.ema_scope():
        for _ in range(a.n_iter):
            uc = model.get_learned_conditioning(a.n_samples * [""]) if a.scale != 1.0 else None
            c = model.get_learned_conditioning(prompts)
            shape = [a.C, a.H // a.f, a.W // a.f]
            samples, _ = sampler.sample(S=a.steps, conditioning=c, batch_size=a.n_samples, shape=shape,
                                        verbose=False, unconditional_guidance_scale=a.scale,
                                        unconditional_conditioning=uc, eta=a.ddim_eta, x_T=None)
            x = model.decode_first_stage(samples)
            torch.clamp((x + 1.0) / 2.0, min=0.0, max=1.0).cpu()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
