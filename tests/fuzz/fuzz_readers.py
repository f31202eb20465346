"""Coverage-guided fuzzing of the Python trace readers with atheris (not in
CI: `make fuzz` runs it when atheris is installed in .venv).

    .venv/bin/python tests/fuzz/fuzz_readers.py -max_total_time=120 CORPUS_DIR

Any bytes, read as whatever format load_trace takes them for, may only
raise TraceFormatError, and a trace read must replay; a pickle the C
pre-check passes must unpickle without crashing and hold no tuple nested
deeper than the pre-check's limit."""
import io
import sys

import atheris

with atheris.instrument_imports():
    import vramguard
    from vramguard import _core
    from vramguard.trace import importer as _import

from fuzz_support import TUPLE_DEPTH_LIMIT, tuple_depth


def check_pickle(data):
    if _core.pickle_problem(data) is not None:
        return
    try:
        obj = _import._PlainDataUnpickler(io.BytesIO(data)).load()
    except Exception:  # corrupt data: the reader turns it into TraceFormatError
        return
    assert tuple_depth(obj) <= TUPLE_DEPTH_LIMIT, "the pre-check passed a tuple nested too deep"


def test_one_input(data):
    check_pickle(data)
    allowance = _import._Allowance("fuzz", len(data), _import.DEFAULT_MAX_EXPANSION)
    try:
        trace = _import._read(io.BytesIO(data), "fuzz", None, allowance)
    except vramguard.TraceFormatError:
        return
    trace.peak_live()
    vramguard.replay(trace, budget=64 << 20, samples=4)


if __name__ == "__main__":
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
