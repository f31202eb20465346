#!/usr/bin/env bash
# Everything vramguard checks on a real GPU, in one command (where the GPU's
# minutes are few, tests/gpu/card.sh does the most telling part inside a limit):
#
#   bash tests/gpu/run.sh            # the PyTorch integration checks (a few minutes)
#   bash tests/gpu/run.sh --full     # also ResNet-50 / GPT-2 seq 1024 / ViT-B/16, 100 steps,
#                                    # the largest batch under one budget, the zoo one run at a
#                                    # time (bench/zoo_models.py, for step times and the phantom's
#                                    # fidelity: python bench/zoo_fidelity.py --compare), and the
#                                    # trace corpus
#
# It builds the extension in place (no network needed: the machine's own
# setuptools and PyTorch; or uses a carried abi3 build), runs the tests marked cuda, the OOM loop, real
# training side by side with the native allocator, the arena against native,
# native+expandable and vramguard's segments, and the allocation
# microbenchmark. Results: JSON and a markdown table in $RESULTS (default
# bench/results/), the table also printed at the end.
set -uo pipefail
cd "$(dirname "$0")/../.."
RESULTS=${RESULTS:-bench/results}
mkdir -p "$RESULTS"
PY=${PYTHON:-python3}
status=0

echo "== build"
# Built for CPython's stable ABI (abi3): where this machine has no compiler,
# carry python/vramguard/_core.abi3.so built elsewhere on x86-64 Linux.
. tests/gpu/build.sh
vg_build || exit 1
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
$PY -c "import vramguard, torch; print('vramguard', vramguard.__version__, 'torch', torch.__version__, torch.cuda.get_device_name(0))" || exit 1

echo "== pytest -m cuda"
$PY -m pytest -q -rs tests/gpu 2>&1 | tee "$RESULTS/gpu_pytest.log" || status=1

echo "== the arena: pytest with VRAMGUARD_ARENA=1 (maps, unmaps, a graph captured beside it)"
VRAMGUARD_ARENA=1 $PY -m pytest -q -rs tests/gpu/test_arena.py 2>&1 | tee "$RESULTS/gpu_arena.log" || status=1

echo "== a small CNN, batch size changing every step: native, native+expandable, vramguard segments, arena"
$PY tests/gpu/arena_side_by_side.py --steps 60 --json "$RESULTS/gpu_arena_side_by_side.json" \
  | tee "$RESULTS/gpu_arena_side_by_side.md" || status=1

echo "== training side by side (ResNet-18 batch 64, GPT-2 small seq 512), 50 steps"
$PY bench/gpu_train.py --models resnet18,gpt2 --steps 50 --warmup 5 --json "$RESULTS/gpu_train.json" || status=1

echo "== allocation microbenchmark"
$PY bench/gpu_alloc_micro.py --json "$RESULTS/gpu_alloc_micro.json" || status=1

if [ "${1:-}" = "--full" ]; then
  echo "== ResNet-50 bf16 batch 128, GPT-2 seq 1024 batch 8, ViT-B/16: 100 steps after 10"
  $PY bench/gpu_train.py --models resnet50,gpt2-1024,vit --steps 100 --warmup 10 \
      --json "$RESULTS/gpu_train_full.json" || status=1
  echo "== largest batch under one budget (${BUDGET:-16GiB})"
  $PY bench/gpu_train.py --models resnet50,gpt2-1024,vit --max-batch --budget "${BUDGET:-16GiB}" \
      --json "$RESULTS/gpu_max_batch.json" || status=1
  echo "== the zoo, one run at a time (step times comparable), 20 steps: bench/zoo_models.py per allocator"
  JOBS=1 STEPS=20 REBUILD=0 RESULTS="$RESULTS" bash tests/gpu/zoo_on_gpu.sh || status=1
  echo "== trace corpus"
  $PY bench/record_traces.py --out tests/data || status=1
  $PY bench/replay_table.py | tee "$RESULTS/replay_table.md"
fi

echo "== results"
$PY bench/gpu_report.py "$RESULTS" | tee "$RESULTS/gpu_results.md"
exit $status
