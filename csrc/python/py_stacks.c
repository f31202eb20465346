/* The Python stack of each recorded allocation: which lines of user code
 * asked for the memory.
 *
 * A stack is captured on the allocating thread, before the heap's lock is
 * taken, and only where that thread holds the GIL of the main interpreter:
 * the heap asks vgpy_stack_source(), which looks at the thread's Python
 * frames then, and otherwise answers the stack that Python code on this
 * thread set aside before it entered a call that releases the GIL
 * (stacks_push; PyTorch's ops run without the GIL, so
 * vramguard.record(stacks=True) sets it from a torch function mode). The
 * GIL is never taken here: a thread that does not hold it gets no stack.
 *
 * Whether the thread holds the GIL is not PyGILState_Check's answer: the
 * first sub-interpreter a process creates turns that check off for good
 * (it answers "held" to every thread after), and it knows nothing of
 * other interpreters. The thread state that holds the GIL (3.11: one for
 * the process; 3.12+: this thread's own) is compared with the one this
 * thread registered, and its interpreter with the main one; both
 * functions are resolved from the running interpreter with dlsym.
 *
 * Frames are interned: a table of code objects (classified once as user
 * code or not), of unique (code, line) frames and of unique stacks, all of
 * fixed capacity, so that a training loop that allocates from the same
 * lines costs hash lookups and no allocation, and a program that never
 * repeats itself fills the tables and then gets no stack (counted).
 *
 * The tables are shared by every recording, hold the main interpreter's
 * objects only, and are guarded by its GIL: every function here that
 * touches them runs with it held. A capture makes frame objects, and so
 * may start a garbage collection whose finalizers run any code, this one
 * included: a capture on a thread that is capturing already keeps nothing,
 * and one whose tables were released or rebuilt meanwhile (their
 * generation changed) keeps nothing either; every step leaves the tables
 * whole, so that what runs meanwhile sees them consistent. Captures that
 * keep nothing are counted by reason (stacks_counts).
 *
 * A stack set aside belongs to an epoch: releasing the tables, or the
 * last recording with stacks stopping, starts a new one, so that what any
 * thread set aside before is never attached to a later allocation.
 *
 * Limited API notes: PyEval_GetFrame, PyFrame_GetCode and
 * PyFrame_GetLineNumber are in the stable ABI at 3.9; PyFrame_GetBack is
 * in none (the frame's f_back attribute serves), nor are the unchecked
 * thread state and PyInterpreterState_Main (resolved with dlsym; every
 * CPython 3.9+ exports them). */
#include "py_internal.h"

#include <dlfcn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    /* Frames of user code kept per stack, at most. */
    STACK_MAX_DEPTH = 8,
    /* Frames looked at per capture, user code or not: what a deep
     * recursion costs each allocation. */
    WALK_LIMIT = 64,
    CODE_MAX = 8192,
    FRAME_MAX = 32768,
    STACK_MAX = 32768,
    /* Open-addressing slots: twice the entries, so probes stay short. */
    CODE_SLOTS = 2 * CODE_MAX,
    FRAME_SLOTS = 2 * FRAME_MAX,
    STACK_SLOTS = 2 * STACK_MAX,
};

typedef struct {
    PyObject *code; /* held, so that its address names it while it is here */
    PyObject *file;
    PyObject *name;
    int user;
} code_entry;

typedef struct {
    uint32_t code;
    int32_t line;
} frame_entry;

typedef struct {
    uint32_t depth;
    uint32_t frames[STACK_MAX_DEPTH]; /* innermost first */
} stack_entry;

/* Slots hold an entry's index + 1; 0 is empty. */
typedef struct {
    code_entry *codes;
    uint32_t *code_slots;
    frame_entry *frames;
    uint32_t *frame_slots;
    stack_entry *stacks;
    uint32_t *stack_slots;
    uint32_t ncodes, nframes, nstacks;
    PyObject *skip; /* tuple of path prefixes that are not user code */
    PyObject *keep; /* tuple of prefixes under those that are */
    int depth;
    /* Bumped by a reset: a capture that saw one midway keeps nothing. */
    uint64_t generation;
} stack_tables;

/* Captures that kept nothing, by reason, for the process's life (a
 * recording reports the difference between its stop and its start). */
