#!/bin/sh
# The libraries of the reports' day that rebuilds.toml's `pythonpath` names, under
# build/public-ooms-deps (not installed into the environment: each rebuild puts only
# its own on the path). PYTHON: the torch tier's interpreter.
#   torchtune at eb2ba94a (main the day of torchtune#1603, the PR's parent), with what
#   `import torchtune` needs; transformers 2.5.1, 3.0.2 and 3.1.0 (each in a folder of its
#   own, with requests for their file_utils), 4.57.3, 5.0.0rc1 and 5.0.0rc2 for checks of
#   koalpaca#112's row;
#   transformers 4.31.0 (July 2023, for InternLM's model code) and 4.53.1 with diffusers
#   0.34.0 (July 2025, FLUX); einops 0.4.1, omegaconf 2.1.1 and open_clip 2.7.0 for latent
#   diffusion (2022); segment-anything 1.0; the programs' sources at their commits: nanoGPT
#   (a82b33b5), train-llm-from-scratch (99358bd), InternLM's model code (1896dd0), CompVis'
#   and Stability-AI's latent diffusion (69ae4b35, 21f890f9; d4e8234), openai-whisper (82725ce, b80bcf6),
#   codegeex-fastertransformer's weights class (a07a583), segment-anything-u-specify's
#   models (606a6bc) with OpenCV, which its mask generator imports; ChatGLM-6B's Hub code as
#   republished on GitHub (the modeling file of yuanmeng1120/ChatGLM-6b-api at cbe6681, the
#   config class of samson-wang/chatglm-6b-huggingface at 867860a) with transformers 4.29.2;
#   transformers 4.20.1 with accelerate 0.10.0 (GPTNeoX20B_HuggingFace's env.yml); for the
#   rows under the torch of their day, transformers 4.28.1 (April 2023), llama-2-7B-4bit-python-
#   coder's notebook pins, alpaca-lora#329's and qlora#17's day's releases (peft's main at 3714aa2
#   for the latter), OpenCV 4.8; diffusers at 363d1ab7, 9ff72433 and 2c45a53a (main on the days of
#   diffusers#10994, #10120 and #4872) with the releases of those days, xformers 0.0.21 for #4872.
set -eu
PYTHON=${PYTHON:-.venv-torch/bin/python}
DEPS=${DEPS:-build/public-ooms-deps}
mkdir -p "$DEPS"
"$PYTHON" -m pip install -q --no-deps --target "$DEPS" torchao==0.5.0 omegaconf==2.4.0 \
    antlr4-python3-runtime==4.9.3 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 pandas==3.1.1 \
    pyarrow==26.0.1 fsspec==2024.6.1 xxhash==4.1.0 sentencepiece==0.2.3 tiktoken==0.14.0 blobfile==3.3.0 \
    torchtune==0.3.0
target() {  # folder, requirements...
    dest=$1; shift
    [ -d "$dest" ] || "$PYTHON" -m pip install -q --no-deps --target "$dest" "$@"
}
target "$DEPS/requests-2.32" requests==2.32.3 certifi charset_normalizer idna urllib3
for v in 2.5.1 3.0.2 3.1.0; do target "$DEPS/transformers-$v" "transformers==$v"; done
target "$DEPS/segment-anything-1.0" segment-anything==1.0
target "$DEPS/transformers-4.57.3" transformers==4.57.3 huggingface_hub==0.36.0 tokenizers==0.22.1
# koalpaca#112's day (2025-12-29) for torch 2.9.1, beside transformers-4.57.3: PyPI's releases of that day
target "$DEPS/koalpaca-112-libraries-2025-12-29" bitsandbytes==0.49.0 accelerate==1.12.0 safetensors==0.7.0
# flux#10 (2024-08-01): what Black Forest Labs' reference code imports beside transformers, and for the
# torch of its day (2.4.0) the transformers, tokenizers, hub and safetensors releases of that day
target "$DEPS/flux-10-libraries-2024-08-01" einops==0.8.0 invisible-watermark==0.2.0 PyWavelets==1.6.0
target "$DEPS/transformers-4.43.3" transformers==4.43.3 tokenizers==0.19.1 huggingface_hub==0.24.4 safetensors==0.4.3 \
    sentencepiece==0.2.0
