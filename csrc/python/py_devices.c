/* Python's view of the per-device heaps that PyTorch allocates from:
 * device_heap(i) returns a Heap object over device i's heap (borrowed: the
 * heap lives as long as the process), plus the settings and the runtime. */
#include "vramguard/devices.h"
#include "py_internal.h"

/* Before the first look for a CUDA runtime, when none is in the process
 * yet: import torch if it is installed, so that the runtime found is the
 * one torch loads with itself, never a second one from the system beside
 * it. Without torch, the system's runtime is the only one there will be. */
static void import_torch_for_its_runtime(void)
{
    if (vg_cuda_runtime_present()) return;
    PyObject *torch = PyImport_ImportModule("torch");
    if (torch) Py_DECREF(torch);
    else PyErr_Clear();
}

static PyObject *dev_device_heap(PyObject *module, PyObject *arg)
{
    if (PyBool_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "device must be an int, not bool");
        return NULL;
    }
    long device = PyLong_AsLong(arg);
    if (device == -1 && PyErr_Occurred()) return NULL;
    if (device < 0 || device >= VG_MAX_DEVICES) {
        PyErr_Format(PyExc_ValueError, "device must be in 0..%d, got %ld", VG_MAX_DEVICES - 1, device);
        return NULL;
    }
    if (!vg_devices_simulated()) import_torch_for_its_runtime();
    vg_heap *h = vg_devices_heap((int)device);
    if (!h) {
        PyErr_Format(PyExc_RuntimeError, "vramguard: %s", vg_devices_error());
        return NULL;
    }
    /* A Heap object without __init__: it borrows the device's heap. */
    PyTypeObject *type = (PyTypeObject *)vgpy_state(module)->heap_type;
    allocfunc alloc = (allocfunc)PyType_GetSlot(type, Py_tp_alloc);
    HeapObject *obj = (HeapObject *)alloc(type, 0);
    if (!obj) return NULL;
    obj->heap = h;
    obj->dev = vg_heap_device(h);
    obj->borrowed = 1;
    obj->device_kind = vg_devices_simulated() ? "Simulated device" : "CUDA";
    obj->capacity = vg_heap_device_total(h);
    return (PyObject *)obj;
}

static PyObject *dev_existing(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    PyObject *list = PyList_New(0);
    for (int d = 0; list && d < VG_MAX_DEVICES; d++) {
        if (!vg_devices_existing(d)) continue;
        PyObject *i = PyLong_FromLong(d);
        if (!i || PyList_Append(list, i) < 0) Py_CLEAR(list);
        Py_XDECREF(i);
    }
    return list;
}

/* A budget of bytes, 0 for none: an int (not a bool) of at most 64 bits,
 * never taken modulo 2^64 as the "K" format would. */
static int as_budget_or_none(PyObject *obj, uint64_t *out)
{
    *out = 0;
    return obj && obj != Py_None ? vgpy_as_u64(obj, "budget", out) : 0;
}

