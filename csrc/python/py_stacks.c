/* The Python stack of each recorded allocation: which lines of user code
 * asked for the memory.
 *
 * A stack is captured on the allocating thread, before the heap's lock is
 * taken, and only where that thread already holds the GIL: the heap asks
 * vgpy_stack_source(), which looks at the thread's Python frames when
 * PyGILState_Check() says the GIL is held, and otherwise answers the stack
 * that Python code on this thread set aside before it entered a call that
 * releases the GIL (stacks_push; PyTorch's ops run without the GIL, so
 * vramguard.record(stacks=True) sets it from a torch function mode). The
 * GIL is never taken here: a thread that does not hold it gets no stack.
 *
 * Frames are interned: a table of code objects (classified once as user
 * code or not), of unique (code, line) frames and of unique stacks, all of
 * fixed capacity, so that a training loop that allocates from the same
 * lines costs hash lookups and no allocation, and a program that never
 * repeats itself fills the tables and then gets no stack (counted).
 *
 * The tables are shared by every recording and guarded by the GIL: every
 * function here runs with it held. Limited API notes: PyEval_GetFrame,
 * PyFrame_GetCode and PyFrame_GetLineNumber are in the stable ABI at 3.9;
 * PyFrame_GetBack is in none (the frame's f_back attribute serves), nor is
 * PyGILState_Check (resolved from the running interpreter with dlsym; every
 * CPython 3 exports it). */
#include "py_internal.h"

#include <dlfcn.h>
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
    uint64_t dropped; /* captures that found a table full */
} stack_tables;

static stack_tables tables;
static int (*gil_held)(void);
static PyObject *str_f_back, *str_co_filename, *str_co_name;
/* The stack set aside by Python code on this thread before a call that
 * releases the GIL; and whether a capture runs on this thread (a garbage
 * collection inside one can run code that allocates). */
static _Thread_local uint32_t pending;
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

/* The code table's index of `code`, added and classified on first sight;
 * -1 when the table is full or its names cannot be read. */
