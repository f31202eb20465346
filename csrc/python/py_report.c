/* What vramguard's reports read from the core beyond the stats dict:
 * take_interval(heap) for regions, and last_oom() for the out-of-memory
 * report. The core copies under its locks; the Python objects are built
 * here, after. */
#include "vramguard/devices.h"
#include "py_internal.h"

static HeapObject *as_heap(PyObject *module, PyObject *obj)
{
    PyTypeObject *type = (PyTypeObject *)vgpy_state(module)->heap_type;
    if (!PyObject_TypeCheck(obj, type)) {
        PyErr_SetString(PyExc_TypeError, "expected a vramguard Heap");
        return NULL;
    }
    HeapObject *heap = (HeapObject *)obj;
    return vgpy_heap_ready(heap) ? heap : NULL;
}

static PyObject *report_take_interval(PyObject *module, PyObject *obj)
{
    HeapObject *heap = as_heap(module, obj);
    if (!heap) return NULL;
    vg_interval iv;
    vg_heap_take_interval(heap->heap, &iv);
    return Py_BuildValue("(LLL)", (long long)iv.peak, (long long)iv.current,
                         (long long)iv.allocated_total);
}

static int set_u64(PyObject *d, const char *key, uint64_t v)
{
    PyObject *o = PyLong_FromUnsignedLongLong(v);
    if (!o) return -1;
    int rc = PyDict_SetItemString(d, key, o);
    Py_DECREF(o);
    return rc;
}

/* The state as a stats dict with torch.cuda.memory_stats()'s key names,
 * so that the summary's helpers read it as they read a live heap's. */
static PyObject *state_stats(const vg_oom_record *r)
{
    const vg_heap_state *st = &r->state;
    PyObject *d = PyDict_New();
    if (!d) return NULL;
    int rc = 0;
#define SET_STAT(name) if (!rc) rc = vgpy_set_stat(d, #name, st->stats.name);
    VG_TOTALED_STAT_LIST(SET_STAT)
#undef SET_STAT
    if (!rc) rc = set_u64(d, "num_ooms", st->stats.num_ooms);
    if (!rc) rc = set_u64(d, "num_alloc_retries", st->stats.num_alloc_retries);
    if (!rc) rc = set_u64(d, "fragmentation.free_bytes", st->frag.free_bytes);
    if (!rc) rc = set_u64(d, "fragmentation.largest_free_block", st->frag.largest_free_block);
    if (!rc) rc = set_u64(d, "fragmentation.free_blocks", st->frag.free_blocks);
    if (!rc) rc = set_u64(d, "fragmentation.pending_blocks", st->frag.pending_blocks);
    if (!rc) rc = set_u64(d, "fragmentation.releasable_bytes", st->frag.releasable_bytes);
    if (!rc) rc = set_u64(d, "budget_bytes", r->info.budget);
    if (!rc) rc = set_u64(d, "device_total_bytes", r->info.device_total);
    if (rc) Py_CLEAR(d);
    return d;
}

/* [(lower, upper, blocks, bytes)] for each class with live blocks. */
static PyObject *live_classes(const vg_heap_state *st)
{
    PyObject *list = PyList_New(0);
    for (int k = 0; list && k < VG_LIVE_CLASSES; k++) {
        if (!st->live_blocks[k]) continue;
        unsigned long long lower = 1ull << k;
        unsigned long long upper = k + 1 < 64 ? (1ull << (k + 1)) : 0; /* 0: no bound */
        PyObject *row = Py_BuildValue("(KKKK)", lower, upper,
                                      (unsigned long long)st->live_blocks[k],
                                      (unsigned long long)st->live_bytes[k]);
        if (!row || PyList_Append(list, row) < 0) Py_CLEAR(list);
        Py_XDECREF(row);
    }
    return list;
}

static PyObject *record_dict(const vg_oom_record *r)
{
    const vg_oom_info *o = &r->info;
    PyObject *stats = state_stats(r);
    PyObject *classes = stats ? live_classes(&r->state) : NULL;
    if (!classes) {
        Py_XDECREF(stats);
        return NULL;
    }
    PyObject *d = Py_BuildValue(
        "{s:K,s:i,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:O,s:O,s:K,s:K,s:K,s:N,s:N}",
        "seq", (unsigned long long)r->seq, "device", o->device,
        "requested", (unsigned long long)o->requested, "rounded", (unsigned long long)o->rounded,
        "budget", (unsigned long long)o->budget, "device_total", (unsigned long long)o->device_total,
        "device_free", (unsigned long long)o->device_free,
        "allocated", (unsigned long long)o->allocated, "reserved", (unsigned long long)o->reserved,
        "largest_free_block", (unsigned long long)o->largest_free_block,
        "free_blocks", (unsigned long long)o->free_blocks,
        "free_bytes", (unsigned long long)o->free_bytes,
        "largest_allocatable", (unsigned long long)o->largest_allocatable,
        "budget_refused", o->budget_refused ? Py_True : Py_False,
        "arena", o->arena ? Py_True : Py_False,
        "segments", (unsigned long long)r->state.segments,
        "idle_segments", (unsigned long long)r->state.idle_segments,
        "idle_segment_bytes", (unsigned long long)r->state.idle_segment_bytes,
        "stats", stats, "live_by_class", classes);
    return d;
}

static PyObject *report_last_oom(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    /* A few KiB: on the heap, not the stack, and not under any lock. */
    vg_oom_record *r = PyMem_Malloc(sizeof *r);
    if (!r) return PyErr_NoMemory();
    PyObject *result;
    if (vg_devices_last_oom(r)) {
        result = record_dict(r);
    } else {
        result = Py_None;
        Py_INCREF(result);
    }
    PyMem_Free(r);
    return result;
}

static PyObject *report_last_oom_seq(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return PyLong_FromUnsignedLongLong(vg_devices_last_oom_seq());
}

static PyObject *report_simulated(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return PyBool_FromLong(vg_devices_simulated());
}

static PyMethodDef report_methods[] = {
    {"take_interval", (PyCFunction)report_take_interval, METH_O,
     "take_interval(heap) -> (peak, current, allocated_total)\n\nThe highest allocated bytes "
     "since the last take, which starts the next interval (one reader: vramguard's regions)."},
    {"last_oom", (PyCFunction)report_last_oom, METH_NOARGS,
     "last_oom() -> dict or None\n\nThe device heaps' last out-of-memory and the heap's state "
     "copied at it."},
    {"last_oom_seq", (PyCFunction)report_last_oom_seq, METH_NOARGS,
     "last_oom_seq() -> int\n\nHow many out-of-memory errors the device heaps have had."},
    {"devices_simulated", (PyCFunction)report_simulated, METH_NOARGS,
     "devices_simulated() -> bool\n\nWhether the device heaps are over simulated devices."},
    {NULL, NULL, 0, NULL},
};

int vgpy_report_init(PyObject *module)
{
    return PyModule_AddFunctions(module, report_methods);
}
