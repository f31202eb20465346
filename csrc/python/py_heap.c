/* vramguard._core.Heap: a heap over a simulated device, for tests, replays
 * and anyone without a GPU. */
#include "py_internal.h"

#include <string.h>

#include "structmember.h"

/* The policy named by `obj` (None: "vramguard"). torch-expandable is an
 * emulation that vramguard.replay() runs, not a heap's policy, so the
 * message names where it is taken. */
static const vg_policy *policy_named(PyObject *obj)
{
    if (!obj) return vg_policy_named("vramguard");
    if (!PyUnicode_Check(obj)) {
        PyObject *type_name = PyObject_GetAttrString((PyObject *)Py_TYPE(obj), "__name__");
        if (type_name)
            PyErr_Format(PyExc_TypeError,
                         "policy must be a str ('vramguard', 'arena', 'segments' or 'torch'), not %S",
                         type_name);
        Py_XDECREF(type_name);
        return NULL;
    }
    PyObject *utf8 = PyUnicode_AsUTF8String(obj);
    if (!utf8) return NULL;
    const vg_policy *policy = vg_policy_named(PyBytes_AsString(utf8));
    Py_DECREF(utf8);
    if (!policy)
        PyErr_Format(PyExc_ValueError,
                     "unknown policy %R: a Heap takes 'vramguard' (the recommended one, now '%s'), "
                     "'arena', 'segments' or 'torch'; vramguard.replay() and min_budget() also "
                     "take 'torch-expandable'",
                     obj, vg_policy_recommended());
    return policy;
}

/* The simulated device's page size: None keeps its default (2 MiB), 0
 * takes its virtual memory away (the arena then falls back to segments). */
static int set_page_size(vg_device *dev, PyObject *obj)
{
    if (obj == Py_None) return 0;
    uint64_t page;
    if (vgpy_as_size(obj, "page_size", &page) < 0) return -1;
    if (vg_sim_set_page_size(dev, (size_t)page) != VG_OK) {
        PyErr_SetString(PyExc_ValueError,
                        "page_size must be 0 or a power of two from 512 bytes to 2 MiB");
        return -1;
    }
    return 0;
}

static int Heap_init(HeapObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"capacity", "budget", "gc_threshold", "policy", "page_size", NULL};
    PyObject *capacity_obj, *budget_obj = Py_None, *gc_obj = Py_None, *page_obj = Py_None;
    PyObject *policy_obj = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|OOOO", kwlist, &capacity_obj, &budget_obj,
                                     &gc_obj, &policy_obj, &page_obj))
        return -1;
    /* A first __init__ that failed leaves nothing behind (below); a device
     * without a heap would be one, so both are checked. */
    if (self->heap || self->dev) {
        PyErr_SetString(PyExc_RuntimeError, "Heap is already initialised");
        return -1;
    }
    uint64_t capacity, budget;
    double gc;
    if (vgpy_as_size(capacity_obj, "capacity", &capacity) < 0) return -1;
    if (capacity == 0 || capacity > ((uint64_t)1 << 56)) {
        PyErr_SetString(PyExc_ValueError, "capacity must be between 1 byte and 64 PiB");
        return -1;
    }
    if (vgpy_as_budget(budget_obj, &budget) < 0) return -1;
    if (vgpy_as_fraction(gc_obj, "gc_threshold", &gc) < 0) return -1;
    const vg_policy *policy = policy_named(policy_obj);
    if (!policy) return -1;
    vg_device *dev = vg_sim_create((size_t)capacity);
    if (dev && set_page_size(dev, page_obj) < 0) {
        dev->ops->destroy(dev);
        return -1;
    }
    vg_heap_config cfg = {policy, (size_t)budget, gc};
    vg_heap *heap = dev ? vg_heap_create(dev, &cfg) : NULL;
    if (!heap) {
        if (dev) dev->ops->destroy(dev);
        PyErr_NoMemory();
        return -1;
    }
    self->dev = dev;
    self->heap = heap;
    self->capacity = capacity;
    self->device_kind = "Simulated device";
    return 0;
}