static int64_t code_index(PyObject *code)
{
    uint32_t slot = mix((uintptr_t)code) & (CODE_SLOTS - 1);
    for (;; slot = (slot + 1) & (CODE_SLOTS - 1)) {
        uint32_t at = tables.code_slots[slot];
        if (!at) break;
        if (tables.codes[at - 1].code == code) return at - 1;
    }
    if (tables.ncodes >= CODE_MAX) return -1;
    PyObject *file = PyObject_GetAttr(code, str_co_filename);
    PyObject *name = file ? PyObject_GetAttr(code, str_co_name) : NULL;
    if (!name) {
        Py_XDECREF(file);
        PyErr_Clear();
        return -1;
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

static void tables_clear(void)
{
    for (uint32_t i = 0; i < tables.ncodes; i++) {
        Py_DECREF(tables.codes[i].code);
        Py_DECREF(tables.codes[i].file);
        Py_DECREF(tables.codes[i].name);
    }
    if (tables.code_slots) memset(tables.code_slots, 0, CODE_SLOTS * sizeof *tables.code_slots);
    if (tables.frame_slots) memset(tables.frame_slots, 0, FRAME_SLOTS * sizeof *tables.frame_slots);
    if (tables.stack_slots) memset(tables.stack_slots, 0, STACK_SLOTS * sizeof *tables.stack_slots);
    tables.ncodes = tables.nframes = tables.nstacks = 0;
    tables.dropped = 0;
    tables.generation++;
}

static void tables_free(void)
{
    tables_clear();
    free(tables.codes);
    free(tables.code_slots);
    free(tables.frames);
    free(tables.frame_slots);
    free(tables.stacks);
    free(tables.stack_slots);
    tables.codes = NULL;
    tables.code_slots = tables.frame_slots = tables.stack_slots = NULL;
    tables.frames = NULL;
    tables.stacks = NULL;
    Py_CLEAR(tables.skip);
    Py_CLEAR(tables.keep);
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

/* The calling thread's stack as an id (index + 1), 0 for none. The GIL is
 * held. Frames are walked first (which may run a garbage collection, and
 * so other code), and each lookup leaves the tables whole, so whatever
 * runs meanwhile sees them consistent; a reset meanwhile voids the
 * capture. */
static uint32_t capture_now(void)
{
    if (!tables.codes || capturing) return 0;
    capturing = 1;
    uint64_t generation = tables.generation;
    uint32_t frames[STACK_MAX_DEPTH];
    uint32_t depth = 0;
    int full = 0;
    PyObject *exc_type, *exc_value, *exc_tb;
    PyErr_Fetch(&exc_type, &exc_value, &exc_tb);
    PyFrameObject *f = PyEval_GetFrame();
    Py_XINCREF(f);
    for (int walked = 0; f && walked < WALK_LIMIT && depth < (uint32_t)tables.depth; walked++) {
        PyCodeObject *code = PyFrame_GetCode(f);
        int line = PyFrame_GetLineNumber(f);
        if (line < 0) line = 0; /* none known: a trace file keeps lines from 0 */
        int64_t c = code_index((PyObject *)code);
        Py_DECREF(code);
        if (c < 0) {
            full = 1;
            break;
        }
        if (tables.codes[c].user) {
            int64_t at = frame_index((uint32_t)c, line);
            if (at < 0) {
                full = 1;
                break;
            }
            frames[depth++] = (uint32_t)at;
        }
        PyObject *back = PyObject_GetAttr((PyObject *)f, str_f_back);
        Py_DECREF(f);
        f = back && back != Py_None ? (PyFrameObject *)back : NULL;
        if (back == Py_None) Py_DECREF(back);
    }
    Py_XDECREF(f);
    PyErr_Clear();
    uint32_t id = 0;
    if (!full && depth && generation == tables.generation) {
        int64_t s = stack_index(frames, depth);
        if (s < 0) full = 1;
        else id = (uint32_t)s + 1;
    }
    if (full && generation == tables.generation) tables.dropped++;
    PyErr_Restore(exc_type, exc_value, exc_tb);
    capturing = 0;
    return id;
}

uint32_t vgpy_stack_source(void)
{
    if (pending) return pending;
    if (!gil_held || !Py_IsInitialized() || !gil_held()) return 0;
    return capture_now();
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
    Py_XDECREF(tables.skip);
    Py_XDECREF(tables.keep);
    tables.skip = skip;
    tables.keep = keep;
    tables.depth = depth;
    Py_RETURN_NONE;
}

static PyObject *stacks_release(PyObject *module, PyObject *unused)
{
    (void)module, (void)unused;
    tables_free();
    pending = 0;
    Py_RETURN_NONE;
}

static PyObject *stacks_capture(PyObject *module, PyObject *unused)
{
    (void)module, (void)unused;
    return PyLong_FromUnsignedLong(capture_now());
}

static PyObject *stacks_push(PyObject *module, PyObject *unused)
{
    (void)module, (void)unused;
    uint32_t before = pending;
    uint32_t now = capture_now();
    pending = now ? now : before;
    return PyLong_FromUnsignedLong(before);
}

static PyObject *stacks_pop(PyObject *module, PyObject *before)
{
    (void)module;
    unsigned long value = PyLong_AsUnsignedLong(before);
    if (value == (unsigned long)-1 && PyErr_Occurred()) return NULL;
    pending = (uint32_t)value;
    Py_RETURN_NONE;
}

static PyObject *frame_tuple(const frame_entry *f)
{
    const code_entry *c = &tables.codes[f->code];
    return Py_BuildValue("(OiO)", c->file, (int)f->line, c->name);
}

static PyObject *stack_tuple(const stack_entry *s)
{
    PyObject *t = PyTuple_New(s->depth);
    for (uint32_t i = 0; t && i < s->depth; i++) {
        PyObject *n = PyLong_FromUnsignedLong(s->frames[i]);
        if (!n || PyTuple_SetItem(t, i, n) < 0) Py_CLEAR(t);
    }
    return t;
}

/* (frames, stacks, dropped): frames as (file, line, function), stacks as
 * tuples of frame indices, innermost first; stack id n is stacks[n - 1]. */
static PyObject *stacks_table(PyObject *module, PyObject *unused)
{
    (void)module, (void)unused;
    PyObject *frames = PyList_New(tables.nframes);
    PyObject *stacks = frames ? PyList_New(tables.nstacks) : NULL;
    if (!stacks) goto fail;
    for (uint32_t i = 0; i < tables.nframes; i++) {
        PyObject *t = frame_tuple(&tables.frames[i]);
        if (!t || PyList_SetItem(frames, i, t) < 0) goto fail;
    }
    for (uint32_t i = 0; i < tables.nstacks; i++) {
        PyObject *t = stack_tuple(&tables.stacks[i]);
        if (!t || PyList_SetItem(stacks, i, t) < 0) goto fail;
    }
    return Py_BuildValue("(NNK)", frames, stacks, (unsigned long long)tables.dropped);
fail:
    Py_XDECREF(frames);
    Py_XDECREF(stacks);
    return NULL;
}

static PyMethodDef stacks_methods[] = {
    {"stacks_configure", (PyCFunction)stacks_configure, METH_VARARGS,
     "stacks_configure(skip, keep, depth)\n\nMake the stack tables (kept when they exist: live "
     "blocks name their stacks by id) and set what a capture "
     "keeps: the innermost `depth` frames of user code, whose file starts with no prefix in "
     "`skip`, or with a longer one in `keep` than in `skip`."},
    {"stacks_release", (PyCFunction)stacks_release, METH_NOARGS,
     "stacks_release()\n\nFree the stack tables; captures give 0 until configured again."},
    {"stacks_capture", (PyCFunction)stacks_capture, METH_NOARGS,
     "stacks_capture() -> int\n\nThe calling thread's stack id now (0: none)."},
    {"stacks_push", (PyCFunction)stacks_push, METH_NOARGS,
     "stacks_push() -> int\n\nSet the calling thread's stack aside for allocations made "
     "without the GIL; returns what to give stacks_pop."},
    {"stacks_pop", (PyCFunction)stacks_pop, METH_O,
     "stacks_pop(before)\n\nRestore what stacks_push returned."},
    {"stacks_table", (PyCFunction)stacks_table, METH_NOARGS,
     "stacks_table() -> (frames, stacks, dropped)\n\nThe interned frames (file, line, "
     "function), the stacks (tuples of frame indices, innermost first; id n is stacks[n-1]) "
     "and the captures that found a table full."},
    {NULL, NULL, 0, NULL},
};

int vgpy_stacks_init(PyObject *module)
{
    if (!str_f_back) {
        str_f_back = PyUnicode_InternFromString("f_back");
        str_co_filename = PyUnicode_InternFromString("co_filename");
        str_co_name = PyUnicode_InternFromString("co_name");
        if (!str_f_back || !str_co_filename || !str_co_name) return -1;
        void *sym = dlsym(RTLD_DEFAULT, "PyGILState_Check");
        memcpy(&gil_held, &sym, sizeof sym);
    }
    if (PyModule_AddFunctions(module, stacks_methods) < 0) return -1;
    if (PyModule_AddIntConstant(module, "STACK_MAX_DEPTH", STACK_MAX_DEPTH) < 0) return -1;
    if (PyModule_AddIntConstant(module, "STACK_MAX_FRAMES", FRAME_MAX) < 0) return -1;
    if (PyModule_AddIntConstant(module, "STACK_MAX_STACKS", STACK_MAX) < 0) return -1;
    return 0;
}
