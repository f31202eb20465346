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
from flux_configs import CLIP_TEXT, T5_XXL, TRANSFORMER, VAE, VARIANTS
from standins import PaddedIds, on_host


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