static void Heap_dealloc(HeapObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    if (self->weakrefs) PyObject_ClearWeakRefs((PyObject *)self);
    if (!self->borrowed) {
        vg_heap_destroy(self->heap);
        if (self->dev) self->dev->ops->destroy(self->dev);
    }
    freefunc tp_free = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    tp_free(self);
    Py_DECREF(tp);
}

int vgpy_heap_ready(HeapObject *self)
{
    if (!self->heap) {
        PyErr_SetString(PyExc_RuntimeError, "Heap.__init__ was not called");
        return 0;
    }
    if (self->replaying) {
        PyErr_SetString(PyExc_RuntimeError,
                        "this Heap is replaying a trace in another thread; use it after the replay");
        return 0;
    }
    return 1;
}

/* Every heap call is thread-safe on its own; a replay is not a heap call but
 * a sequence of them that reads the heap's counters as it goes, so it wants
 * the heap alone. */
int vgpy_heap_begin_unlocked(HeapObject *self, int exclusive)
{
    if (!vgpy_heap_ready(self)) return 0;
    if (exclusive && self->gil_released_calls) {
        PyErr_SetString(PyExc_RuntimeError,
                        "this Heap is in use by another thread; a replay needs it alone");
        return 0;
    }
    if (exclusive) self->replaying = 1;
    else self->gil_released_calls++;
    return 1;
}

void vgpy_heap_end_unlocked(HeapObject *self, int exclusive)
{
    if (exclusive) self->replaying = 0;
    else self->gil_released_calls--;
}

/* ------------------------------------------------------------------ */
/* Allocation                                                          */
/* ------------------------------------------------------------------ */

/* A device heap's (borrowed) allocation may reserve, release or wait for
 * the device on the out-of-memory path (cudaMalloc, cudaFree, a
 * synchronize): without the GIL, so that other Python threads run
 * meanwhile. A simulated heap's never waits, and keeps the GIL (cheaper). */
static void *alloc_device_aware(HeapObject *self, size_t size, vg_stream_t stream, vg_oom_info *oom,
                                int *refused)
{
    *refused = 0;
    if (!self->borrowed) return vg_heap_alloc(self->heap, size, stream, oom);
    if (!vgpy_heap_begin_unlocked(self, 0)) {
        *refused = 1;
        return NULL;
    }
    void *p;
    Py_BEGIN_ALLOW_THREADS
    p = vg_heap_alloc(self->heap, size, stream, oom);
    Py_END_ALLOW_THREADS
    vgpy_heap_end_unlocked(self, 0);
    return p;
}

static PyObject *Heap_malloc(HeapObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"size", "stream", NULL};
    PyObject *size_obj, *stream_obj = NULL;
    if (!vgpy_heap_ready(self) ||
        !PyArg_ParseTupleAndKeywords(args, kwargs, "O|O", kwlist, &size_obj, &stream_obj))
        return NULL;
    uint64_t size, stream = 0;
    if (vgpy_as_u64(size_obj, "size", &size) < 0) return NULL;
    if (stream_obj && vgpy_as_u64(stream_obj, "stream", &stream) < 0) return NULL;
    if (size == 0) {
        vg_heap_alloc(self->heap, 0, (vg_stream_t)stream, NULL); /* counted */
        return PyLong_FromLong(0);
    }
    vg_oom_info oom = {0};
    int refused;
    void *p = alloc_device_aware(self, (size_t)size, (vg_stream_t)stream, &oom, &refused);
    if (refused) return NULL;
    if (!p) {
        if (self->borrowed && oom.status == VG_ERR_NOMEM) vg_devices_note_oom(self->heap, &oom);
        vgpy_raise_oom(&oom, self->device_kind);
        return NULL;
    }
    return PyLong_FromUnsignedLongLong((uintptr_t)p);
}

