/* Python's view of what PyTorch's other hooks set up: the private pools of
 * CUDA graphs, the captures underway, and the device count PyTorch gave at
 * CUDA's init. The records are copied under the registry's lock and turned
 * into Python objects after it (building them may run the garbage
 * collector, and with it a tensor's free). */
#include "vramguard/devices.h"
#include "py_internal.h"

#include <stdlib.h>

static const struct {
    const char *name;
    size_t offset;
} pool_stats[] = {
    {"allocated_bytes", offsetof(vg_stats, allocated_bytes)},
    {"requested_bytes", offsetof(vg_stats, requested_bytes)},
    {"reserved_bytes", offsetof(vg_stats, reserved_bytes)},
    {"active_bytes", offsetof(vg_stats, active_bytes)},
    {"allocation", offsetof(vg_stats, allocation)},
    {"active", offsetof(vg_stats, active)},
    {"segment", offsetof(vg_stats, segment)},
};

static const char *const pool_types[VG_STAT_TYPES] = {"all", "small_pool", "large_pool"};

static int set_i64(PyObject *d, const char *key, long long v)
{
    PyObject *o = PyLong_FromLongLong(v);
    int rc = o ? PyDict_SetItemString(d, key, o) : -1;
    Py_XDECREF(o);
    return rc;
}

/* "reserved_bytes.all.current" and the like, as torch.cuda.memory_stats
 * names them. */
static int set_stat_array(PyObject *d, const char *name, const vg_stat *s)
{
    static const char *const fields[] = {"current", "peak", "allocated", "freed"};
    char key[96];
    for (int t = 0; t < VG_STAT_TYPES; t++) {
        const int64_t values[] = {s[t].current, s[t].peak, s[t].allocated, s[t].freed};
        for (int f = 0; f < 4; f++) {
            snprintf(key, sizeof key, "%s.%s.%s", name, pool_types[t], fields[f]);
            if (set_i64(d, key, values[f]) < 0) return -1;
        }
    }
    return 0;
}

static PyObject *pool_dict(const vg_pool_info *p)
{
    PyObject *stats = PyDict_New();
    for (size_t i = 0; stats && i < sizeof pool_stats / sizeof pool_stats[0]; i++) {
        const vg_stat *s = (const vg_stat *)((const char *)&p->stats + pool_stats[i].offset);
        if (set_stat_array(stats, pool_stats[i].name, s) < 0) Py_CLEAR(stats);
    }
    if (!stats) return NULL;
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

static PyMethodDef pool_methods[] = {
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