typedef struct {
    uint64_t table_full;
    uint64_t reentrant;   /* a collection's finalizer captured inside a capture */
    uint64_t interrupted; /* the tables were released meanwhile */
    /* Not guarded by the main GIL: counted by threads of other
     * interpreters too. */
    _Atomic uint64_t other_interpreter;
} skip_counts;

static stack_tables tables;
static skip_counts skipped;
static PyObject *str_f_back, *str_co_filename, *str_co_name;

/* The thread state that holds the GIL: 3.11's is one for the process (any
 * thread's), 3.12's on is this thread's own; NULL when none. Never fails,
 * never blocks. */
static PyThreadState *(*gil_holder)(void);
static int holder_is_per_thread;
static PyInterpreterState *main_interpreter;

/* The epoch of stacks set aside; 0 is never one. */
static _Atomic uint32_t epoch = 1;
/* The stack set aside by Python code on this thread before a call that
 * releases the GIL, as epoch << 32 | id (0: none); and whether a capture
 * runs on this thread (a garbage collection inside one can run code that
 * allocates). */
static _Thread_local uint64_t pending;
static _Thread_local int capturing;

static uint32_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return (uint32_t)x;
}

/* ------------------------------------------------------------------ */
/* The tables                                                          */
/* ------------------------------------------------------------------ */

/* The length of the longest prefix of `file` in `prefixes`, 0 for none. */
static Py_ssize_t longest_prefix(PyObject *file, PyObject *prefixes)
{
    Py_ssize_t longest = 0;
    for (Py_ssize_t i = 0; i < PyTuple_Size(prefixes); i++) {
        PyObject *prefix = PyTuple_GetItem(prefixes, i);
        Py_ssize_t n = PyUnicode_GetLength(prefix);
        if (n > longest && PyUnicode_Tailmatch(file, prefix, 0, PY_SSIZE_T_MAX, -1) == 1) longest = n;
    }
    return longest;
}

/* User code unless a skip prefix matches and no longer keep prefix does
 * (site-packages lies under the standard library, torch under
 * site-packages). */
static int is_user_file(PyObject *file)
{
    if (!PyUnicode_Check(file)) return 0;
    Py_ssize_t skip = longest_prefix(file, tables.skip);
    return skip == 0 || longest_prefix(file, tables.keep) > skip;
}

enum {
    /* What a lookup answers besides an index. */
    TABLE_FULL = -1,
    INTERRUPTED = -2,
};

/* The code table's index of `code`, or -1; *slot_out: where it would go.
 * Runs no Python code. */
static int64_t code_find(PyObject *code, uint32_t *slot_out)
{
    uint32_t slot = mix((uintptr_t)code) & (CODE_SLOTS - 1);
    for (;; slot = (slot + 1) & (CODE_SLOTS - 1)) {
        uint32_t at = tables.code_slots[slot];
        if (!at) break;
        if (tables.codes[at - 1].code == code) return at - 1;
    }
    *slot_out = slot;
    return -1;
}

/* The code table's index of `code`, added and classified on first sight;
 * TABLE_FULL when the table is full or its names cannot be read,
 * INTERRUPTED when the tables changed generation while they were read
 * (the attribute reads are the only calls here that could run code: the
 * lookup is made again after them, so an entry added meanwhile is never
 * added twice, nor a slot taken meanwhile overwritten). */
static int64_t code_index(PyObject *code, uint64_t generation)
{
    uint32_t slot;
    int64_t at = code_find(code, &slot);
    if (at >= 0) return at;
    if (tables.ncodes >= CODE_MAX) return TABLE_FULL;
    PyObject *file = PyObject_GetAttr(code, str_co_filename);
    PyObject *name = file ? PyObject_GetAttr(code, str_co_name) : NULL;
    if (!name) {
        Py_XDECREF(file);
        PyErr_Clear();
        return generation == tables.generation ? TABLE_FULL : INTERRUPTED;
    }
    if (generation != tables.generation || (at = code_find(code, &slot)) >= 0 ||
        tables.ncodes >= CODE_MAX) {
        Py_DECREF(file);
        Py_DECREF(name);
        return generation != tables.generation ? INTERRUPTED : at >= 0 ? at : TABLE_FULL;
    }
    code_entry *e = &tables.codes[tables.ncodes];
    Py_INCREF(code);
    *e = (code_entry){.code = code, .file = file, .name = name, .user = is_user_file(file)};
    PyErr_Clear(); /* a failed prefix match counts as not matching */
    tables.code_slots[slot] = ++tables.ncodes;
    return tables.ncodes - 1;
}

