/* Replay and recording from Python. Traces cross as bytes holding
 * little-endian columns, so a million-op trace costs four objects, not a
 * million. */
#include "py_internal.h"
#include "vramguard/expandable.h"

#include <string.h>

/* The columns of a trace, checked for consistent lengths. */
static int parse_columns(PyObject *kinds, PyObject *ids, PyObject *sizes, PyObject *streams,
                         PyObject *nids_obj, vg_trace_ops *t)
{
    char *k, *i, *s, *st = NULL;
    Py_ssize_t nk, ni, ns, nst = 0;
    uint64_t nids;
    if (vgpy_as_u64(nids_obj, "nids", &nids) < 0) return -1;
    if (PyBytes_AsStringAndSize(kinds, &k, &nk) < 0) return -1;
    if (PyBytes_AsStringAndSize(ids, &i, &ni) < 0) return -1;
    if (PyBytes_AsStringAndSize(sizes, &s, &ns) < 0) return -1;
    if (streams && PyBytes_AsStringAndSize(streams, &st, &nst) < 0) return -1;
    if (ni != 4 * nk || ns != 8 * nk || (streams && nst != 8 * nk)) {
        PyErr_Format(PyExc_ValueError,
                     "trace columns disagree: %zd kinds, %zd id bytes (want %zd), %zd size bytes "
                     "(want %zd), %zd stream bytes (want %zd)",
                     nk, ni, 4 * nk, ns, 8 * nk, nst, 8 * nk);
        return -1;
    }
    if (nids > (uint64_t)UINT32_MAX + 1) { /* ids are u32 */
        PyErr_SetString(PyExc_ValueError, "nids must be at most 2**32");
        return -1;
    }
    t->kinds = (const uint8_t *)k;
    t->ids = (const uint32_t *)(const void *)i;
    t->sizes = (const uint64_t *)(const void *)s;
    t->streams = (const uint64_t *)(const void *)st;
    t->n = (size_t)nk;
    t->nids = (size_t)nids;
    return 0;
}

/* ValueError naming the op at fault, or the trace as a whole. */
static int validate(const vg_trace_ops *t)
{
    size_t bad = 0;
    const char *err = vg_trace_validate(t, &bad);
    if (!err) return 0;
    if (err == vg_trace_out_of_memory) PyErr_NoMemory();
    else if (bad == SIZE_MAX) PyErr_Format(PyExc_ValueError, "invalid trace: %s", err);
    else PyErr_Format(PyExc_ValueError, "invalid trace at op %zu: %s", bad, err);
    return -1;
}

static PyObject *samples_list(const vg_replay_sample *samples, uint64_t n)
{
    PyObject *list = PyList_New(0);
    for (uint64_t j = 0; list && j < n; j++) {
        PyObject *row = Py_BuildValue("(KKKK)", (unsigned long long)samples[j].op,
                                      (unsigned long long)samples[j].requested,
                                      (unsigned long long)samples[j].allocated,
                                      (unsigned long long)samples[j].reserved);
        if (!row || PyList_Append(list, row) < 0) Py_CLEAR(list);
        Py_XDECREF(row);
    }
    return list;
}

PyObject *vgpy_heap_replay(HeapObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"kinds", "ids", "sizes", "streams", "nids", "samples", NULL};
    PyObject *kinds, *ids, *sizes, *streams, *nids;
    Py_ssize_t nsamples = 1000;
    if (!vgpy_heap_ready(self) ||
        !PyArg_ParseTupleAndKeywords(args, kwargs, "SSSSO|n", kwlist, &kinds, &ids, &sizes,
                                     &streams, &nids, &nsamples))
        return NULL;
    /* A replay drives the heap from C and reads its counters unlocked: a
     * heap that PyTorch allocates from must never be handed to it. */
    if (self->borrowed) {
        PyErr_SetString(PyExc_RuntimeError,
                        "replay needs a heap of its own: this is a device heap, in use by "
                        "PyTorch; replay on vramguard.Heap(capacity) or use vramguard.replay()");
        return NULL;
    }
    vg_trace_ops t;
    if (parse_columns(kinds, ids, sizes, streams, nids, &t) < 0) return NULL;
    if (nsamples < 0) {
        PyErr_SetString(PyExc_ValueError, "samples must not be negative");
        return NULL;
    }
    if (validate(&t) < 0) return NULL;
    vg_replay_sample *samples = nsamples ? PyMem_Calloc((size_t)nsamples, sizeof *samples) : NULL;
    if (nsamples && !samples) return PyErr_NoMemory();
    size_t window = nsamples ? (t.n + (size_t)nsamples - 1) / (size_t)nsamples : 1;
    vg_replay_result r;
    int rc;
    /* Other threads run during a long replay; the heap refuses them meanwhile
     * (the replay reads its counters as it goes). The trace's bytes objects
     * are immutable and held by the arguments. */
    if (!vgpy_heap_begin_unlocked(self, 1)) {
        PyMem_Free(samples);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    rc = vg_replay(self->heap, &t, samples, (size_t)nsamples, window ? window : 1, &r);
    Py_END_ALLOW_THREADS
    vgpy_heap_end_unlocked(self, 1);
    if (rc != VG_OK) {
        PyMem_Free(samples);
        return PyErr_NoMemory();
    }
    PyObject *curve = samples_list(samples, r.samples);
    PyMem_Free(samples);
    if (!curve) return NULL;
    PyObject *d = Py_BuildValue(
        "{s:K,s:K,s:K,s:K,s:L,s:K,s:K,s:K,s:K,s:K,s:K,s:d,s:N}", "ops", (unsigned long long)r.ops,
        "allocs", (unsigned long long)r.allocs, "frees", (unsigned long long)r.frees, "ooms",
        (unsigned long long)r.ooms, "first_oom", (long long)r.first_oom, "peak_requested_bytes",
        (unsigned long long)r.peak_requested, "peak_allocated_bytes",
        (unsigned long long)r.peak_allocated, "peak_reserved_bytes",
        (unsigned long long)r.peak_reserved, "device_alloc", (unsigned long long)r.device_alloc,
        "device_free", (unsigned long long)r.device_free, "alloc_retries",
        (unsigned long long)r.alloc_retries, "seconds", r.seconds, "curve", curve);
    return d;
}

