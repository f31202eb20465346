#!/usr/bin/env bash
# Two pieces of `make test` side by side: a timed step that uses one core
# and mostly waits (a tier's pip install: its downloads, unpacking and
# bytecode, one process) beside other work that uses every core. The
# background step is tests/timed_step.sh NAME BACKGROUND..., its output kept
# in a log printed whole once it is done, so that the two never interleave;
# the foreground is FOREGROUND... as given. Exit: the foreground's status if
# it failed, else the background's. Whatever way this ends (a failure, make
# stopped, Ctrl-C), the background step's processes are ended with it:
# nothing is left running.
#   usage: tests/beside.sh NAME BACKGROUND... -- FOREGROUND...
#   e.g.:  tests/beside.sh "torch 2.15.0: libraries" make deps -- make fast
set -u
if [ $# -lt 4 ]; then
    echo "usage: $0 NAME BACKGROUND... -- FOREGROUND..." >&2
    exit 2
fi
name=$1
shift
background=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do background+=("$1"); shift; done
if [ $# -lt 2 ] || [ ${#background[@]} -eq 0 ]; then
    echo "$0: want NAME BACKGROUND... -- FOREGROUND..." >&2
    exit 2
fi
shift
here=$(cd "$(dirname "$0")" && pwd)
log=$(mktemp "${TMPDIR:-/tmp}/beside.XXXXXX")

# its own process group (setsid), so that one signal ends all of it
setsid "$here/timed_step.sh" "$name" "${background[@]}" >"$log" 2>&1 </dev/null &
pid=$!
finish() {
    # The process itself first: until it has called setsid there is no
    # group to signal, and ended before that it starts nothing. Then the
    # group, whatever it had started.
    kill -TERM "$pid" 2>/dev/null
    kill -TERM -- "-$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    rm -f "$log"
}
trap finish EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

echo "== beside the next steps: $name (its output follows them)"
"$@"
status=$?
if [ "$status" -ne 0 ]; then
    echo "== $name: stopped, the steps beside it failed"
    exit "$status"
fi
wait "$pid"
background_status=$?
echo "== $name, run beside the steps above:"
cat "$log"
exit "$background_status"
