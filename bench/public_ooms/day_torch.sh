#!/bin/sh
# The public reports' rebuilds under the torch of each report's day (docs/benchmarks.md,
# "Under the torch of the report's day"): a virtual environment per torch under
# build/day-torch/, each with what the rebuilds import beside their own folders
# (bench/public_ooms/deps.sh, run first), then run.py --day-torch for each, into one folder,
# and the combined summary against the default torch's rows.
#   OUT: the rows' folder (default bench/results/public-ooms-day-torch-<today>)
#   ROWS: the default torch's rows.json (default the newest public-ooms-<version>-<date>)
# torch 2.0's compiler needs Python 3.10 (nanoGPT#208); the other rows' folders hold CPython
# 3.11 wheels, so 2.0.0 has an environment of each.
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
VENVS=${VENVS:-$ROOT/build/day-torch}
OUT=${OUT:-$ROOT/bench/results/public-ooms-day-torch-$(date +%F)}
ROWS=${ROWS:-$(ls -d "$ROOT"/bench/results/public-ooms-[0-9]*/rows.json | sort | tail -1)}
PY311=${PY311:-python3.11}
PY310=${PY310:-$(ls -d "$HOME"/.pyenv/versions/3.10*/bin/python 2>/dev/null | tail -1)}
RUN="$ROOT/.venv-torch/bin/python $ROOT/bench/public_ooms/run.py"
COMMON="tqdm==4.66.1 pyyaml==6.0.1 regex==2023.12.25 requests==2.31.0 filelock==3.12.2 packaging==23.2 psutil==5.9.5"

venv() {  # name, python, requirements...
    name=$1 py=$2; shift 2
    [ -f "$VENVS/$name/.installed" ] && return 0
    rm -rf "$VENVS/$name"
    "$py" -m venv "$VENVS/$name"
    "$VENVS/$name/bin/pip" install -q "$@"
    touch "$VENVS/$name/.installed"
}
venv torch-2.0.0 "$PY311" torch==2.0.0 torchvision==0.15.1 "numpy<2" safetensors==0.3.1 $COMMON
venv torch-2.0.0-py310 "$PY310" torch==2.0.0 "numpy<2" $COMMON
venv torch-2.0.1 "$PY311" torch==2.0.1 torchvision==0.15.2 "numpy<2" safetensors==0.3.1 $COMMON
venv torch-2.5.1 "$PY311" torch==2.5.1 numpy==2.1.3 $COMMON
venv torch-2.6.0 "$PY311" torch==2.6.0 numpy==2.2.2 $COMMON
venv torch-2.1.2 "$PY311" torch==2.1.2 torchvision==0.16.2 "numpy<2" $COMMON
venv torch-2.7.1 "$PY311" torch==2.7.1 numpy==2.2.6 safetensors==0.5.3 pillow==11.2.1 fsspec==2025.5.1 $COMMON
venv torch-2.4.0 "$PY311" torch==2.4.0 numpy==2.0.1 $COMMON
venv torch-2.4.1 "$PY311" torch==2.4.1 numpy==2.1.1 $COMMON
venv torch-2.9.1 "$PY311" torch==2.9.1 numpy==2.3.5 $COMMON

for name in torch-2.0.0 torch-2.0.1 torch-2.1.2 torch-2.4.0 torch-2.4.1 torch-2.5.1 torch-2.6.0 torch-2.7.1 torch-2.9.1; do
    $RUN --python "$VENVS/$name/bin/python" --day-torch --update --out "$OUT"
done
# compiled under torch 2.0: Python 3.10
$RUN --python "$VENVS/torch-2.0.0-py310/bin/python" --day-torch --update --out "$OUT" \
    --only nanogpt-208-24gb-finetune-shakespeare-gpt2xl-bs1
$RUN --combined "$ROWS" "$OUT/rows.json"
