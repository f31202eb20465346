#!/usr/bin/env bash
# Everything a GPU machine is needed for, in one command that ends inside a
# time limit (a lent machine's minutes are few), most telling first:
#
#   bash tests/gpu/card.sh [SECONDS] [RESULTS]     # default 480 s, bench/results/gpu-DATE
#
#   1. the build (or a carried python/vramguard/_core.abi3.so where the
#      machine cannot build: no compiler or no Python headers);
#   2. the tests marked cuda (tests/gpu), then the arena's with VRAMGUARD_ARENA=1:
#      kernels, cuBLAS/cuDNN with real workspaces, CUDA graphs' private pools,
#      real maps and unmaps, the OOM type shim, streams with real concurrency;
#   3. the zoo on the card (bench/zoo_card.py): peaks per allocator with
#      PyTorch's allocation sequence, step time against the default, the
#      largest batch under the T4 preset's budget;
#   4. what time is left: bash tests/gpu/run.sh's own side-by-side runs.
#
#   (between 2 and 3: each remedy of dryrun --remedies applied to one program
#   on the card, tests/gpu/remedies_on_card.py, 120 s at most)
#
# The phantom's side of the comparison runs on any machine afterwards, with
# the torch the card used (the results name it):
#   python bench/zoo_fidelity.py --compare RESULTS/gpu_zoo --gpu <preset> --out RESULTS/fidelity
#   python tests/gpu/remedies_on_card.py --compare RESULTS
set -uo pipefail
cd "$(dirname "$0")/../.."
SECONDS_ALL=${1:-480}
RESULTS=${2:-bench/results/gpu-$(date +%F)}
mkdir -p "$RESULTS"
PY=${PYTHON:-python3}
status=0
left() { echo $((SECONDS_ALL - SECONDS)); }

echo "== machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$RESULTS/machine.txt"
$PY -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)" \
  | tee -a "$RESULTS/machine.txt"

echo "== build"
. tests/gpu/build.sh
vg_build "$RESULTS/build.log" || exit 1
export PYTHONPATH="$PWD/python:$PWD/bench${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
$PY -c "import vramguard, torch; print('vramguard', vramguard.__version__, 'on', torch.cuda.get_device_name(0))" || exit 1

echo "== tests/gpu ($(left) s left)"
timeout "$(( $(left) < 150 ? $(left) : 150 ))" $PY -m pytest -q -rs -p no:cacheprovider tests/gpu 2>&1 \
  | tee "$RESULTS/gpu_pytest.log" || status=1
echo "== tests/gpu/test_arena.py with VRAMGUARD_ARENA=1 ($(left) s left)"
VRAMGUARD_ARENA=1 timeout 60 $PY -m pytest -q -rs -p no:cacheprovider tests/gpu/test_arena.py 2>&1 \
  | tee "$RESULTS/gpu_arena.log" || status=1

echo "== each remedy of dryrun --remedies on the card ($(left) s left)"
timeout "$(( $(left) < 120 ? $(left) : 120 ))" $PY tests/gpu/remedies_on_card.py --out "$RESULTS" 2>&1 \
  | tee "$RESULTS/remedies_card.log" || status=1

echo "== the zoo on the card ($(left) s left)"
$PY bench/zoo_card.py --out "$RESULTS" --seconds "$(( $(left) - 40 ))" ${ZOO_CARD_ARGS:-} || status=1

if [ "$(left)" -gt 60 ]; then
  echo "== a small CNN, batch size changing every step, the four allocators ($(left) s left)"
  timeout "$(( $(left) - 10 ))" $PY tests/gpu/arena_side_by_side.py --steps 60 \
    --json "$RESULTS/gpu_arena_side_by_side.json" | tee "$RESULTS/gpu_arena_side_by_side.md" || status=1
fi
echo "== done in ${SECONDS} s, status $status"
exit $status