PyObject *vgpy_trace_peak_live(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *kinds, *ids, *sizes, *nids;
    if (!PyArg_ParseTuple(args, "SSSO", &kinds, &ids, &sizes, &nids)) return NULL;
    vg_trace_ops t;
    if (parse_columns(kinds, ids, sizes, NULL, nids, &t) < 0 || validate(&t) < 0) return NULL;
    uint64_t peak = 0;
    int rc;
    Py_BEGIN_ALLOW_THREADS /* the bytes objects are immutable and held by args */
    rc = vg_trace_peak_live(&t, &peak);
    Py_END_ALLOW_THREADS
    if (rc == VG_ERR_ARG) {
        PyErr_SetString(PyExc_ValueError, "invalid trace: more than 2**64 bytes live at once");
        return NULL;
    }
    if (rc != VG_OK) return PyErr_NoMemory();
    return PyLong_FromUnsignedLongLong(peak);
}

/* The replay's dict: Heap.replay's keys, then the emulation's own. */
static PyObject *expandable_dict(const vg_expandable_result *x, PyObject *curve)
{
    const vg_replay_result *r = &x->replay;
    return Py_BuildValue(
        "{s:K,s:K,s:K,s:K,s:L,s:K,s:K,s:K,s:K,s:K,s:K,s:d,s:N,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K}",
        "ops", (unsigned long long)r->ops, "allocs", (unsigned long long)r->allocs, "frees",
        (unsigned long long)r->frees, "ooms", (unsigned long long)r->ooms, "first_oom",
        (long long)r->first_oom, "peak_requested_bytes", (unsigned long long)r->peak_requested,
        "peak_allocated_bytes", (unsigned long long)r->peak_allocated, "peak_reserved_bytes",
        (unsigned long long)r->peak_reserved, "device_alloc", (unsigned long long)r->device_alloc,
        "device_free", (unsigned long long)r->device_free, "alloc_retries",
        (unsigned long long)r->alloc_retries, "seconds", r->seconds, "curve", curve, "map_calls",
        (unsigned long long)x->map_calls, "map_pages", (unsigned long long)x->map_pages,
        "unmap_calls", (unsigned long long)x->unmap_calls, "unmap_pages",
        (unsigned long long)x->unmap_pages, "stream_syncs", (unsigned long long)x->stream_syncs,
        "device_syncs", (unsigned long long)x->device_syncs, "segments_created",
        (unsigned long long)x->segments_created, "peak_segments",
        (unsigned long long)x->peak_segments);
}

