#!/usr/bin/env bash
# pip install into PYTHON's environment, through the run's wheelhouse when
# WHEELHOUSE is set (make test sets it with SPARE_DISK=1): every wheel is
# downloaded there first (pip download skips a file already there), then
# installed from there alone (--no-index), and files over 100 MB are then
# dropped (PyTorch's, Triton's and NVIDIA's wheels, which no two of the
# run's environments share). So a wheel that several environments install
# (the test tools, transformers, bitsandbytes, ...) is downloaded once in a
# run. Without WHEELHOUSE it is a plain pip install.
#   usage: tests/pip_install.sh PYTHON [INSTALL_FLAG...] -- REQUIREMENT...
#   e.g.:  tests/pip_install.sh .venv/bin/python -q -- -e ".[test]"
# A REQUIREMENT is what pip install takes (-r FILE, -e DIR, a name or a
# path); the flags go to pip install only.
set -euo pipefail
if [ $# -lt 3 ]; then
    echo "usage: $0 PYTHON [INSTALL_FLAG...] -- REQUIREMENT..." >&2
    exit 2
fi
python=$1
shift
flags=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do flags+=("$1"); shift; done
if [ $# -eq 0 ]; then
    echo "$0: no -- before the requirements" >&2
    exit 2
fi
shift
reqs=("$@")
if [ -z "${WHEELHOUSE:-}" ]; then
    exec "$python" -m pip install "${flags[@]}" "${reqs[@]}"
fi
mkdir -p "$WHEELHOUSE"
wanted=()
for r in "${reqs[@]}"; do
    [ "$r" = "-e" ] || wanted+=("$r")  # pip download takes the project, not its editable mode
done
# setuptools and wheel: a local project's build, run from the wheelhouse too
"$python" -m pip download -q -d "$WHEELHOUSE" "setuptools>=64" wheel "${wanted[@]}"
"$python" -m pip install --no-index --find-links "$WHEELHOUSE" "${flags[@]}" "${reqs[@]}"
find "$WHEELHOUSE" -type f -size +100M -delete