static int64_t frame_index(uint32_t code, int32_t line)
{
    uint32_t slot = mix(((uint64_t)code << 32) | (uint32_t)line) & (FRAME_SLOTS - 1);
    for (;; slot = (slot + 1) & (FRAME_SLOTS - 1)) {
        uint32_t at = tables.frame_slots[slot];
        if (!at) break;
        const frame_entry *f = &tables.frames[at - 1];
        if (f->code == code && f->line == line) return at - 1;
    }
    if (tables.nframes >= FRAME_MAX) return -1;
    tables.frames[tables.nframes] = (frame_entry){.code = code, .line = line};
    tables.frame_slots[slot] = ++tables.nframes;
    return tables.nframes - 1;
}

static int64_t stack_index(const uint32_t *frames, uint32_t depth)
{
    uint64_t h = depth;
    for (uint32_t i = 0; i < depth; i++) h = h * 0x100000001b3ull ^ frames[i];
    uint32_t slot = mix(h) & (STACK_SLOTS - 1);
    for (;; slot = (slot + 1) & (STACK_SLOTS - 1)) {
        uint32_t at = tables.stack_slots[slot];
        if (!at) break;
        const stack_entry *s = &tables.stacks[at - 1];
        if (s->depth == depth && !memcmp(s->frames, frames, depth * sizeof *frames)) return at - 1;
    }
    if (tables.nstacks >= STACK_MAX) return -1;
    stack_entry *s = &tables.stacks[tables.nstacks];
    s->depth = depth;
    memcpy(s->frames, frames, depth * sizeof *frames);
    tables.stack_slots[slot] = ++tables.nstacks;
    return tables.nstacks - 1;
}

/* Frees the tables. Dropping a code object's reference may run any code
 * (a weakref callback, a finalizer), this module's functions included:
 * the tables are detached first, so that what runs meanwhile finds none
 * (a capture keeps nothing, a reader gets empty tables, a new
 * configuration makes fresh ones), and only the detached copy's
 * references are dropped. */
static void tables_free(void)
{
    stack_tables old = tables;
    tables = (stack_tables){.depth = old.depth, .generation = old.generation + 1};
    for (uint32_t i = 0; i < old.ncodes; i++) {
        Py_DECREF(old.codes[i].code);
        Py_DECREF(old.codes[i].file);
        Py_DECREF(old.codes[i].name);
    }
    free(old.codes);
    free(old.code_slots);
    free(old.frames);
    free(old.frame_slots);
    free(old.stacks);
    free(old.stack_slots);
    Py_XDECREF(old.skip);
    Py_XDECREF(old.keep);
}

static int tables_alloc(void)
{
    if (tables.codes) return 0;
    tables.codes = calloc(CODE_MAX, sizeof *tables.codes);
    tables.code_slots = calloc(CODE_SLOTS, sizeof *tables.code_slots);
    tables.frames = calloc(FRAME_MAX, sizeof *tables.frames);
    tables.frame_slots = calloc(FRAME_SLOTS, sizeof *tables.frame_slots);
    tables.stacks = calloc(STACK_MAX, sizeof *tables.stacks);
    tables.stack_slots = calloc(STACK_SLOTS, sizeof *tables.stack_slots);
    if (tables.codes && tables.code_slots && tables.frames && tables.frame_slots && tables.stacks &&
        tables.stack_slots)
        return 0;
    tables_free();
    PyErr_NoMemory();
    return -1;
}

/* ------------------------------------------------------------------ */
/* Capture                                                             */
/* ------------------------------------------------------------------ */

/* The next frame out of `f` (a new reference, NULL at the outermost),
 * `f`'s reference given up. Reading f_back may make a frame object, and so
 * run a garbage collection. */