# transformers 5.0's pre-releases around koalpaca#112's day, for the check in its row's cause
for v in rc1 rc2; do
    target "$DEPS/transformers-5.0.0$v" "transformers==5.0.0$v" huggingface_hub==1.2.3 tokenizers==0.22.1 \
        typer-slim==0.20.0 httpx==0.28.1 httpcore==1.0.9 h11==0.16.0 anyio==4.12.0 sniffio==1.3.1 \
        shellingham==1.5.4 hf-xet==1.2.0
done
target "$DEPS/transformers-4.20.1-accelerate-0.10.0" transformers==4.20.1 accelerate==0.10.0 huggingface_hub==0.8.1
target "$DEPS/transformers-4.29.2" transformers==4.29.2 huggingface_hub==0.14.1 tokenizers==0.13.3
target "$DEPS/transformers-4.31.0" transformers==4.31.0 huggingface_hub==0.16.4 tokenizers==0.13.3
target "$DEPS/transformers-4.53.1" transformers==4.53.1 huggingface_hub==0.33.2 tokenizers==0.21.2
target "$DEPS/diffusers-0.34.0" diffusers==0.34.0
# for the rebuilds under the torch of their report's day (day_pythonpath; day_torch.sh)
target "$DEPS/transformers-4.28.1" transformers==4.28.1 huggingface_hub==0.13.4 tokenizers==0.13.3
target "$DEPS/llama2-4bit-python-coder-notebook-pins" transformers==4.31.0 peft==0.4.0 bitsandbytes==0.40.2 \
    accelerate==0.21.0 tokenizers==0.13.3 safetensors==0.3.1 huggingface_hub==0.16.4 psutil==7.2.2 scipy==1.11.2
target "$DEPS/alpaca-lora-329-libraries-2023-04-13" transformers==4.28.0 peft==0.2.0 bitsandbytes==0.38.1 \
    accelerate==0.18.0 tokenizers==0.13.3 safetensors==0.3.0 huggingface_hub==0.13.4
# torchtune#1603's day (2024-09-16) for torch 2.4.1: what `import torchtune` at eb2ba94a needs, PyPI's
# releases of that day (its pyproject pins numpy<=1.26.4)
target "$DEPS/torchtune-1603-libraries-2024-09-16" torchao==0.5.0 datasets==3.0.0 huggingface_hub==0.24.7 \
    safetensors==0.4.5 sentencepiece==0.2.0 tiktoken==0.7.0 blobfile==3.0.0 numpy==1.26.4 omegaconf==2.3.0 \
    antlr4-python3-runtime==4.9.3 pyarrow==17.0.0 fsspec==2024.6.1 dill==0.3.8 multiprocess==0.70.16 \
    xxhash==3.5.0 pandas==2.2.2 python-dateutil==2.9.0.post0 pytz==2024.2 tzdata==2024.1 six==1.16.0 \
    pycryptodomex==3.20.0 lxml==5.3.0 urllib3==2.2.3 aiohttp==3.10.5 aiosignal==1.3.1 frozenlist==1.4.1 \
    multidict==6.1.0 yarl==1.11.1 attrs==24.2.0 aiohappyeyeballs==2.4.0 idna==3.10
# diffusers' DreamBooth scripts on the day of diffusers#10994 (FLUX.1-dev LoRA) and #10120 (SD3)
target "$DEPS/flux-dreambooth-libraries-2025-03-07" transformers==4.49.0 accelerate==1.4.0 peft==0.14.0 \
    prodigyopt==1.1.2 huggingface_hub==0.29.2 tokenizers==0.21.0 safetensors==0.5.3 pillow==11.1.0 \
    importlib_metadata==8.6.1 zipp==3.21.0
