/* Python's view of what PyTorch's other hooks set up: the private pools of
 * CUDA graphs, the captures underway, and the device count PyTorch gave at
 * CUDA's init. The records are copied under the registry's lock and turned
 * into Python objects after it (building them may run the garbage
 * collector, and with it a tensor's free). */
#include "vramguard/devices.h"
#include "py_internal.h"

#include <stdlib.h>
#include <string.h>

static PyObject *pool_dict(const vg_pool_info *p)
{
    PyObject *stats = PyDict_New();
    if (!stats) return NULL;
    int rc = 0;
#define SET_STAT(name) if (!rc) rc = vgpy_set_stat(stats, #name, p->stats.name);
    VG_TOTALED_STAT_LIST(SET_STAT)
#undef SET_STAT
    if (rc) {
        Py_DECREF(stats);
        return NULL;
    }
    PyObject *d = Py_BuildValue("{s:i,s:(KK),s:i,s:i,s:O,s:O}", "device", p->device, "id",
                                (unsigned long long)p->id0, (unsigned long long)p->id1, "use_count",
                                p->use_count, "begun", p->begun, "released",
                                p->released ? Py_True : Py_False, "stats", stats);
    Py_DECREF(stats);
    return d;
}

static PyObject *pools_list(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    vg_pool_info *infos = NULL;
    size_t n = 0, count = vg_devices_pools(NULL, 0);
    /* Pools may come and go between the two calls: ask until it all fits. */
    for (;;) {
        vg_pool_info *grown = realloc(infos, (count ? count : 1) * sizeof *infos);
        if (!grown) {
            free(infos);
            return PyErr_NoMemory();
        }
        infos = grown;
        n = vg_devices_pools(infos, count);
        if (n <= count) break;
        count = n;
    }
    PyObject *list = PyList_New(0);
    for (size_t i = 0; list && i < n; i++) {
        PyObject *d = pool_dict(&infos[i]);
        if (!d || PyList_Append(list, d) < 0) Py_CLEAR(list);
        Py_XDECREF(d);
    }
    free(infos);
    return list;
}

static PyObject *captures(PyObject *module, PyObject *arg)
{
    (void)module;
    long device = PyLong_AsLong(arg);
    if (device == -1 && PyErr_Occurred()) return NULL;
    if (device < 0 || device >= VG_MAX_DEVICES) {
        PyErr_Format(PyExc_ValueError, "device must be in 0..%d, got %ld", VG_MAX_DEVICES - 1, device);
        return NULL;
    }
    return PyLong_FromLong(vg_capture_active((int)device));
}

static PyObject *device_count(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return PyLong_FromLong(vg_devices_device_count());
}

static int device_arg(PyObject *arg, int *device)
{
    if (PyBool_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "device must be an int, not bool");
        return -1;
    }
    long d = PyLong_AsLong(arg);
    if (d == -1 && PyErr_Occurred()) return -1;
    if (d < 0 || d >= VG_MAX_DEVICES) {
        PyErr_Format(PyExc_ValueError, "device must be in 0..%d, got %ld", VG_MAX_DEVICES - 1, d);
        return -1;
    }
    *device = (int)d;
    return 0;
}

static int set_size(PyObject *d, const char *key, unsigned long long value)
{
    PyObject *v = PyLong_FromUnsignedLongLong(value);
    int rc = v ? PyDict_SetItemString(d, key, v) : -1;
    Py_XDECREF(v);
    return rc;
}

/* One pool's StatArray as PyTorch nests it: {"all": {"current": ...}, ...}. */
static PyObject *stat_array(const vg_stat *s)
{
    static const char *const types[VG_STAT_TYPES] = {"all", "small_pool", "large_pool"};
    PyObject *d = PyDict_New();
    for (int t = 0; d && t < VG_STAT_TYPES; t++) {
        PyObject *m = Py_BuildValue("{s:L,s:L,s:L,s:L}", "current", (long long)s[t].current, "peak",
                                    (long long)s[t].peak, "allocated", (long long)s[t].allocated,
                                    "freed", (long long)s[t].freed);
        if (!m || PyDict_SetItemString(d, types[t], m) < 0) Py_CLEAR(d);
        Py_XDECREF(m);
    }
    return d;
}