static PyFrameObject *frame_back(PyFrameObject *f)
{
    PyObject *back = PyObject_GetAttr((PyObject *)f, str_f_back);
    Py_DECREF(f);
    if (back == Py_None) Py_CLEAR(back);
    return (PyFrameObject *)back;
}

/* Walks out from `f` (its reference given up), putting the user frames
 * into frames[] until the depth is reached; *depth_out: how many. Returns
 * 0, TABLE_FULL or INTERRUPTED. */
static int walk(PyFrameObject *f, uint64_t generation, uint32_t *frames, uint32_t *depth_out)
{
    uint32_t depth = 0;
    int result = 0;
    for (int walked = 0; f && walked < WALK_LIMIT; walked++) {
        /* Checked after each step that may have run code, this one's
         * PyEval_GetFrame or f_back included. */
        if (generation != tables.generation) {
            result = INTERRUPTED;
            break;
        }
        if (depth >= (uint32_t)tables.depth) break;
        PyCodeObject *code = PyFrame_GetCode(f);
        int line = PyFrame_GetLineNumber(f);
        if (line < 0) line = 0; /* none known: a trace file keeps lines from 0 */
        int64_t c = code_index((PyObject *)code, generation);
        Py_DECREF(code);
        if (c >= 0 && tables.codes[c].user) {
            c = frame_index((uint32_t)c, line);
            if (c >= 0) frames[depth++] = (uint32_t)c;
        }
        if (c < 0) {
            result = (int)c;
            break;
        }
        f = frame_back(f);
    }
    Py_XDECREF(f);
    *depth_out = depth;
    return result;
}

/* The calling thread's stack as an id (index + 1), 0 for none. The main
 * interpreter's GIL is held. */
static uint32_t capture_now(void)
{
    if (!tables.codes) return 0;
    if (capturing) {
        skipped.reentrant++;
        return 0;
    }
    capturing = 1;
    uint64_t generation = tables.generation;
    uint32_t frames[STACK_MAX_DEPTH];
    uint32_t depth = 0;
    PyObject *exc_type, *exc_value, *exc_tb;
    PyErr_Fetch(&exc_type, &exc_value, &exc_tb);
    PyFrameObject *f = PyEval_GetFrame();
    Py_XINCREF(f);
    int result = walk(f, generation, frames, &depth);
    PyErr_Clear();
    if (!result && generation != tables.generation) result = INTERRUPTED;
    uint32_t id = 0;
    if (!result && depth) {
        int64_t s = stack_index(frames, depth);
        if (s < 0) result = TABLE_FULL;
        else id = (uint32_t)s + 1;
    }
    if (result == TABLE_FULL) skipped.table_full++;
    if (result == INTERRUPTED) skipped.interrupted++;
    PyErr_Restore(exc_type, exc_value, exc_tb);
    capturing = 0;
    return id;
}

/* The stack this thread set aside, while its epoch lasts. Reads no
 * Python state: the thread may not hold the GIL. */
static uint32_t set_aside_now(void)
{
    uint64_t p = pending;
    if (!p || (uint32_t)(p >> 32) != atomic_load_explicit(&epoch, memory_order_acquire)) return 0;
    return (uint32_t)p;
}

/* This thread's thread state when the thread holds the GIL, else NULL;
 * reads nothing another thread may free meanwhile. */
static PyThreadState *holding_thread_state(void)
{
    PyThreadState *t = gil_holder ? gil_holder() : NULL;
    if (!t || holder_is_per_thread) return t;
    /* 3.11: whichever thread holds the GIL; this one's only when it is the
     * thread state this thread registered. (A thread that switched to a
     * sub-interpreter's is taken as not holding it: it gets what it set
     * aside, never its frames.) */
    return t == PyGILState_GetThisThreadState() ? t : NULL;
}

static void count_other_interpreter(void)
{
    atomic_fetch_add_explicit(&skipped.other_interpreter, 1, memory_order_relaxed);
}

uint32_t vgpy_stack_source(void)
{
    PyThreadState *t = Py_IsInitialized() ? holding_thread_state() : NULL;
    if (t && PyThreadState_GetInterpreter(t) != main_interpreter) {
        count_other_interpreter();
        return 0;
    }
    /* With the GIL the frames say it best (a Python callback inside an
     * op); what was set aside serves where they name no user code. */
    uint32_t id = t ? capture_now() : 0;
    return id ? id : set_aside_now();
}