target "$DEPS/sd3-dreambooth-libraries-2024-12-04" transformers==4.46.3 accelerate==1.1.1 huggingface_hub==0.26.3 \
    tokenizers==0.20.3 safetensors==0.4.5 pillow==11.0.0 importlib_metadata==8.5.0 zipp==3.21.0
# qlora#17's day (2023-05-25): what qlora's README installs, as of then: transformers 4.30.0 (the first
# release with 4-bit loading), accelerate 0.20.1 (the oldest its Trainer takes), bitsandbytes 0.39.0,
# and peft's main (below)
target "$DEPS/qlora-17-libraries-2023-05-25" transformers==4.30.0 accelerate==0.20.1 bitsandbytes==0.39.0 \
    tokenizers==0.13.3 huggingface_hub==0.14.1 safetensors==0.3.1 scipy==1.10.1
# diffusers#4872's day (2023-09-02): PyPI's releases then, accelerate 0.22.0 as the report says, with
# what datasets 2.14.4 imports; xformers 0.0.21, built for torch 2.0.1
target "$DEPS/sdxl-lora-libraries-2023-09-02" transformers==4.32.1 accelerate==0.22.0 bitsandbytes==0.41.1 \
    datasets==2.14.4 huggingface_hub==0.16.4 tokenizers==0.13.3 safetensors==0.3.3 scipy==1.11.2 pyarrow==13.0.0 \
    pandas==2.0.3 python-dateutil==2.8.2 pytz==2023.3 tzdata==2023.3 six==1.16.0 dill==0.3.7 multiprocess==0.70.15 \
    xxhash==3.3.0 fsspec==2023.6.0 aiohttp==3.8.5 multidict==6.0.4 yarl==1.9.2 frozenlist==1.4.0 aiosignal==1.3.1 \
    attrs==23.1.0 async-timeout==4.0.3
target "$DEPS/xformers-0.0.21" xformers==0.0.21
target "$DEPS/opencv-headless-4.8" opencv-python-headless==4.8.0.76  # OpenCV of 2023, for NumPy 1 (torch 2.0.1)
target "$DEPS/accelerate-1.8.1" accelerate==1.8.1  # FLUX#459's day (2025-07-03), under torch 2.7.1
target "$DEPS/bitsandbytes-0.44.1" bitsandbytes==0.44.1  # under torch 2.5.1 only: it has no CUDA 13 library
target "$DEPS/torchvision-0.20.1" torchvision==0.20.1  # each under its own torch only (day_pythonpath)
target "$DEPS/torchvision-0.21.0" torchvision==0.21.0
target "$DEPS/opencv-headless" opencv-python-headless==5.1.0.95  # segment-anything-u-specify's mask generator imports cv2
target "$DEPS/ldm-libs" einops==0.4.1 omegaconf==2.1.1 antlr4-python3-runtime==4.8 open_clip_torch==2.7.0 \
    ftfy==6.1.1 wcwidth==0.2.5
fetch() {  # repository, commit, folder, paths...
    repo=$1 commit=$2 dest=$3; shift 3
    [ -d "$dest" ] && return 0
    tmp=$(mktemp -d)
    if git -C "$tmp" init -q && git -C "$tmp" fetch -q --depth 1 "https://github.com/$repo" "$commit"; then
        mkdir -p "$dest" && git -C "$tmp" archive FETCH_HEAD "$@" | tar -x -C "$dest"
    else  # the rebuilds that need it say so in their rows
        echo "deps.sh: $repo@$commit not fetched" >&2
    fi
    rm -rf "$tmp"
}
fetch meta-pytorch/torchtune eb2ba94a2e61ceafd7f47c3a942e141681155293 "$DEPS/torchtune-eb2ba94a" torchtune
fetch karpathy/nanoGPT a82b33b525ca9855d705656387698e13eb8e8d4b "$DEPS/nanoGPT-a82b33b5" train.py model.py configurator.py config
fetch lm-sys/FastChat 537c827a62c96834d75e09a3b4d1b5f448bfcc40 "$DEPS/FastChat-537c827a" fastchat/serve/compression.py
fetch FareedKhan-dev/train-llm-from-scratch 99358bdca218626e4498c58c90e104f9f97a5ae3 \
    "$DEPS/train-llm-from-scratch-99358bd" src config scripts/train_transformer.py data_loader
