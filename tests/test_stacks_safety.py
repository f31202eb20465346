"""The stack capture where the GIL, the interpreter or the tables change
under it: sub-interpreters, a garbage collection that runs finalizers in
the middle of a capture, and stacks other threads set aside. Each case runs
in a fresh interpreter, since the defects these guard against crash the
process (and the simulated devices and sub-interpreters are the
process's)."""
import ast
import os
import subprocess
import sys
import textwrap

import pytest

from vramguard import Heap, _core, record

PRELUDE = """
import gc, sys, threading
import vramguard
from vramguard import Heap, _core, record
MiB = 1 << 20

def out(name, value):
    print("%s=%r" % (name, value), flush=True)

def line_here():
    return sys._getframe(1).f_lineno

# sub-interpreters that share the main one's GIL (3.12+ makes isolated
# ones by default, and those cannot load a module of the stable ABI)
try:
    import _xxsubinterpreters as _subs
    def sub_create():
        return _subs.create(isolated=False)
except ImportError:  # 3.13
    import _interpreters as _subs
    def sub_create():
        return _subs.create("legacy")

def sub_run(sub, code):
    failed = _subs.run_string(sub, code)  # 3.13 answers what failed
    if failed is not None:
        raise RuntimeError(failed)

sub_destroy = _subs.destroy
"""