/* Python calls run with the GIL of the interpreter that calls them. */
static int in_main_interpreter(void)
{
    return PyInterpreterState_Get() == main_interpreter;
}

/* ------------------------------------------------------------------ */
/* From Python                                                         */
/* ------------------------------------------------------------------ */

static int prefix_tuple(PyObject *obj, const char *what, PyObject **out)
{
    PyObject *t = PySequence_Tuple(obj);
    if (!t) return -1;
    for (Py_ssize_t i = 0; i < PyTuple_Size(t); i++) {
        if (!PyUnicode_Check(PyTuple_GetItem(t, i))) {
            PyErr_Format(PyExc_TypeError, "%s must hold str path prefixes", what);
            Py_DECREF(t);
            return -1;
        }
    }
    *out = t;
    return 0;
}

/* Makes the tables and sets the rules; answers False, touching nothing,
 * in a sub-interpreter (its recording keeps no stacks, counted). */
static PyObject *stacks_configure(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *skip_obj, *keep_obj, *skip, *keep;
    int depth;
    if (!PyArg_ParseTuple(args, "OOi", &skip_obj, &keep_obj, &depth)) return NULL;
    if (depth < 1 || depth > STACK_MAX_DEPTH) {
        PyErr_Format(PyExc_ValueError, "stack_depth must be from 1 to %d frames, got %d",
                     STACK_MAX_DEPTH, depth);
        return NULL;
    }
    if (!in_main_interpreter()) Py_RETURN_FALSE;
    if (prefix_tuple(skip_obj, "skip", &skip) < 0) return NULL;
    if (prefix_tuple(keep_obj, "keep", &keep) < 0) {
        Py_DECREF(skip);
        return NULL;
    }
    if (tables_alloc() < 0) {
        Py_DECREF(skip);
        Py_DECREF(keep);
        return NULL;
    }
    /* The tables are kept: live blocks carry ids into them. */
    PyObject *old_skip = tables.skip, *old_keep = tables.keep;
    tables.skip = skip;
    tables.keep = keep;
    tables.depth = depth;
    Py_XDECREF(old_skip); /* last: freeing them may run code */
    Py_XDECREF(old_keep);
    Py_RETURN_TRUE;
}

/* A new epoch: what every thread set aside so far is never read again. */
static void void_set_aside(void)
{
    uint32_t next = atomic_load_explicit(&epoch, memory_order_relaxed) + 1;
    atomic_store_explicit(&epoch, next ? next : 1, memory_order_release);
    pending = 0;
}

static PyObject *stacks_release(PyObject *module, PyObject *unused)
{
    (void)module, (void)unused;
    if (!in_main_interpreter()) Py_RETURN_NONE; /* the tables are not its own */
    void_set_aside();
    tables_free();
    Py_RETURN_NONE;
}

static PyObject *stacks_void_set_aside(PyObject *module, PyObject *unused)
{
    (void)module, (void)unused;
    if (in_main_interpreter()) void_set_aside();
    Py_RETURN_NONE;
}

/* A capture asked for from Python: none in a sub-interpreter (counted). */
static uint32_t capture_from_python(void)
{
    if (in_main_interpreter()) return capture_now();
    if (tables.codes) count_other_interpreter();
    return 0;
}

static PyObject *stacks_capture(PyObject *module, PyObject *unused)
{
    (void)module, (void)unused;
    return PyLong_FromUnsignedLong(capture_from_python());
}

/* What stacks_push returns is the value set aside before it, whole
 * (epoch and id), for stacks_pop to put back. */
static PyObject *stacks_push(PyObject *module, PyObject *unused)
{
    (void)module, (void)unused;
    uint64_t before = pending;
    uint32_t now = capture_from_python();
    if (now) pending = (uint64_t)atomic_load_explicit(&epoch, memory_order_relaxed) << 32 | now;
    return PyLong_FromUnsignedLongLong(before);
}