static PyObject *reservations_dict(const vg_pool_reservation *r, size_t n)
{
    PyObject *d = PyDict_New();
    for (size_t i = 0; d && i < n; i++) {
        PyObject *key = Py_BuildValue("(KK)", (unsigned long long)r[i].id0, (unsigned long long)r[i].id1);
        PyObject *value = key ? stat_array(r[i].reserved) : NULL;
        if (!value || PyDict_SetItem(d, key, value) < 0) Py_CLEAR(d);
        Py_XDECREF(key);
        Py_XDECREF(value);
    }
    return d;
}

/* The pools' reservations, copied under the registry's lock. */
static vg_pool_reservation *copy_reservations(int device, size_t *n)
{
    vg_pool_reservation *r = NULL;
    size_t count = vg_devices_pool_reservations(device, NULL, 0);
    for (;;) {
        vg_pool_reservation *grown = realloc(r, (count ? count : 1) * sizeof *r);
        if (!grown) {
            free(r);
            return NULL;
        }
        r = grown;
        *n = vg_devices_pool_reservations(device, r, count);
        if (*n <= count) return r;
        count = *n;
    }
}

/* PyTorch's counters, and vramguard's that a pool's call can move. */
#define DEVICE_COUNTERS(X) \
    X(num_alloc_retries) X(num_device_alloc) X(num_device_free) X(num_ooms) \
    X(num_sync_all_streams) X(num_device_alloc_failed) X(num_budget_refusals)

static PyObject *figures_dict(const vg_device_totals *t, const vg_pool_reservation *r, size_t n)
{
    PyObject *d = PyDict_New();
    if (!d) return NULL;
    int rc = 0;
#define SET_STAT(name) if (!rc) rc = vgpy_set_stat(d, #name, t->stats.name);
    VG_TOTALED_STAT_LIST(SET_STAT)
#undef SET_STAT
#define SET_COUNTER(name) if (!rc) rc = set_size(d, #name, t->stats.name);
    DEVICE_COUNTERS(SET_COUNTER)
#undef SET_COUNTER
    if (!rc) rc = set_size(d, "private_pools", t->pools);
    if (!rc) rc = set_size(d, "private_pool_reserved_bytes", t->pools_reserved);
    if (!rc) rc = set_size(d, "private_pool_allocated_bytes", t->pools_allocated);
    PyObject *by_pool = rc ? NULL : reservations_dict(r, n);
    if (!by_pool || PyDict_SetItemString(d, "reserved_bytes_by_private_pools", by_pool) < 0) Py_CLEAR(d);
    Py_XDECREF(by_pool);
    return d;
}

static PyObject *device_figures(PyObject *module, PyObject *arg)
{
    (void)module;
    int device;
    if (device_arg(arg, &device) < 0) return NULL;
    vg_device_totals totals;
    if (vg_devices_totals(device, &totals) != VG_OK) Py_RETURN_NONE;
    size_t n = 0;
    vg_pool_reservation *r = copy_reservations(device, &n);
    if (!r) return PyErr_NoMemory();
    PyObject *d = figures_dict(&totals, r, n);
    free(r);
    return d;
}

static PyObject *reset_device_peaks(PyObject *module, PyObject *arg)
{
    (void)module;
    int device;
    if (device_arg(arg, &device) < 0) return NULL;
    vg_devices_reset_peaks(device);
    Py_RETURN_NONE;
}

static PyObject *save_device_peaks(PyObject *module, PyObject *arg)
{
    (void)module;
    int device;
    if (device_arg(arg, &device) < 0) return NULL;
    vg_device_peaks saved;
    if (vg_devices_save_peaks(device, &saved) != VG_OK) Py_RETURN_NONE;
    return PyBytes_FromStringAndSize((const char *)&saved, sizeof saved);
}

