/* Python's view of what PyTorch's other hooks set up: the private pools of
 * CUDA graphs, the captures underway, and the device count PyTorch gave at
 * CUDA's init. The records are copied under the registry's lock and turned
 * into Python objects after it (building them may run the garbage
 * collector, and with it a tensor's free). */
#include "vramguard/devices.h"
#include "py_internal.h"

#include <stdlib.h>

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
