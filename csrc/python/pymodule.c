/* vramguard._core: the extension module (plain C API, stable ABI,
 * multi-phase init). */
#include "py_internal.h"

static PyObject *core_round_size(PyObject *module, PyObject *size_obj)
{
    (void)module;
    uint64_t size;
    if (vgpy_as_u64(size_obj, "size", &size) < 0) return NULL;
    return PyLong_FromSize_t(vg_round_size((size_t)size));
}

static PyObject *core_format_size(PyObject *module, PyObject *size_obj)
{
    (void)module;
    uint64_t size;
    char buf[32];
    if (vgpy_as_u64(size_obj, "size", &size) < 0) return NULL;
    vg_format_size(size, buf, sizeof buf);
    return PyUnicode_FromString(buf);
}

static PyMethodDef core_methods[] = {
    {"round_size", (PyCFunction)core_round_size, METH_O,
     "round_size(size) -> int\n\nThe block size a request of `size` bytes gets (0 for 0 or "
     "for more than any heap will serve)."},
    {"format_size", (PyCFunction)core_format_size, METH_O,
     "format_size(bytes) -> str\n\nAs PyTorch writes sizes in its messages."},
    {"trace_peak_live", (PyCFunction)vgpy_trace_peak_live, METH_VARARGS,
     "trace_peak_live(kinds, ids, sizes, nids) -> int\n\nPeak live requested bytes of a "
     "columnar trace: the physical limit, whatever the policy."},
    {"expandable_replay", (PyCFunction)(void (*)(void))vgpy_expandable_replay,
     METH_VARARGS | METH_KEYWORDS,
     "expandable_replay(kinds, ids, sizes, streams, nids, budget=0, samples=1000, "
     "device_total=0, large_page=0, small_page=0) -> dict\n\nReplay a columnar trace through "
     "the emulation of PyTorch's expandable segments: Heap.replay's keys, plus map and "
     "unmap calls and pages, synchronizations and segments."},
    {"pickle_problem", (PyCFunction)vgpy_pickle_problem, METH_O,
     "pickle_problem(data) -> None or (offset, why)\n\nWhat would stop a snapshot pickle "
     "from being read safely: classes, or tuples nested too deep to hash."},
    {NULL, NULL, 0, NULL},
};

vgpy_module_state *vgpy_state(PyObject *module)
{
    return (vgpy_module_state *)PyModule_GetState(module);
}

static int core_exec(PyObject *module)
{
    PyObject *heap_type = PyType_FromSpec(&vgpy_heap_spec);
    if (!heap_type) return -1;
    vgpy_state(module)->heap_type = heap_type; /* the state's reference */
    Py_INCREF(heap_type);
    if (PyModule_AddObject(module, "Heap", heap_type) < 0) {
        Py_DECREF(heap_type);
        return -1;
    }
    if (vgpy_devices_init(module) < 0) return -1;
    if (vgpy_pools_init(module) < 0) return -1;
    if (vgpy_stacks_init(module) < 0) return -1;
    if (vgpy_report_init(module) < 0) return -1;
    if (PyModule_AddIntConstant(module, "ALIGN", (long)VG_ALIGN) < 0) return -1;
    if (PyModule_AddIntConstant(module, "SMALL_REQUEST", (long)VG_SMALL_REQUEST) < 0) return -1;
    if (PyModule_AddIntConstant(module, "SEGMENT_GRANULE", (long)VG_SEGMENT_GRANULE) < 0) return -1;
    if (PyModule_AddIntConstant(module, "BUDGET_NOTHING", (long)VG_BUDGET_NOTHING) < 0) return -1;
    if (PyModule_AddObject(module, "MAX_REQUEST", PyLong_FromSize_t(VG_MAX_REQUEST)) < 0) return -1;
    return 0;
}

static PyModuleDef_Slot core_slots[] = {
    {Py_mod_exec, (void *)core_exec},
    {0, NULL},
};

static int core_traverse(PyObject *module, visitproc visit, void *arg)
{
    vgpy_module_state *st = vgpy_state(module);
    Py_VISIT(st->heap_type);
    return 0;
}

static int core_clear(PyObject *module)
{
    vgpy_module_state *st = vgpy_state(module);
    Py_CLEAR(st->heap_type);
    return 0;
}

static void core_free(void *module)
{
    core_clear((PyObject *)module);
}

static struct PyModuleDef core_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "vramguard._core",
    .m_doc = "vramguard's allocator core: heaps, the simulated device, and (with CUDA) the "
             "entry points PyTorch's pluggable allocator calls.",
    .m_size = sizeof(vgpy_module_state),
    .m_methods = core_methods,
    .m_slots = core_slots,
    .m_traverse = core_traverse,
    .m_clear = core_clear,
    .m_free = core_free,
};

PyMODINIT_FUNC PyInit__core(void)
{
    return PyModuleDef_Init(&core_module);
}
