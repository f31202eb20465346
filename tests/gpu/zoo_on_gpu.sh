#!/usr/bin/env bash
# The zoo on a real GPU, for the phantom's fidelity: each model of
# bench/zoo_models.py under each allocator (PyTorch's default, expandable
# segments, vramguard's arena and segments), one process each, its figures
# as JSON in $RESULTS/gpu_zoo/ (peaks, the device's total and its context,
# step times, and under PyTorch's allocators every allocation's size in
# order). bench/zoo_fidelity.py then runs the same on a phantom of the card
# and sets the two side by side.
#
#   bash tests/gpu/zoo_on_gpu.sh                  # every model, 4 processes at a time
#   ZOO_MODELS="gpt2 resnet50" JOBS=1 bash tests/gpu/zoo_on_gpu.sh
#
# Runs share the GPU when JOBS > 1: memory figures are per process and
# unaffected, step times are not comparable then (JOBS=1 for those).
set -uo pipefail
cd "$(dirname "$0")/../.."
RESULTS=${RESULTS:-bench/results}
OUT="$RESULTS/gpu_zoo"
mkdir -p "$OUT"
PY=${PYTHON:-python3}
JOBS=${JOBS:-4}
STEPS=${STEPS:-4}
MODELS=${ZOO_MODELS:-mlp gpt2 gpt2-fp32 gpt2-varlen gpt2-generate llama-1b bert resnet18 resnet50 vit_b_16}
ALLOCATORS=${ZOO_ALLOCATORS:-native expandable vramguard vramguard-segments}

if [ ! -f python/vramguard/_core.abi3.so ] || [ "${REBUILD:-1}" = 1 ]; then
  . tests/gpu/build.sh
  vg_build || exit 1
fi
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
$PY -c "import torch; p = torch.cuda.get_device_properties(0); f, t = torch.cuda.mem_get_info(); \
print('device', p.name, p.major, p.minor, p.multi_processor_count, p.total_memory, 'free', f, 'total', t, \
'torch', torch.__version__)" | tee "$OUT/device.txt"

one() {
  model=$1 alloc=$2
  history=0
  case $alloc in native|expandable) history=2000000 ;; esac
  start=$SECONDS
  timeout "${RUN_TIMEOUT:-300}" $PY bench/zoo_run.py "$model" --allocator "$alloc" --steps "$STEPS" \
    --history "$history" --json "$OUT/$model.$alloc.json" > "$OUT/$model.$alloc.log" 2>&1
  rc=$?
  printf '%-14s %-19s rc=%d %4ds\n' "$model" "$alloc" "$rc" "$((SECONDS - start))"
}
export -f one
export PY OUT STEPS

for m in $MODELS; do for a in $ALLOCATORS; do echo "$m $a"; done; done \
  | xargs -P "$JOBS" -L 1 bash -c 'one $0 $1'

$PY bench/zoo_fidelity.py --table "$OUT" | tee "$OUT/table.md"
