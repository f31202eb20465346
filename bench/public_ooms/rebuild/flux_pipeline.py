"""diffusers' FluxPipeline as a report ran it: its five components built from their
published configs (no weights: each module's tensors are uninitialised host memory,
never read, since a copy to the phantom moves nothing), in the report's dtype,
then enable_model_cpu_offload() and one call of the pipeline: the text encoders,
then the transformer, each moved onto the GPU by its offload hook as its turn
comes.

The two tokenizers are stand-ins: the pipeline pads the CLIP prompt to 77 tokens
and the T5 prompt to max_sequence_length, so the ids' shapes, the only thing of
theirs the GPU sees, are the real tokenizers'; their values are zeros.

    python flux_pipeline.py --variant schnell --dtype bf16 --steps 4 --max-sequence-length 256
"""
import argparse

import torch
import transformers
from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel

from config_args import DTYPES

# The components' published configs (black-forest-labs/FLUX.1-schnell and -dev, their
# subfolders' config.json): what differs between the two is guidance_embeds and the
# scheduler's shifting.
TRANSFORMER = dict(patch_size=1, in_channels=64, num_layers=19, num_single_layers=38, attention_head_dim=128,
                   num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768,
                   axes_dims_rope=(16, 56, 56))
VAE = dict(in_channels=3, out_channels=3, latent_channels=16, block_out_channels=(128, 256, 512, 512),
           down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
           layers_per_block=2, norm_num_groups=32, act_fn="silu", sample_size=1024, scaling_factor=0.3611,
           shift_factor=0.1159, use_quant_conv=False, use_post_quant_conv=False, mid_block_add_attention=True)
CLIP_TEXT = dict(vocab_size=49408, hidden_size=768, intermediate_size=3072, projection_dim=768,
                 num_hidden_layers=12, num_attention_heads=12, max_position_embeddings=77, hidden_act="quick_gelu",
                 layer_norm_eps=1e-5)
T5_XXL = dict(vocab_size=32128, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64,
              relative_attention_num_buckets=32, relative_attention_max_distance=128, dropout_rate=0.1,
              layer_norm_epsilon=1e-6, feed_forward_proj="gated-gelu", tie_word_embeddings=False)
VARIANTS = {
    "schnell": dict(guidance_embeds=False, scheduler=dict(shift=1.0, use_dynamic_shifting=False)),
    "dev": dict(guidance_embeds=True, scheduler=dict(shift=3.0, use_dynamic_shifting=True)),
}


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
    """The module built on the meta device, given uninitialised host memory in `dtype`."""
    return module.to(dtype).to_empty(device="cpu").eval()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--variant", choices=VARIANTS, default="schnell")
    p.add_argument("--dtype", choices=DTYPES, default="bf16")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--guidance-scale", type=float, default=0.0)
    p.add_argument("--max-sequence-length", type=int, default=512)
    p.add_argument("--height", type=int, default=None, help="default: the pipeline's (1024)")
    p.add_argument("--width", type=int, default=None)
    p.add_argument("--prompt", default="A cat holding a sign that says hello world")
    p.add_argument("--offload", choices=("model", "none"), default="model",
                   help="enable_model_cpu_offload(), or the whole pipeline .to('cuda')")
    a = p.parse_args()
    variant, dtype = VARIANTS[a.variant], DTYPES[a.dtype]
    with torch.device("meta"):
        transformer = FluxTransformer2DModel(guidance_embeds=variant["guidance_embeds"], **TRANSFORMER)
        vae = AutoencoderKL(**VAE)
        clip = transformers.CLIPTextModel(transformers.CLIPTextConfig(**CLIP_TEXT))
        t5 = transformers.T5EncoderModel(transformers.T5Config(**T5_XXL))
    pipe = FluxPipeline(scheduler=FlowMatchEulerDiscreteScheduler(**variant["scheduler"]),
                        vae=on_host(vae, dtype), text_encoder=on_host(clip, dtype), tokenizer=PaddedIds(77),
                        text_encoder_2=on_host(t5, dtype), tokenizer_2=PaddedIds(512),
                        transformer=on_host(transformer, dtype))
    if a.offload == "model":
        pipe.enable_model_cpu_offload()
    else:
        pipe.to("cuda")
    pipe(a.prompt, guidance_scale=a.guidance_scale, num_inference_steps=a.steps,
         max_sequence_length=a.max_sequence_length, height=a.height, width=a.width,
         generator=torch.Generator("cpu").manual_seed(0))
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
