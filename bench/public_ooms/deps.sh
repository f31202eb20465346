#!/bin/sh
# The libraries of the reports' day that rebuilds.toml's `pythonpath` names, under
# build/public-ooms-deps (not installed into the environment: each rebuild puts only
# its own on the path). PYTHON: the torch tier's interpreter.
#   torchtune at eb2ba94a (main the day of torchtune#1603, the PR's parent), with what
#   `import torchtune` needs; transformers 2.5.1, 3.0.2 and 3.1.0 (each in a folder of its
#   own, with requests for their file_utils), 4.57.3 for a check of koalpaca#112's row;
#   segment-anything 1.0; the programs' sources at
#   their commits: nanoGPT (a82b33b5), train-llm-from-scratch (99358bd).
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