static PyObject *stacks_pop(PyObject *module, PyObject *before)
{
    (void)module;
    unsigned long long value = PyLong_AsUnsignedLongLong(before);
    if (value == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    uint32_t of = (uint32_t)(value >> 32), id = (uint32_t)value;
    uint32_t now = atomic_load_explicit(&epoch, memory_order_relaxed);
    /* An earlier epoch's value is put back as it is (it is void); one of
     * this epoch must name a stack of the tables. */
    if ((value && (!of || !id || of > now)) || (of == now && id > tables.nstacks)) {
        PyErr_Format(PyExc_ValueError, "stacks_pop(%llu): not a value stacks_push returned", value);
        return NULL;
    }
    pending = value;
    Py_RETURN_NONE;
}

/* Each builds from a copy of its entry, holding its own references: an
 * object made may run a collection whose finalizers free the tables. */
static PyObject *frame_tuple(const frame_entry *entry)
{
    const frame_entry f = *entry;
    PyObject *file = tables.codes[f.code].file, *name = tables.codes[f.code].name;
    Py_INCREF(file);
    Py_INCREF(name);
    PyObject *line = PyLong_FromLong(f.line);
    PyObject *t = line ? PyTuple_Pack(3, file, line, name) : NULL;
    Py_XDECREF(line);
    Py_DECREF(file);
    Py_DECREF(name);
    return t;
}

static PyObject *stack_tuple(const stack_entry *entry)
{
    const stack_entry s = *entry;
    PyObject *t = PyTuple_New(s.depth);
    for (uint32_t i = 0; t && i < s.depth; i++) {
        PyObject *n = PyLong_FromUnsignedLong(s.frames[i]);
        if (!n || PyTuple_SetItem(t, i, n) < 0) Py_CLEAR(t);
    }
    return t;
}

/* Fills `frames` and `stacks` (lists of nframes and nstacks items) from
 * the tables; 1 when the tables were released or rebuilt meanwhile (each
 * object made may run a collection, and its finalizers any code), -1 on
 * an error. Entries below the counts never change within a generation. */
static int fill_table(PyObject *frames, PyObject *stacks, uint64_t generation)
{
    Py_ssize_t nframes = PyList_Size(frames), nstacks = PyList_Size(stacks);
    for (Py_ssize_t i = 0; i < nframes + nstacks; i++) {
        if (generation != tables.generation) return 1;
        PyObject *t = i < nframes ? frame_tuple(&tables.frames[i])
                                  : stack_tuple(&tables.stacks[i - nframes]);
        if (!t) return -1;
        if (i < nframes ? PyList_SetItem(frames, i, t) : PyList_SetItem(stacks, i - nframes, t)) return -1;
    }
    return generation != tables.generation;
}

/* (frames, stacks, dropped): frames as (file, line, function), stacks as
 * tuples of frame indices, innermost first; stack id n is stacks[n - 1].
 * A sub-interpreter is answered empty tables: they hold the main one's
 * objects. */
static PyObject *stacks_table(PyObject *module, PyObject *unused)
{
    (void)module, (void)unused;
    int own = in_main_interpreter();
    for (int attempt = 0; attempt < 4; attempt++) {
        uint64_t generation = tables.generation;
        PyObject *frames = PyList_New(own ? tables.nframes : 0);
        PyObject *stacks = frames ? PyList_New(own ? tables.nstacks : 0) : NULL;
        int rc = stacks ? fill_table(frames, stacks, generation) : -1;
        if (rc == 0)
            return Py_BuildValue("(NNK)", frames, stacks, (unsigned long long)skipped.table_full);
        Py_XDECREF(frames);
        Py_XDECREF(stacks);
        if (rc < 0) return NULL;
    }
    PyErr_SetString(PyExc_RuntimeError, "the stack tables were released again and again while read");
    return NULL;
}

static PyObject *stacks_counts(PyObject *module, PyObject *unused)
{
    (void)module, (void)unused;
    unsigned long long other = atomic_load_explicit(&skipped.other_interpreter, memory_order_relaxed);
    return Py_BuildValue("{sKsKsKsK}", "table_full", (unsigned long long)skipped.table_full,
                         "reentrant", (unsigned long long)skipped.reentrant, "interrupted",
                         (unsigned long long)skipped.interrupted, "other_interpreter", other);
}

static PyMethodDef stacks_methods[] = {
    {"stacks_configure", (PyCFunction)stacks_configure, METH_VARARGS,
     "stacks_configure(skip, keep, depth) -> bool\n\nMake the stack tables (kept when they exist: "
     "live blocks name their stacks by id) and set what a capture "
     "keeps: the innermost `depth` frames of user code, whose file starts with no prefix in "
     "`skip`, or with a longer one in `keep` than in `skip`. False in a sub-interpreter: stacks "
     "are kept for the main interpreter's threads only."},
    {"stacks_release", (PyCFunction)stacks_release, METH_NOARGS,
     "stacks_release()\n\nFree the stack tables; captures give 0 until configured again, and "
     "what any thread set aside is void."},
    {"stacks_void_set_aside", (PyCFunction)stacks_void_set_aside, METH_NOARGS,
     "stacks_void_set_aside()\n\nWhat every thread set aside with stacks_push is never read "
     "again (the last recording with stacks stopped)."},
    {"stacks_capture", (PyCFunction)stacks_capture, METH_NOARGS,
     "stacks_capture() -> int\n\nThe calling thread's stack id now (0: none)."},
    {"stacks_push", (PyCFunction)stacks_push, METH_NOARGS,
     "stacks_push() -> int\n\nSet the calling thread's stack aside for allocations made "
     "without the GIL; returns what to give stacks_pop."},
    {"stacks_pop", (PyCFunction)stacks_pop, METH_O,
     "stacks_pop(before)\n\nRestore what stacks_push returned (ValueError for any other "
     "value)."},
    {"stacks_table", (PyCFunction)stacks_table, METH_NOARGS,
     "stacks_table() -> (frames, stacks, dropped)\n\nThe interned frames (file, line, "
     "function), the stacks (tuples of frame indices, innermost first; id n is stacks[n-1]) "
     "and the captures that found a table full."},
    {"stacks_counts", (PyCFunction)stacks_counts, METH_NOARGS,
     "stacks_counts() -> dict\n\nCaptures that kept nothing since the process began, by "
     "reason: table_full, reentrant (inside another, from a collection's finalizer), "
     "interrupted (the tables were released meanwhile), other_interpreter."},
    {NULL, NULL, 0, NULL},
};

/* The GIL holder's accessor and the main interpreter, from the running
 * interpreter's own symbols (3.13 named the accessor public). Without
 * them no thread is taken to hold the GIL: no frames are read, and only
 * what was set aside serves. */
static void resolve_interpreter(void)
{
    const char *names[] = {"PyThreadState_GetUnchecked", "_PyThreadState_UncheckedGet"};
    for (size_t i = 0; i < sizeof names / sizeof *names && !gil_holder; i++) {
        void *sym = dlsym(RTLD_DEFAULT, names[i]);
        memcpy(&gil_holder, &sym, sizeof sym);
    }
    int major = 0, minor = 0;
    holder_is_per_thread = sscanf(Py_GetVersion(), "%d.%d", &major, &minor) == 2 &&
                           (major > 3 || (major == 3 && minor >= 12));
    PyInterpreterState *(*main_of)(void) = NULL;
    void *sym = dlsym(RTLD_DEFAULT, "PyInterpreterState_Main");
    memcpy(&main_of, &sym, sizeof sym);
    /* Failing that, the first to import the module: the main one, as a
     * rule. */
    main_interpreter = main_of ? main_of() : PyInterpreterState_Get();
}

int vgpy_stacks_init(PyObject *module)
{
    if (!str_f_back) {
        str_f_back = PyUnicode_InternFromString("f_back");
        str_co_filename = PyUnicode_InternFromString("co_filename");
        str_co_name = PyUnicode_InternFromString("co_name");
        if (!str_f_back || !str_co_filename || !str_co_name) return -1;
        resolve_interpreter();
    }
    if (PyModule_AddFunctions(module, stacks_methods) < 0) return -1;
    if (PyModule_AddIntConstant(module, "STACK_MAX_DEPTH", STACK_MAX_DEPTH) < 0) return -1;
    if (PyModule_AddIntConstant(module, "STACK_MAX_FRAMES", FRAME_MAX) < 0) return -1;
    if (PyModule_AddIntConstant(module, "STACK_MAX_STACKS", STACK_MAX) < 0) return -1;
    return 0;
}