PyObject *vgpy_expandable_replay(PyObject *module, PyObject *args, PyObject *kwargs)
{
    (void)module;
    static char *kwlist[] = {"kinds",   "ids",          "sizes",      "streams",    "nids",
                             "budget",  "samples",      "device_total", "large_page",
                             "small_page", NULL};
    PyObject *kinds, *ids, *sizes, *streams, *nids;
    PyObject *budget_obj = NULL, *total_obj = NULL, *large_obj = NULL, *small_obj = NULL;
    Py_ssize_t nsamples = 1000;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "SSSSO|OnOOO", kwlist, &kinds, &ids, &sizes,
                                     &streams, &nids, &budget_obj, &nsamples, &total_obj,
                                     &large_obj, &small_obj))
        return NULL;
    vg_expandable_config config = {0, 0, 0, 0};
    if ((budget_obj && vgpy_as_u64(budget_obj, "budget", &config.budget) < 0) ||
        (total_obj && vgpy_as_u64(total_obj, "device_total", &config.device_total) < 0) ||
        (large_obj && vgpy_as_u64(large_obj, "large_page", &config.large_page) < 0) ||
        (small_obj && vgpy_as_u64(small_obj, "small_page", &config.small_page) < 0))
        return NULL;
    if (nsamples < 0) {
        PyErr_SetString(PyExc_ValueError, "samples must not be negative");
        return NULL;
    }
    vg_trace_ops t;
    if (parse_columns(kinds, ids, sizes, streams, nids, &t) < 0 || validate(&t) < 0) return NULL;
    vg_replay_sample *samples = nsamples ? PyMem_Calloc((size_t)nsamples, sizeof *samples) : NULL;
    if (nsamples && !samples) return PyErr_NoMemory();
    size_t window = nsamples ? (t.n + (size_t)nsamples - 1) / (size_t)nsamples : 1;
    vg_expandable_result r;
    int rc;
    Py_BEGIN_ALLOW_THREADS /* the bytes objects are immutable and held by args */
    rc = vg_expandable_replay(&t, &config, samples, (size_t)nsamples, window ? window : 1, &r);
    Py_END_ALLOW_THREADS
    if (rc != VG_OK) {
        PyMem_Free(samples);
        if (rc == VG_ERR_ARG) {
            PyErr_SetString(PyExc_ValueError,
                            "page sizes must be positive multiples of 2 MiB and device_total "
                            "at most 2**56 bytes");
            return NULL;
        }
        return PyErr_NoMemory();
    }
    PyObject *curve = samples_list(samples, r.replay.samples);
    PyMem_Free(samples);
    if (!curve) return NULL;
    return expandable_dict(&r, curve);
}

/* ------------------------------------------------------------------ */
/* Recording                                                           */
/* ------------------------------------------------------------------ */

PyObject *vgpy_heap_history_start(HeapObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"capacity", "stacks", NULL};
    Py_ssize_t capacity = 1 << 20;
    int stacks = 0;
    if (!vgpy_heap_ready(self) ||
        !PyArg_ParseTupleAndKeywords(args, kwargs, "|np", kwlist, &capacity, &stacks))
        return NULL;
    if (capacity <= 0 || (uint64_t)capacity > ((uint64_t)1 << 32)) {
        PyErr_SetString(PyExc_ValueError, "capacity must be between 1 and 2**32 events");
        return NULL;
    }
    int rc = vg_heap_history_start_stacks(self->heap, (size_t)capacity,
                                          stacks ? vgpy_stack_source : NULL);
    if (rc == VG_ERR_BUSY) {
        PyErr_SetString(PyExc_RuntimeError,
                        vg_heap_history_active(self->heap)
                            ? "this heap is being recorded already: recordings do not nest "
                              "(stop the running one first)"
                            : "the last recording of this heap stopped with events not yet "
                              "taken: call history_take() first");
        return NULL;
    }
    if (rc != VG_OK) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

PyObject *vgpy_heap_history_stop(HeapObject *self, PyObject *unused)
{
    (void)unused;
    if (!vgpy_heap_ready(self)) return NULL;
    vg_heap_history_stop(self->heap);
    Py_RETURN_NONE;
}

/* Drain the heap's ring into one bytes object of packed vg_history_event
 * records; returns (bytes, dropped). */
PyObject *vgpy_take_events(vg_heap *h)
{
    enum { CHUNK = 65536 };
    vg_history_event *buf = PyMem_Malloc(CHUNK * sizeof *buf);
    PyObject *chunks = PyList_New(0);
    uint64_t dropped = 0;
    if (!buf || !chunks) {
        PyMem_Free(buf);
        Py_XDECREF(chunks);
        return PyErr_NoMemory();
    }
    for (;;) {
        size_t n = vg_heap_history_take(h, buf, CHUNK, &dropped);
        if (!n) break;
        PyObject *b = PyBytes_FromStringAndSize((const char *)buf, (Py_ssize_t)(n * sizeof *buf));
        if (!b || PyList_Append(chunks, b) < 0) {
            Py_XDECREF(b);
            Py_DECREF(chunks);
            PyMem_Free(buf);
            return NULL;
        }
        Py_DECREF(b);
    }
    PyMem_Free(buf);
    PyObject *empty = PyBytes_FromStringAndSize("", 0);
    PyObject *joined = empty ? PyObject_CallMethod(empty, "join", "O", chunks) : NULL;
    Py_XDECREF(empty);
    Py_DECREF(chunks);
    if (!joined) return NULL;
    return Py_BuildValue("(NK)", joined, (unsigned long long)dropped);
}

PyObject *vgpy_heap_history_take(HeapObject *self, PyObject *unused)
{
    (void)unused;
    if (!vgpy_heap_ready(self)) return NULL;
    return vgpy_take_events(self->heap);
}