static PyObject *restore_device_peaks(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *device_obj;
    const char *bytes;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "Oy#", &device_obj, &bytes, &n)) return NULL;
    int device;
    if (device_arg(device_obj, &device) < 0) return NULL;
    if ((size_t)n != sizeof(vg_device_peaks)) {
        PyErr_SetString(PyExc_ValueError, "restore_device_peaks: not what save_device_peaks returned");
        return NULL;
    }
    vg_device_peaks saved;
    memcpy(&saved, bytes, sizeof saved);
    if (vg_devices_restore_peaks(device, &saved) != VG_OK) {
        PyErr_Format(PyExc_ValueError, "restore_device_peaks: device %d has no heap", device);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *pool_segments(PyObject *module, PyObject *arg)
{
    (void)module;
    int device;
    if (device_arg(arg, &device) < 0) return NULL;
    return vgpy_pool_segments_list(device);
}

static PyObject *reset_device_accumulated(PyObject *module, PyObject *arg)
{
    (void)module;
    int device;
    if (device_arg(arg, &device) < 0) return NULL;
    vg_devices_reset_accumulated(device);
    Py_RETURN_NONE;
}

static PyMethodDef pool_methods[] = {
    {"device_figures", (PyCFunction)device_figures, METH_O,
     "device_figures(device) -> dict or None\n\nThe device's figures with its CUDA-graph "
     "private pools included, as PyTorch reports them: memory_stats() names for the quantities "
     "(peaks of the sum) and PyTorch's counters, private_pools, private_pool_reserved_bytes, "
     "private_pool_allocated_bytes, and reserved_bytes_by_private_pools keyed by pool id. "
     "None when the device has no heap."},
    {"reset_device_peaks", (PyCFunction)reset_device_peaks, METH_O,
     "reset_device_peaks(device)\n\nEvery peak of the device, its heap's and its pools', set "
     "to its current value."},
    {"save_device_peaks", (PyCFunction)save_device_peaks, METH_O,
     "save_device_peaks(device) -> bytes or None\n\nThe device's peaks (its heap's and the "
     "device's figures), for restore_device_peaks. None when the device has no heap."},
    {"restore_device_peaks", (PyCFunction)restore_device_peaks, METH_VARARGS,
     "restore_device_peaks(device, saved)\n\nEvery peak of the device back to the saved one, "
     "or to its current value where that is higher: as if what ran since had not run."},
    {"reset_device_accumulated", (PyCFunction)reset_device_accumulated, METH_O,
     "reset_device_accumulated(device)\n\nTotals and counters of the device, its heap's and "
     "its pools', restart from 0."},
    {"pool_segments", (PyCFunction)pool_segments, METH_O,
     "pool_segments(device) -> list\n\nThe segments of the device's CUDA-graph private pools, "
     "as Heap.segments() gives a heap's, each with its pool's id as \"pool_id\"."},
    {"private_pools", (PyCFunction)pools_list, METH_NOARGS,
     "private_pools() -> list\n\nThe private pools of CUDA graphs, oldest first: device, id "
     "(PyTorch's MempoolId_t), use_count (begins not yet released), begun (a begin not yet "
     "ended), released (waiting for its blocks), and stats: its heap's counters with "
     "torch.cuda.memory_stats() names (reserved_bytes.all.current, ...)."},
    {"captures_underway", (PyCFunction)captures, METH_O,
     "captures_underway(device) -> int\n\nBegins of allocation to a private pool not yet "
     "ended on `device` (a CUDA graph capture, or torch._C._cuda_beginAllocateToPool)."},
    {"torch_device_count", (PyCFunction)device_count, METH_NOARGS,
     "torch_device_count() -> int\n\nThe device count PyTorch gave at CUDA's init (-1 before)."},
    {NULL, NULL, 0, NULL},
};

int vgpy_pools_init(PyObject *module)
{
    return PyModule_AddFunctions(module, pool_methods);
}