static PyObject *Heap_free(HeapObject *self, PyObject *addr_obj)
{
    uint64_t addr;
    if (!vgpy_heap_ready(self) || vgpy_as_u64(addr_obj, "address", &addr) < 0) return NULL;
    if (vg_heap_free(self->heap, (void *)(uintptr_t)addr) != VG_OK) {
        char hex[24];
        PyErr_Format(PyExc_ValueError,
                     "free(%s): not a live block of this heap (never allocated, "
                     "already freed, or not the start of a block)",
                     vgpy_hex(addr, hex, sizeof hex));
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *Heap_record_stream(HeapObject *self, PyObject *args)
{
    PyObject *addr_obj, *stream_obj;
    uint64_t addr, stream;
    if (!vgpy_heap_ready(self) || !PyArg_ParseTuple(args, "OO", &addr_obj, &stream_obj)) return NULL;
    if (vgpy_as_u64(addr_obj, "address", &addr) < 0) return NULL;
    if (vgpy_as_u64(stream_obj, "stream", &stream) < 0) return NULL;
    int rc = vg_heap_record_stream(self->heap, (void *)(uintptr_t)addr, (vg_stream_t)stream);
    if (rc == VG_ERR_INVALID) {
        char hex[24];
        PyErr_Format(PyExc_ValueError, "record_stream(%s): not a live block of this heap",
                     vgpy_hex(addr, hex, sizeof hex));
        return NULL;
    }
    if (rc != VG_OK) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *Heap_block_size(HeapObject *self, PyObject *addr_obj)
{
    uint64_t addr;
    if (!vgpy_heap_ready(self) || vgpy_as_u64(addr_obj, "address", &addr) < 0) return NULL;
    return PyLong_FromSize_t(vg_heap_block_size(self->heap, (void *)(uintptr_t)addr));
}

/* ------------------------------------------------------------------ */
/* Cache control and the simulated device                              */
/* ------------------------------------------------------------------ */

/* These wait for the device: other Python threads run meanwhile. */
static PyObject *Heap_empty_cache(HeapObject *self, PyObject *unused)
{
    (void)unused;
    if (!vgpy_heap_begin_unlocked(self, 0)) return NULL;
    size_t released;
    Py_BEGIN_ALLOW_THREADS
    released = vg_heap_empty_cache(self->heap);
    Py_END_ALLOW_THREADS
    vgpy_heap_end_unlocked(self, 0);
    return PyLong_FromSize_t(released);
}

static PyObject *Heap_synchronize(HeapObject *self, PyObject *unused)
{
    (void)unused;
    if (!vgpy_heap_begin_unlocked(self, 0)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    vg_heap_synchronize(self->heap);
    Py_END_ALLOW_THREADS
    vgpy_heap_end_unlocked(self, 0);
    Py_RETURN_NONE;
}

static PyObject *Heap_reset_peaks(HeapObject *self, PyObject *unused)
{
    (void)unused;
    if (!vgpy_heap_ready(self)) return NULL;
    vg_heap_reset_peaks(self->heap);
    Py_RETURN_NONE;
}

static PyObject *Heap_reset_accumulated(HeapObject *self, PyObject *unused)
{
    (void)unused;
    if (!vgpy_heap_ready(self)) return NULL;
    vg_heap_reset_accumulated(self->heap);
    Py_RETURN_NONE;
}

static PyObject *Heap_complete_stream(HeapObject *self, PyObject *args)
{
    PyObject *stream_obj;
    int device = -1;
    uint64_t stream;
    if (!vgpy_heap_ready(self) || !PyArg_ParseTuple(args, "O|i", &stream_obj, &device)) return NULL;
    if (vgpy_as_u64(stream_obj, "stream", &stream) < 0) return NULL;
    /* vg_sim_* ignore devices that are not simulated. */
    if (device < 0) vg_sim_complete_stream(self->dev, (vg_stream_t)stream);
    else vg_sim_complete_stream_of(self->dev, device, (vg_stream_t)stream);
    Py_RETURN_NONE;
}

static PyObject *Heap_fail_nth(HeapObject *self, PyObject *n_obj)
{
    uint64_t n;
    if (!vgpy_heap_ready(self) || vgpy_as_u64(n_obj, "n", &n) < 0) return NULL;
    vg_sim_fail_nth(self->dev, n);
    Py_RETURN_NONE;
}

static PyObject *Heap_fail_device(HeapObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"n", "sticky", NULL};
    PyObject *n_obj;
    int sticky = 0;
    uint64_t n;
    if (!vgpy_heap_ready(self) ||
        !PyArg_ParseTupleAndKeywords(args, kwargs, "O|p", kwlist, &n_obj, &sticky))
        return NULL;
    if (vgpy_as_u64(n_obj, "n", &n) < 0) return NULL;
    vg_sim_fail_device(self->dev, n, sticky);
    Py_RETURN_NONE;
}

static PyObject *Heap_fail_random(HeapObject *self, PyObject *args)
{
    double p;
    unsigned long long seed = 0;
    if (!vgpy_heap_ready(self) || !PyArg_ParseTuple(args, "d|K", &p, &seed)) return NULL;
    if (!(p >= 0.0 && p <= 1.0)) {
        PyErr_SetString(PyExc_ValueError, "probability must be in [0, 1]");
        return NULL;
    }
    vg_sim_fail_random(self->dev, p, seed);
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ */
/* Reading                                                             */
/* ------------------------------------------------------------------ */

static PyObject *Heap_stats(HeapObject *self, PyObject *unused)
{
    (void)unused;
    if (!vgpy_heap_ready(self)) return NULL;
    PyObject *d = vgpy_stats_dict(self->heap);
    if (d) {
        PyObject *v = PyLong_FromSize_t(vg_heap_device_total(self->heap));
        if (!v || PyDict_SetItemString(d, "device_total_bytes", v) < 0) Py_CLEAR(d);
        Py_XDECREF(v);
    }
    return d;
}

static PyObject *Heap_largest_allocatable(HeapObject *self, PyObject *unused)
{
    (void)unused;
    if (!vgpy_heap_ready(self)) return NULL;
    uint64_t bytes;
    Py_BEGIN_ALLOW_THREADS
    bytes = vg_heap_largest_allocatable(self->heap);
    Py_END_ALLOW_THREADS
    return PyLong_FromUnsignedLongLong(bytes);
}

static PyObject *Heap_segments(HeapObject *self, PyObject *unused)
{
    (void)unused;
    return vgpy_heap_ready(self) ? vgpy_segments_list(self->heap) : NULL;
}

static PyObject *Heap_histogram(HeapObject *self, PyObject *unused)
{
    (void)unused;
    return vgpy_heap_ready(self) ? vgpy_histogram_list(self->heap) : NULL;
}

static PyObject *Heap_check(HeapObject *self, PyObject *unused)
{
    (void)unused;
    if (!vgpy_heap_ready(self)) return NULL;
    const char *err = vg_heap_check(self->heap);
    if (err) {
        PyErr_Format(PyExc_AssertionError, "heap invariant broken: %s", err);
        return NULL;
    }
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ */
/* Settings                                                            */
/* ------------------------------------------------------------------ */

static PyObject *Heap_get_budget(HeapObject *self, void *closure)
{
    (void)closure;
    if (!vgpy_heap_ready(self)) return NULL;
    size_t b = vg_heap_budget(self->heap);
    if (!b) Py_RETURN_NONE;
    return PyLong_FromSize_t(b);
}

static int Heap_set_budget(HeapObject *self, PyObject *value, void *closure)
{
    (void)closure;
    uint64_t budget;
    if (!vgpy_heap_ready(self) || vgpy_as_budget(value, &budget) < 0) return -1;
    if (!self->borrowed) return vg_heap_set_budget(self->heap, (size_t)budget) == VG_OK ? 0 : -1;
    /* A lower budget releases idle segments: cudaFree, without the GIL. */
    if (!vgpy_heap_begin_unlocked(self, 0)) return -1;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = vg_heap_set_budget(self->heap, (size_t)budget);
    Py_END_ALLOW_THREADS
    vgpy_heap_end_unlocked(self, 0);
    return rc == VG_OK ? 0 : -1;
}

static PyObject *Heap_get_gc(HeapObject *self, void *closure)
{
    (void)closure;
    if (!vgpy_heap_ready(self)) return NULL;
    double g = vg_heap_gc_threshold(self->heap);
    if (g == 0.0) Py_RETURN_NONE;
    return PyFloat_FromDouble(g);
}

static int Heap_set_gc(HeapObject *self, PyObject *value, void *closure)
{
    (void)closure;
    double g;
    if (!vgpy_heap_ready(self) || vgpy_as_fraction(value, "gc_threshold", &g) < 0) return -1;
    return vg_heap_set_gc_threshold(self->heap, g) == VG_OK ? 0 : -1;
}

static PyObject *Heap_get_capacity(HeapObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromUnsignedLongLong(self->capacity);
}

static PyObject *Heap_get_policy(HeapObject *self, void *closure)
{
    (void)closure;
    if (!vgpy_heap_ready(self)) return NULL;
    return PyUnicode_FromString(vg_heap_policy_name(self->heap));
}

static PyObject *Heap_get_uses_arena(HeapObject *self, void *closure)
{
    (void)closure;
    if (!vgpy_heap_ready(self)) return NULL;
    return PyBool_FromLong(vg_heap_uses_arena(self->heap));
}

static PyMethodDef Heap_methods[] = {
    {"malloc", (PyCFunction)(void (*)(void))Heap_malloc, METH_VARARGS | METH_KEYWORDS,
     "malloc(size, stream=0) -> int\n\nAllocate `size` bytes on `stream` and return the "
     "address. Size 0 returns 0. Raises MemoryError when the policy cannot serve it, "
     "RuntimeError on a device error."},
    {"free", (PyCFunction)Heap_free, METH_O,
     "free(address)\n\nFree a block. 0 is a no-op; anything else that is not a live block "
     "raises ValueError and leaves the heap as it was."},
    {"record_stream", (PyCFunction)Heap_record_stream, METH_VARARGS,
     "record_stream(address, stream)\n\nThe block is also used by `stream`: once freed it is "
     "reused only after that stream's work queued by then has finished."},
    {"block_size", (PyCFunction)Heap_block_size, METH_O,
     "block_size(address) -> int\n\nThe rounded size of a live block, 0 if none."},
    {"empty_cache", (PyCFunction)Heap_empty_cache, METH_NOARGS,
     "empty_cache() -> int\n\nRelease every wholly free segment (the arena: unmap every page "
     "wholly inside free blocks, and release empty ranges); returns the bytes released."},
    {"synchronize", (PyCFunction)Heap_synchronize, METH_NOARGS,
     "synchronize()\n\nWait for the (simulated) device and finish deferred frees."},
    {"reset_peaks", (PyCFunction)Heap_reset_peaks, METH_NOARGS,
     "reset_peaks()\n\nSet every peak to its current value."},
    {"reset_accumulated", (PyCFunction)Heap_reset_accumulated, METH_NOARGS,
     "reset_accumulated()\n\nTotals (allocated, freed) and counters restart from 0, as "
     "torch.cuda.reset_accumulated_memory_stats() does."},
    {"complete_stream", (PyCFunction)Heap_complete_stream, METH_VARARGS,
     "complete_stream(stream, device=-1)\n\nSimulated device: all work queued on `stream` (of "
     "`device`, else of this heap's own) has finished."},
    {"fail_nth", (PyCFunction)Heap_fail_nth, METH_O,
     "fail_nth(n)\n\nSimulated device: refuse the n-th segment reservation or page map from "
     "now (0: off)."},
    {"fail_device", (PyCFunction)(void (*)(void))Heap_fail_device, METH_VARARGS | METH_KEYWORDS,
     "fail_device(n, sticky=False)\n\nSimulated device: fail the n-th segment reservation "
     "from now with a device error that is not an out-of-memory (an illegal address); sticky: "
     "and every reservation and synchronize after it (0: off)."},
    {"fail_random", (PyCFunction)Heap_fail_random, METH_VARARGS,
     "fail_random(probability, seed=0)\n\nSimulated device: refuse reservations at random."},
    {"stats", (PyCFunction)Heap_stats, METH_NOARGS,
     "stats() -> dict\n\nFlat counters, with torch.cuda.memory_stats() key names where the "
     "quantity is the same."},
    {"largest_allocatable", (PyCFunction)Heap_largest_allocatable, METH_NOARGS,
     "largest_allocatable() -> int\n\nThe largest request the heap could serve now, its cache "
     "released, within the budget and what the device says is free (the device is asked)."},
    {"segments", (PyCFunction)Heap_segments, METH_NOARGS,
     "segments() -> list\n\nEvery segment with its blocks and their state."},
    {"histogram", (PyCFunction)Heap_histogram, METH_NOARGS,
     "histogram() -> list of (class lower bound, live blocks)"},
    {"check", (PyCFunction)Heap_check, METH_NOARGS,
     "check()\n\nVerify every invariant; raises AssertionError naming the first broken one."},
    {"replay", (PyCFunction)(void (*)(void))vgpy_heap_replay, METH_VARARGS | METH_KEYWORDS,
     "replay(kinds, ids, sizes, streams, nids, samples=1000) -> dict\n\nDrive the heap with "
     "a columnar trace (bytes: u8 kinds, u32 ids, u64 sizes, u64 streams). Not on a device "
     "heap (RuntimeError): a replay needs a heap nobody else uses."},
    {"history_start", (PyCFunction)(void (*)(void))vgpy_heap_history_start, METH_VARARGS | METH_KEYWORDS,
     "history_start(capacity=1048576, stacks=False)\n\nRecord events into a fresh ring of `capacity` events "
     "(with `stacks`, each allocation's stack id: see stacks_configure). "
     "RuntimeError while a recording runs or a stopped one's events are not yet taken."},
    {"history_stop", (PyCFunction)vgpy_heap_history_stop, METH_NOARGS,
     "history_stop()\n\nStop recording; events stay until taken."},
    {"history_take", (PyCFunction)vgpy_heap_history_take, METH_NOARGS,
     "history_take() -> (bytes, dropped)\n\nThe recorded events, oldest first, as packed "
     "little-endian records '<QQQQQII' (time_ns, address, size, requested, stream, kind, 0)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Heap_getset[] = {
    {"budget", (getter)Heap_get_budget, (setter)Heap_set_budget,
     "Bytes reserved memory may not exceed (None: the device's capacity).", NULL},
    {"gc_threshold", (getter)Heap_get_gc, (setter)Heap_set_gc,
     "Fraction of the budget past which idle segments are released before growing.", NULL},
    {"capacity", (getter)Heap_get_capacity, NULL, "The simulated device's capacity.", NULL},
    {"policy", (getter)Heap_get_policy, NULL, "'arena', 'segments' or 'torch' ('vramguard' "
     "names the recommended one).", NULL},
    {"uses_arena", (getter)Heap_get_uses_arena, NULL,
     "True when the arena runs; False with segments (another policy, or a device without "
     "virtual memory: page_size=0).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef Heap_members[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(HeapObject, weakrefs), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot Heap_slots[] = {
    {Py_tp_doc, (void *)"Heap(capacity, budget=None, gc_threshold=None, policy='vramguard', "
                        "page_size=None)\n\n"
                        "A caching allocator over a simulated device of `capacity` bytes. Sizes are\n"
                        "ints of bytes or strings such as '15GiB' or a GPU preset ('T4'); a budget\n"
                        "is at least one 2 MiB segment. policy: 'arena', 'segments', 'torch', or\n"
                        "'vramguard' (the recommended one). page_size: the device's virtual memory\n"
                        "page (None: 2 MiB; 0: none, and the arena falls back to segments)."},
    {Py_tp_new, (void *)PyType_GenericNew},
    {Py_tp_init, (void *)Heap_init},
    {Py_tp_dealloc, (void *)Heap_dealloc},
    {Py_tp_methods, Heap_methods},
    {Py_tp_getset, Heap_getset},
    {Py_tp_members, Heap_members},
    {0, NULL},
};

PyType_Spec vgpy_heap_spec = {
    .name = "vramguard._core.Heap",
    .basicsize = sizeof(HeapObject),
    .itemsize = 0,
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .slots = Heap_slots,
};