def run(body, env=None):
    """Runs `body` after PRELUDE in a fresh interpreter, with `env` added to
    the environment; returns the values it reported through out(). A crash
    fails the test with its output."""
    proc = subprocess.run([sys.executable, "-X", "faulthandler", "-c",
                           PRELUDE + textwrap.dedent(body)],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    values = {}
    for line in proc.stdout.splitlines():
        name, sep, value = line.partition("=")
        if sep and name.isidentifier():
            values[name] = ast.literal_eval(value)
    return values


def has_sub_interpreters():
    try:
        import _xxsubinterpreters  # noqa: F401  (3.11, 3.12)
    except ImportError:
        try:
            import _interpreters  # noqa: F401  (3.13)
        except ImportError:
            return False
    return True


needs_sub_interpreters = pytest.mark.skipif(not has_sub_interpreters(),
                                            reason="this Python has no sub-interpreter module")


# ------------------------------------------------------------ sub-interpreters


@needs_sub_interpreters
def test_an_allocation_without_the_gil_gets_no_stack_once_a_sub_interpreter_existed():
    """Creating a sub-interpreter turns PyGILState_Check into "always
    yes" for the rest of the process: a device heap's allocation, which
    runs without the GIL, must still not read any frames."""
    v = run("""
        _core.simulate_devices(1 << 30)
        heap = _core.device_heap(0)
        sub_destroy(sub_create())
        with record(heap, stacks=True) as rec:
            p = heap.malloc(MiB)  # a borrowed heap allocates without the GIL
        heap.free(p)
        out("site", rec.trace.site_of(0))
        out("not_kept", rec.trace.meta["stacks_not_kept"])
    """)
    assert v == {"site": None, "not_kept": 0}


@needs_sub_interpreters
def test_a_capture_from_a_sub_interpreter_is_skipped_and_counted():
    """The tables hold the main interpreter's code objects: a sub-
    interpreter's frames are never interned beside them."""
    v = run("""
        heap = Heap(1 << 30)
        sub = sub_create()
        with record(heap, stacks=True) as rec:
            p = heap.malloc(MiB); line = line_here()
            sub_run(sub, "from vramguard import _core\\n"
                                            "def f():\\n"
                                            "    return _core.stacks_capture(), _core.stacks_push()\\n"
                                            "print('sub=%r' % (f(),), flush=True)\\n")
        sub_destroy(sub)
        out("files", sorted({f for f, _, _ in _core.stacks_table()[0]}))
        out("frames", rec.trace.frames_of(0)[0][1:])
        out("line", line)
        out("counts", _core.stacks_counts())
    """)
    assert v["sub"] == (0, 0)
    assert v["files"] == ["<string>"]  # the main script's own, from `python -c`
    assert v["frames"] == (v["line"], "<module>")
    assert v["counts"]["other_interpreter"] == 2


@needs_sub_interpreters
def test_a_recording_with_stacks_in_a_sub_interpreter_keeps_none_and_says_so():
    """Every allocation it records is counted as not kept, and it warns
    once; the main interpreter's tables are left as they were."""
    v = run("""
        sub = sub_create()
        sub_run(sub, "from vramguard import Heap, record\\n"
                                        "heap = Heap(1 << 30)\\n"
                                        "import warnings\\n"
                                        "with warnings.catch_warnings(record=True) as said:\\n"
                                        "    warnings.simplefilter('always')\\n"
                                        "    with record(heap, stacks=True) as rec:\\n"
                                        "        heap.free(heap.malloc(1 << 20))\\n"
                                        "        heap.free(heap.malloc(1 << 20))\\n"
                                        "print('said=%r' % ([str(w.message) for w in said],), flush=True)\\n"
                                        "print('site=%r' % (rec.trace.site_of(0),), flush=True)\\n"
                                        "print('not_kept=%r' % (rec.trace.meta['stacks_not_kept'],), flush=True)\\n")
        sub_destroy(sub)
        # the main interpreter then records as ever
        heap = Heap(1 << 30)
        with record(heap, stacks=True) as rec:
            heap.free(heap.malloc(MiB)); line = line_here()
        out("main", rec.trace.frames_of(0)[0][1:] == (line, "<module>"))
        out("tables", len(_core.stacks_table()[1]))
    """)
    assert v == {"site": None, "not_kept": 2, "main": True, "tables": 1, "said": [
        "record(stacks=True) in a sub-interpreter keeps no stacks: they are kept for the main "
        "interpreter's threads only"]}


# ------------------------------------------------------------ a collection mid-capture


GC_MID_CAPTURE = """
    heap = Heap(1 << 30)
    inner = []

    class Finalizer:
        # garbage in a cycle: only a collection runs its __del__, and the
        # next object the capture makes (a frame object) starts one
        def __init__(self):
            self.me = self

        def __del__(self):
            inner.append(heap.malloc(MiB))  # a capture inside the capture
            ACTION

    def deep(n):
        if n:
            return deep(n - 1)
        Finalizer()
        return heap.malloc(MiB)

    code = deep.__code__
    refs = sys.getrefcount(code)
    rec = record(heap, stacks=True).start()
    gc.collect()
    gc.set_threshold(1)
    p = deep(12)
    gc.set_threshold(700)
    out("finalized", len(inner))
    p2 = heap.malloc(MiB); line = line_here()
    trace = rec.stop()
    out("sites", [trace.site_of(op) for op in range(len(trace)) if trace.kinds[op] == 1])
    out("line", line)
    out("counts", _core.stacks_counts())
    _core.stacks_release()
    out("refs_back", sys.getrefcount(code) == refs)
"""


# 3.12 moved collections to the interpreter's next check between
# bytecodes: none starts inside a C call such as a capture there.
collects_inside_c_calls = pytest.mark.skipif(sys.version_info >= (3, 12),
                                             reason="collections start between bytecodes only")


@collects_inside_c_calls
def test_tables_released_by_a_finalizer_in_the_middle_of_a_capture_void_it():
    v = run(GC_MID_CAPTURE.replace("ACTION", "_core.stacks_release()"))
    # the capture the finalizer interrupted keeps nothing; the tables are
    # gone until configured again, so nothing after has a stack either
    assert v["finalized"] == 1
    assert v["sites"] == [None, None, None]
    assert v["counts"]["interrupted"] == 1 and v["counts"]["reentrant"] == 1
    assert v["refs_back"]


@collects_inside_c_calls
def test_a_finalizer_that_allocates_in_the_middle_of_a_capture_leaves_it_whole():
    v = run(GC_MID_CAPTURE.replace("ACTION", "pass"))
    assert v["finalized"] == 1
    # the inner allocation (made first) has none; the outer one its line
    assert v["sites"][0] is None
    assert v["sites"][1].startswith("<string>:") and v["sites"][1].endswith(" deep")
    assert v["sites"][2] == f"<string>:{v['line']}"
    assert v["counts"]["reentrant"] == 1 and v["counts"]["interrupted"] == 0
    assert v["refs_back"]


@collects_inside_c_calls
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_collections_at_every_allocation_leave_every_stack_exact(seed):
    """A collection at nearly every object made, finalizers that allocate,
    set stacks aside, read or reconfigure the tables, from random depths:
    each allocation of the loop is named by its own line, and each inner
    one either by its own line or (made inside a capture) by none, counted."""
    v = run(f"""
        import random
        rng = random.Random({seed})
        heap = Heap(1 << 30)
        inner, inner_skipped = [], []

        class Finalizer:
            def __init__(self, action):
                self.me, self.action = self, action

            def __del__(self):
                if self.action == 0:
                    before = _core.stacks_counts()["reentrant"]
                    inner.append(heap.malloc(MiB))
                    inner_skipped.append(_core.stacks_counts()["reentrant"] - before)
                elif self.action == 1:
                    _core.stacks_pop(_core.stacks_push())
                elif self.action == 2:
                    _core.stacks_table()
                else:
                    _core.stacks_configure(*vramguard.trace.stacks.skip_rules(), 4)

        def deep(n, action):
            if n:
                return deep(n - 1, action)
            Finalizer(action)
            return heap.malloc(MiB), line_here()

        rec = record(heap, stacks=True, capacity=1 << 16).start()
        counts = _core.stacks_counts()
        gc.collect()
        gc.set_threshold(1)
        made = [deep(rng.randrange(20), rng.randrange(4)) for _ in range(300)]
        gc.set_threshold(700)
        gc.collect()
        trace = rec.stop()
        after = _core.stacks_counts()
        allocs = [op for op in range(len(trace)) if trace.kinds[op] == 1]
        out("n_allocs", len(allocs))
        out("n_made", len(made) + len(inner))
        named = [trace.site_of(op) for op in allocs]
        outer_lines = {{f"<string>:{{line}} deep" for _, line in made}}
        out("outer_lines", len(outer_lines))
        out("named_outer", sum(1 for s in named if s in outer_lines))
        out("named_inner", sum(1 for s in named if s is not None and s.endswith(" __del__")))
        out("unnamed", named.count(None))
        out("inner_skipped", sum(inner_skipped))
        out("reentrant", after["reentrant"] - counts["reentrant"])
        out("other", sum(after.values()) - sum(counts.values()) - (after["reentrant"] - counts["reentrant"]))
        out("not_kept", trace.meta["stacks_not_kept"])
    """)
    assert v["n_allocs"] == v["n_made"] and v["outer_lines"] == 1
    assert v["named_outer"] == 300  # every allocation of the loop, by its line
    assert v["named_inner"] + v["unnamed"] == v["n_made"] - 300
    # an inner allocation made inside a capture is the one kind unnamed;
    # captures inside captures (set aside ones too) are all that is not kept
    assert v["unnamed"] == v["inner_skipped"] > 0
    assert v["not_kept"] == v["reentrant"] >= v["unnamed"] and v["other"] == 0


# ------------------------------------------------------------ stacks set aside


SET_ASIDE = """
    _core.simulate_devices(1 << 30)
    heap = _core.device_heap(0)
    pushed, go = threading.Event(), threading.Event()
    seen = {}

    def op_on_another_thread():
        before = _core.stacks_push(); seen["push_line"] = line_here()
        seen["p0"] = heap.malloc(MiB)  # without the GIL: reads what was set aside
        pushed.set()
        go.wait()
        seen["p1"] = heap.malloc(MiB)
        _core.stacks_pop(before)

    first = record(heap, stacks=True).start()
    worker = threading.Thread(target=op_on_another_thread)
    worker.start()
    pushed.wait()
    first.stop()
    RELEASE
    second = record(heap, stacks=True).start()
    _core.stacks_capture(); line = line_here()  # the new tables' first stack
    go.set()
    worker.join()
    second.stop()
    heap.free(seen["p0"]), heap.free(seen["p1"])
    for name, rec in (("first", first), ("second", second)):
        # the allocations made while it ran (the blocks live at its start come first, seeded)
        out(name, [rec.trace.site_of(op) for op in range(rec.trace.meta["seeded_allocations"], len(rec.trace))
                   if rec.trace.kinds[op] == 1])
    out("line", line)
    out("push_line", seen["push_line"])
"""


def test_a_stack_another_thread_set_aside_is_void_once_the_tables_are_released():
    v = run(SET_ASIDE.replace("RELEASE", "_core.stacks_release()"))
    assert v["first"] == [f"<string>:{v['push_line']} op_on_another_thread"]
    # before: the other thread's stale id named this thread's line
    assert v["second"] == [None]


def test_a_stack_another_thread_set_aside_is_void_once_its_recording_stopped():
    v = run(SET_ASIDE.replace("RELEASE", "pass"))
    assert v["first"] == [f"<string>:{v['push_line']} op_on_another_thread"]
    assert v["second"] == [None]


def test_stacks_pop_refuses_what_stacks_push_never_returned():
    heap = Heap(1 << 30)
    with record(heap, stacks=True):
        before = _core.stacks_push()
        token = _core.stacks_push()
        epoch = token >> 32
        for bad in (-1, 1 << 64, epoch << 32 | 0xFFFF, (epoch + 5) << 32 | 1, 7, epoch << 32, "1"):
            with pytest.raises((ValueError, TypeError, OverflowError)):
                _core.stacks_pop(bad)
        _core.stacks_pop(token)
        _core.stacks_pop(before)
    assert before == 0 and token >> 32 >= 1 and 0 < token & 0xFFFFFFFF


# ------------------------------------------------------------ code freed by a release

# The debug allocator overwrites what is freed at once, so that a table
# entry read after its string was freed crashes every time.
DEBUG_MALLOC = {"PYTHONMALLOC": "debug"}

CODE_FREED_BY_RELEASE = """
    import weakref
    assert _core.stacks_configure((), (), 8)

    def make(tag):
        ns = {"cap": _core.stacks_capture}
        # a file name made at run time: only the code object holds it
        fname = "".join(["/tmp/vg_release_", tag, "_", str(id(ns)), ".py"])
        exec(compile("def f():\\n    return cap()\\n", fname, "exec"), ns)
        return ns["f"]

    g, f = make("g"), make("f")
    out("ids", (g(), f()))  # g's code enters the tables first, then f's
    out("frames_before", len(_core.stacks_table()[0]))

    seen = {}
    def on_code_gone(ref):
        # runs while the release drops the tables' references
        CALLBACK

    ref = weakref.ref(f.__code__, on_code_gone)
    del f, g
    gc.collect()
    _core.stacks_release()
    out("seen", seen)
    AFTER
"""


def test_a_callback_run_by_a_release_reads_empty_tables():
    v = run(CODE_FREED_BY_RELEASE
            .replace("CALLBACK", "seen['table'] = repr(_core.stacks_table()[:2]); "
                                 "seen['capture'] = _core.stacks_capture()")
            .replace("AFTER", "out('after', _core.stacks_table()[:2])"),
            env=DEBUG_MALLOC)
    assert v["ids"] == (1, 2) and v["frames_before"] == 3
    # the tables were detached before any reference was dropped: the
    # callback finds none, and its capture keeps nothing
    assert v["seen"] == {"table": "([], [])", "capture": 0}
    assert v["after"] == ([], [])


def test_tables_configured_by_a_callback_run_by_a_release_survive_it():
    v = run(CODE_FREED_BY_RELEASE
            .replace("CALLBACK", "_core.stacks_configure((), (), 8); "
                                 "seen['capture'] = _core.stacks_capture(); "
                                 "seen['line'] = line_here()")
            .replace("AFTER", "frames, stacks, _ = _core.stacks_table(); "
                              "out('after', (frames, stacks)); "
                              "_core.stacks_release()"),
            env=DEBUG_MALLOC)
    # the new tables are the callback's own: the release that ran it
    # frees only the old ones, so stack 1 is still the callback's line
    assert v["seen"]["capture"] == 1
    frames, stacks = v["after"]
    assert stacks == [(0, 1)]
    assert frames[0] == ("<string>", v["seen"]["line"], "on_code_gone")
    assert frames[1][0] == "<string>" and frames[1][2] == "<module>"