fetch InternLM/InternLM 1896dd097a2011ce5d4d3bc982e0666c37364f6f "$DEPS/InternLM-1896dd0" tools/transformers
for c in 69ae4b35e0a0f6ee1af8bb9a5d0016ccb27e36dc 21f890f9da3cfbeaba8e2ac3c425ee9e998d5229; do
    fetch CompVis/stable-diffusion $c "$DEPS/stable-diffusion-$(echo $c | cut -c1-8)" ldm configs
done
fetch Stability-AI/stablediffusion d4e8234adf120cdb39f545ad3ab4f0972d34075e "$DEPS/stablediffusion-d4e8234" ldm configs
fetch openai/whisper b80bcf610d89960bc658b61af9c333fc6d978d78 "$DEPS/whisper-b80bcf6" whisper
fetch openai/whisper 82725cea9c339cdc3a2004a622bba766b1871945 "$DEPS/whisper-82725ce" whisper
fetch CodeGeeX/codegeex-fastertransformer a07a5830ccd104bd801b43cb9efdc19cbbd210ca "$DEPS/codegeex-ft-a07a583" \
    examples/pytorch/codegeex/utils/codegeex.py
fetch MaybeShewill-CV/segment-anything-u-specify 606a6bc744fd7cc37824a32a95ec770580467428 \
    "$DEPS/segment-anything-u-specify-606a6bc" models
fetch huggingface/diffusers 363d1ab7e24c5ed6c190abb00df66d9edb74383b "$DEPS/diffusers-363d1ab7" src/diffusers \
    examples/dreambooth/train_dreambooth_lora_flux.py
fetch huggingface/diffusers 9ff72433fa5a4d9f9e2f2c599e394480b581c614 "$DEPS/diffusers-9ff72433" src/diffusers \
    examples/dreambooth/train_dreambooth_sd3.py
fetch huggingface/diffusers 2c45a53aef197c44d903ed5918d077d614888e14 "$DEPS/diffusers-2c45a53a" src/diffusers \
    examples/text_to_image/train_text_to_image_lora_sdxl.py
# peft's main on qlora#17's day, with the metadata transformers reads its version from
fetch huggingface/peft 3714aa2fff158fdfa637b2b65952580801d890b2 "$DEPS/peft-3714aa2" src/peft
fetch black-forest-labs/flux eae154e8a2a4aad791d52b34bcacb67ab6a9b8db "$DEPS/flux-eae154e" src
if [ -d "$DEPS/peft-3714aa2/src/peft" ] && [ ! -d "$DEPS/peft-3714aa2/src/peft-0.4.0.dev0.dist-info" ]; then
    mkdir -p "$DEPS/peft-3714aa2/src/peft-0.4.0.dev0.dist-info"
    printf 'Metadata-Version: 2.1\nName: peft\nVersion: 0.4.0.dev0\n' \
        > "$DEPS/peft-3714aa2/src/peft-0.4.0.dev0.dist-info/METADATA"
fi
fetch yuanmeng1120/ChatGLM-6b-api cbe6681c742ab43adbbfe69c8627ca648c72789f "$DEPS/chatglm-6b-code-cbe6681" modeling_chatglm.py
fetch samson-wang/chatglm-6b-huggingface 867860a62b54cdc4d58e39ba768005977847d452 "$DEPS/chatglm-6b-config-867860a" \
    configuration_chatglm.py
