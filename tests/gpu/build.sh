# Sourced by the GPU scripts (card.sh, run.sh, zoo_on_gpu.sh): the extension
# built in place for CPython's stable ABI, or, where this machine cannot
# build it (no compiler, no Python headers), a python/vramguard/_core.abi3.so
# carried from a machine that could (`make .venv/.installed`, x86-64 Linux).
#
#   vg_build [LOG]      # the build's output into LOG, else to the terminal
#
# Returns 1, having said why, when there is neither.
vg_build() {
  local log=${1:-}
  local status=0
  if [ -n "$log" ]; then
    VRAMGUARD_WERROR=1 ${PY:-python3} setup.py -q build_ext --inplace > "$log" 2>&1 || status=$?
    [ "$status" = 0 ] || tail -5 "$log"
  else
    VRAMGUARD_WERROR=1 ${PY:-python3} setup.py -q build_ext --inplace || status=$?
  fi
  [ "$status" = 0 ] && return 0
  if [ -f python/vramguard/_core.abi3.so ]; then
    echo "the build failed here: using the carried python/vramguard/_core.abi3.so"
    return 0
  fi
  echo "the build failed here and no python/vramguard/_core.abi3.so was carried" >&2
  return 1
}
