/* Shared by the extension's files: conversions between the core's structs
 * and Python objects, with the stable ABI only. */
#ifndef VG_PY_INTERNAL_H
#define VG_PY_INTERNAL_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "vramguard/heap.h"
#include "vramguard/history.h"
#include "vramguard/replay.h"
#include "vramguard/report.h"

/* A non-negative int that fits in 64 bits; sets an exception and returns
 * -1 otherwise. `what` names the argument in the message. */
int vgpy_as_u64(PyObject *obj, const char *what, uint64_t *out);
/* A size: an int, or a string by vramguard._units.parse_size ("15GiB", "T4"). */
int vgpy_as_size(PyObject *obj, const char *what, uint64_t *out);
/* None -> 0, else bytes by vramguard._units.parse_budget (at least 2 MiB). */
int vgpy_as_budget(PyObject *obj, uint64_t *out);
/* None -> 0.0, else a number (not a bool) in (0, 1]. */
int vgpy_as_fraction(PyObject *obj, const char *what, double *out);
/* As vgpy_as_fraction, and 0 -> 0.0 (off), as the core's settings take it. */
int vgpy_as_setting(PyObject *obj, const char *what, double *out);
/* "0x1f000" into buf: PyErr_Format has no %llx. Returns buf. */
const char *vgpy_hex(uint64_t value, char *buf, size_t n);

/* The flat stats dict: PyTorch's key names where the quantity is the same. */
PyObject *vgpy_stats_dict(vg_heap *h);
/* "reserved_bytes.all.current" and the like, as torch.cuda.memory_stats
 * names them: the 12 entries of one vg_stat array into `d`; -1 on error. */
int vgpy_set_stat(PyObject *d, const char *name, const vg_stat *s);
PyObject *vgpy_segments_list(vg_heap *h);
/* The segments of `device`'s CUDA-graph private pools, each with its
 * "pool_id" (a heap's own have none). */
PyObject *vgpy_pool_segments_list(int device);
PyObject *vgpy_histogram_list(vg_heap *h);
/* Raise MemoryError with the OOM message and the record as attributes. */
/* MemoryError for an out-of-memory, RuntimeError for a device error. */
void vgpy_raise_oom(const vg_oom_info *oom, const char *device_kind);

/* py_heap.c */
typedef struct {
    PyObject_HEAD
    vg_device *dev;
    vg_heap *heap;
    uint64_t capacity;
    int borrowed;            /* a device heap: owned by device/heaps.c */
    const char *device_kind; /* for OOM messages: "Simulated device", "CUDA" */
    /* Read and written with the GIL held, around calls that release it. */
    int replaying;           /* a replay runs: every other call is refused */
    int gil_released_calls;  /* calls in flight without the GIL */
    PyObject *weakrefs;      /* regions and steps hold a Heap weakly (report/tracked_heaps.py) */
} HeapObject;

extern PyType_Spec vgpy_heap_spec;
/* 1 when __init__ ran and no replay runs on the heap, else 0 with
 * RuntimeError set. */
int vgpy_heap_ready(HeapObject *self);
/* Around a call that releases the GIL: begin returns 0 with RuntimeError set
 * when the heap is not ready, or, for a replay (`exclusive`), when another
 * call is in flight; the caller holds a reference to `self` throughout. */
int vgpy_heap_begin_unlocked(HeapObject *self, int exclusive);
void vgpy_heap_end_unlocked(HeapObject *self, int exclusive);

/* py_replay.c: Heap methods for replay and recording, and module functions. */
PyObject *vgpy_heap_replay(HeapObject *self, PyObject *args, PyObject *kwargs);
PyObject *vgpy_heap_history_start(HeapObject *self, PyObject *args, PyObject *kwargs);
PyObject *vgpy_heap_history_stop(HeapObject *self, PyObject *unused);
PyObject *vgpy_heap_history_take(HeapObject *self, PyObject *unused);
PyObject *vgpy_trace_peak_live(PyObject *module, PyObject *args);
PyObject *vgpy_expandable_replay(PyObject *module, PyObject *args, PyObject *kwargs);
PyObject *vgpy_take_events(vg_heap *h);

/* py_stacks.c: the allocation stacks of recordings (a vg_stack_source). */
uint32_t vgpy_stack_source(void);
int vgpy_stacks_init(PyObject *module);

/* py_pickle.c: None when a pickle holds plain data only, nested shallowly
 * enough to hash; else (byte offset, why). */
PyObject *vgpy_pickle_problem(PyObject *module, PyObject *data);

/* py_devices.c: the per-device heaps the torch entry points use. */
extern PyMethodDef vgpy_device_methods[];
int vgpy_devices_init(PyObject *module);
/* py_pools.c: CUDA graphs' private pools and captures. */
int vgpy_pools_init(PyObject *module);
/* py_report.c: interval peaks and the last out-of-memory, for reports. */
int vgpy_report_init(PyObject *module);

/* pymodule.c: the module's state. */
typedef struct {
    PyObject *heap_type;
} vgpy_module_state;

vgpy_module_state *vgpy_state(PyObject *module);

#endif
