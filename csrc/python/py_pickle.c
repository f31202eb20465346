/* The pickle pre-check (pickle_scan.c) from Python: what the snapshot
 * reader asks before it lets the unpickler build anything. */
#include "py_internal.h"
#include "pickle_scan.h"

PyObject *vgpy_pickle_problem(PyObject *module, PyObject *data)
{
    (void)module;
    char *bytes;
    Py_ssize_t n;
    if (PyBytes_AsStringAndSize(data, &bytes, &n) < 0) return NULL;
    size_t offset = 0;
    const char *err = vg_pickle_scan((const uint8_t *)bytes, (size_t)n, VG_PICKLE_MAX_TUPLE_DEPTH, &offset);
    if (!err) Py_RETURN_NONE;
    return Py_BuildValue("(ns)", (Py_ssize_t)offset, err);
}
