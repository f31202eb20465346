#!/usr/bin/env bash
# The Python side of `make check` on other CPython versions (make
# check-other-pythons): the abi3 extension built once, as a wheel by
# $PYTHON, installed into a virtual environment of each version, then
# pytest there. An interpreter is found on PATH or in pyenv's versions
# (the machines here carry pyenv's 3.12 and 3.13; Debian 12's own is 3.11).
# A version found nowhere is skipped with a line that says so.
#   usage: tests/check_other_pythons.sh PYTHON WHEEL_DIR python3.12 python3.13 [-- pytest args]
set -euo pipefail
build_python=$1 wheel_dir=$2
shift 2
versions=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do versions+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
pytest_args=("$@")

find_python() {   # a working interpreter named $1, or nothing
    local candidates=() c
    c=$(command -v "$1" 2>/dev/null || true)
    [ -n "$c" ] && candidates+=("$c")
    for c in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/*/bin/"$1"; do
        [ -x "$c" ] && candidates+=("$c")
    done
    for c in "${candidates[@]}"; do
        if "$c" -c "import venv" >/dev/null 2>&1; then echo "$c"; return; fi
    done
}

found=()
for name in "${versions[@]}"; do
    path=$(find_python "$name")
    if [ -z "$path" ]; then
        echo "SKIP: $name is not installed on this machine (not on PATH, not in pyenv's versions); its check did not run"
    else
        found+=("$name=$path")
    fi
done
[ ${#found[@]} -eq 0 ] && exit 0

rm -rf "$wheel_dir"
VRAMGUARD_WERROR=1 "$build_python" -m pip wheel -q --no-deps -w "$wheel_dir" .
wheel=$(ls "$wheel_dir"/*.whl)
for entry in "${found[@]}"; do
    name=${entry%%=*} path=${entry#*=}
    venv=.venv-$name
    echo "== $name ($path): $(basename "$wheel")"
    [ -x "$venv/bin/python" ] || "$path" -m venv "$venv"
    tests/pip_install.sh "$venv/bin/python" -q --force-reinstall -- "$wheel[test]"
    # the wheel's extension, not a source tree's
    (cd / && "$OLDPWD/$venv/bin/python" -c "import sys, vramguard._core as c; print(sys.version.split()[0], c.__file__)")
    "$venv/bin/python" -m pytest -q -rs "${pytest_args[@]}"
done