static PyObject *dev_configure(PyObject *module, PyObject *args, PyObject *kwargs)
{
    (void)module;
    static char *kwlist[] = {"budget", "budget_fraction", "gc_threshold", NULL};
    PyObject *budget_obj = NULL, *fraction_obj = NULL, *gc_obj = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|OOO", kwlist, &budget_obj, &fraction_obj, &gc_obj))
        return NULL;
    uint64_t budget;
    double fraction, gc;
    if (as_budget_or_none(budget_obj, &budget) < 0 ||
        vgpy_as_setting(fraction_obj, "budget_fraction", &fraction) < 0 ||
        vgpy_as_setting(gc_obj, "gc_threshold", &gc) < 0)
        return NULL;
    if (vg_devices_configure((size_t)budget, fraction, gc) != VG_OK) {
        /* Not reached: the conversions above apply the core's rule. */
        PyErr_SetString(PyExc_ValueError, "budget_fraction and gc_threshold must be in [0, 1]");
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *dev_set_budget(PyObject *module, PyObject *args, PyObject *kwargs)
{
    (void)module;
    static char *kwlist[] = {"device", "budget", "budget_fraction", NULL};
    int device;
    PyObject *budget_obj = NULL, *fraction_obj = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "i|OO", kwlist, &device, &budget_obj, &fraction_obj))
        return NULL;
    uint64_t budget;
    double fraction;
    if (as_budget_or_none(budget_obj, &budget) < 0 ||
        vgpy_as_setting(fraction_obj, "budget_fraction", &fraction) < 0)
        return NULL;
    if (!vg_devices_simulated()) import_torch_for_its_runtime();
    int rc = vg_devices_set_budget(device, (size_t)budget, fraction);
    if (rc == VG_ERR_ARG) {
        PyErr_SetString(PyExc_ValueError, "budget_fraction must be in [0, 1]");
        return NULL;
    }
    if (rc != VG_OK) {
        PyErr_Format(PyExc_RuntimeError, "vramguard: %s", vg_devices_error());
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *dev_simulate(PyObject *module, PyObject *arg)
{
    (void)module;
    uint64_t capacity;
    if (vgpy_as_u64(arg, "capacity", &capacity) < 0) return NULL;
    if (vg_devices_simulate((size_t)capacity) != VG_OK) {
        PyErr_SetString(PyExc_RuntimeError, "device heaps exist already: simulate before first use");
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *dev_record_stream(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *ptr_obj, *stream_obj;
    uint64_t ptr, stream;
    int device = -1;
    if (!PyArg_ParseTuple(args, "OO|i", &ptr_obj, &stream_obj, &device)) return NULL;
    if (vgpy_as_u64(ptr_obj, "address", &ptr) < 0 || vgpy_as_u64(stream_obj, "stream", &stream) < 0)
        return NULL;
    if (device < -1 || device >= VG_MAX_DEVICES) {
        PyErr_Format(PyExc_ValueError, "stream device must be in 0..%d (or -1: the block's own), got %d",
                     VG_MAX_DEVICES - 1, device);
        return NULL;
    }
    int rc = vg_devices_record_stream((void *)(uintptr_t)ptr, device, (vg_stream_t)stream);
    if (rc == VG_ERR_NOMEM) return PyErr_NoMemory();
    return PyBool_FromLong(rc == VG_OK);
}

static PyObject *dev_runtime(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    import_torch_for_its_runtime();
    const char *err = vg_cuda_load();
    const char *source = vg_cuda_runtime_source();
    return Py_BuildValue("{s:O,s:s,s:s,s:i,s:O}", "found", err ? Py_False : Py_True, "error", err,
                         "source", source, "device_count", err ? 0 : vg_cuda_device_count(),
                         "simulated", vg_devices_simulated() ? Py_True : Py_False);
}

static PyObject *dev_arena_default(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return PyBool_FromLong(VG_DEVICES_ARENA_DEFAULT);
}

/* None (the default), True or False: exactly those, so that a typo such
 * as the string "0" is refused rather than read as true. */
static PyObject *dev_use_arena(PyObject *module, PyObject *arg)
{
    (void)module;
    int mode = arg == Py_None ? -1 : arg == Py_True ? 1 : arg == Py_False ? 0 : -2;
    if (mode == -2) {
        PyErr_Format(PyExc_TypeError, "arena must be None, True or False, not %R", arg);
        return NULL;
    }
    vg_devices_use_arena(mode);
    Py_RETURN_NONE;
}

static PyObject *dev_backing(PyObject *module, PyObject *arg)
{
    (void)module;
    long device = PyLong_AsLong(arg);
    if (device == -1 && PyErr_Occurred()) return NULL;
    const char *words = device >= 0 && device < VG_MAX_DEVICES ? vg_devices_backing((int)device) : NULL;
    if (!words) Py_RETURN_NONE;
    return PyUnicode_FromString(words);
}

PyMethodDef vgpy_device_methods[] = {
    {"use_arena", (PyCFunction)dev_use_arena, METH_O,
     "use_arena(mode)\n\nDevice heaps created from now on: True the arena where the device "
     "supports virtual memory, False segments, None the default."},
    {"arena_default", (PyCFunction)(void (*)(void))dev_arena_default, METH_NOARGS,
     "arena_default() -> bool\n\nWhat use_arena(None) chooses."},
    {"device_backing", (PyCFunction)dev_backing, METH_O,
     "device_backing(device) -> str or None\n\nWhat the device's heap runs on, in words: "
     "arena or segments, and why."},
    {"device_heap", (PyCFunction)dev_device_heap, METH_O,
     "device_heap(device) -> Heap\n\nThe heap PyTorch allocates from on `device`, created on "
     "first use."},
    {"existing_devices", (PyCFunction)dev_existing, METH_NOARGS,
     "existing_devices() -> list\n\nDevices whose heap exists."},
    {"configure_devices", (PyCFunction)(void (*)(void))dev_configure, METH_VARARGS | METH_KEYWORDS,
     "configure_devices(budget=0, budget_fraction=0.0, gc_threshold=0.0)\n\nSettings for every "
     "device heap, now and to come (a positive fraction wins over bytes; 0 or None: off)."},
    {"set_device_budget", (PyCFunction)(void (*)(void))dev_set_budget, METH_VARARGS | METH_KEYWORDS,
     "set_device_budget(device, budget=0, budget_fraction=0.0)"},
    {"simulate_devices", (PyCFunction)dev_simulate, METH_O,
     "simulate_devices(capacity)\n\nTests: every device heap is over a simulated device."},
    {"record_stream_any", (PyCFunction)dev_record_stream, METH_VARARGS,
     "record_stream_any(address, stream, device=-1) -> bool\n\nrecord_stream on whichever "
     "device heap owns it; `stream` is a stream of `device` (-1: of the block's own device)."},
    {"cuda_runtime", (PyCFunction)dev_runtime, METH_NOARGS,
     "cuda_runtime() -> dict\n\nWhether a CUDA runtime was found, where, and how many devices. "
     "When none is loaded yet, torch is imported first (if installed), so that the runtime "
     "found is torch's own."},
    {NULL, NULL, 0, NULL},
};

int vgpy_devices_init(PyObject *module)
{
    return PyModule_AddFunctions(module, vgpy_device_methods);
}
