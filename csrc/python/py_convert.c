/* Conversions between the core's structs and Python objects. */
#include "py_internal.h"
#include "vramguard/devices.h"

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ */
/* Arguments                                                           */
/* ------------------------------------------------------------------ */

int vgpy_as_u64(PyObject *obj, const char *what, uint64_t *out)
{
    /* True is an int to Python, never a size or an address to a person. */
    if (PyBool_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int, not bool", what);
        return -1;
    }
    if (!PyLong_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int, not %R", what, (PyObject *)Py_TYPE(obj));
        return -1;
    }
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (overflow < 0 || (!overflow && v < 0)) {
        PyErr_Format(PyExc_ValueError, "%s must not be negative", what);
        return -1;
    }
    if (overflow > 0) {
        unsigned long long u = PyLong_AsUnsignedLongLong(obj);
        if (u == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "%s is too large (more than 64 bits)", what);
            return -1;
        }
        *out = u;
        return 0;
    }
    *out = (uint64_t)v;
    return 0;
}

/* Sizes people type ("2GiB", "T4", a bare 15) follow one rule everywhere,
 * the one vramguard._units writes down; it is read when a heap is made or
 * its budget set, never on the hot path, and with no heap lock held. */
static int as_u64_by_rule(const char *rule, PyObject *obj, const char *what, uint64_t *out)
{
    PyObject *units = PyImport_ImportModule("vramguard._units");
    if (!units) return -1;
    PyObject *bytes = PyObject_CallMethod(units, rule, "Os", obj, what);
    Py_DECREF(units);
    if (!bytes) return -1;
    int rc = vgpy_as_u64(bytes, what, out);
    Py_DECREF(bytes);
    return rc;
}

int vgpy_as_size(PyObject *obj, const char *what, uint64_t *out)
{
    if (!PyUnicode_Check(obj)) return vgpy_as_u64(obj, what, out);
    return as_u64_by_rule("parse_size", obj, what, out);
}

int vgpy_as_budget(PyObject *obj, uint64_t *out)
{
    *out = 0;
    if (!obj || obj == Py_None) return 0;
    return as_u64_by_rule("parse_budget", obj, "budget", out);
}

static int fraction_error(PyObject *obj, const char *what)
{
    PyErr_Format(PyExc_ValueError, "%s must be a fraction in (0, 1], got %R", what, obj);
    return -1;
}

int vgpy_as_fraction(PyObject *obj, const char *what, double *out)
{
    *out = 0.0;
    if (!obj || obj == Py_None) return 0;
    if (PyBool_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be a number, not bool", what);
        return -1;
    }
    double v = PyFloat_AsDouble(obj);
    if (v == -1.0 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError)) return -1;
        PyErr_Clear(); /* an int past any float: out of range, like 1e400 */
        return fraction_error(obj, what);
    }
    /* The core's rule (vg_valid_fraction), less 0: here None is off. */
    if (!vg_valid_fraction(v) || v == 0.0) return fraction_error(obj, what);
    *out = v;
    return 0;
}

int vgpy_as_setting(PyObject *obj, const char *what, double *out)
{
    /* The core's own convention: 0 is off too. */
    if (obj && !PyBool_Check(obj) && (PyLong_Check(obj) || PyFloat_Check(obj))) {
        int zero = PyObject_Not(obj);
        if (zero < 0) return -1;
        if (zero) {
            *out = 0.0;
            return 0;
        }
    }
    return vgpy_as_fraction(obj, what, out);
}

const char *vgpy_hex(uint64_t value, char *buf, size_t n)
{
    snprintf(buf, n, "0x%llx", (unsigned long long)value);
    return buf;
}

/* ------------------------------------------------------------------ */
/* Stats                                                               */
/* ------------------------------------------------------------------ */

static int set_item(PyObject *d, const char *key, PyObject *value)
{
    if (!value) return -1;
    int rc = PyDict_SetItemString(d, key, value);
    Py_DECREF(value);
    return rc;
}

static int set_u64(PyObject *d, const char *key, uint64_t v)
{
    return set_item(d, key, PyLong_FromUnsignedLongLong(v));
}

int vgpy_set_stat(PyObject *d, const char *name, const vg_stat *s)
{
    static const char *const pools[VG_STAT_TYPES] = {"all", "small_pool", "large_pool"};
    static const char *const parts[4] = {"current", "peak", "allocated", "freed"};
    char key[96];
    for (int p = 0; p < VG_STAT_TYPES; p++) {
        const int64_t values[4] = {s[p].current, s[p].peak, s[p].allocated, s[p].freed};
        for (int k = 0; k < 4; k++) {
            snprintf(key, sizeof key, "%s.%s.%s", name, pools[p], parts[k]);
            if (set_item(d, key, PyLong_FromLongLong(values[k])) < 0) return -1;
        }
    }
    return 0;
}

typedef struct counter_name {
    const char *key;
    size_t offset;
} counter_name;

#define COUNTER(field) {#field, offsetof(vg_stats, field)}

static const counter_name counters[] = {
    COUNTER(num_device_alloc), COUNTER(num_device_free), COUNTER(num_device_alloc_failed),
    COUNTER(num_cache_hits), COUNTER(num_cache_misses), COUNTER(num_splits),
    COUNTER(num_merges), COUNTER(num_alloc_retries), COUNTER(num_ooms),
    COUNTER(num_budget_refusals), COUNTER(num_gc_releases), COUNTER(num_stream_releases),
    COUNTER(num_sync_all_streams), COUNTER(num_sync_releases), COUNTER(num_empty_cache),
    COUNTER(num_empty_cache_releases), COUNTER(num_shrunk_segments),
    COUNTER(num_budget_releases), COUNTER(num_kept_whole), COUNTER(num_oversize_releases),
    COUNTER(num_oversize_splits), COUNTER(num_invalid_frees), COUNTER(num_record_stream),
    COUNTER(num_deferred_frees), COUNTER(num_zero_allocs), COUNTER(num_device_errors),
    COUNTER(num_maps), COUNTER(num_mapped_pages), COUNTER(num_unmaps),
    COUNTER(num_unmapped_pages), COUNTER(num_unmap_syncs), COUNTER(num_unmap_skips), COUNTER(num_range_reserves),
    COUNTER(num_range_releases), COUNTER(num_unmaps_refused), COUNTER(num_oom_fast_fails),
};

static int set_fragmentation(PyObject *d, vg_heap *h)
{
    vg_fragmentation fr;
    vg_heap_fragmentation(h, &fr);
    if (set_u64(d, "fragmentation.free_bytes", fr.free_bytes) < 0) return -1;
    if (set_u64(d, "fragmentation.largest_free_block", fr.largest_free_block) < 0) return -1;
    if (set_u64(d, "fragmentation.free_blocks", fr.free_blocks) < 0) return -1;
    if (set_u64(d, "fragmentation.pending_blocks", fr.pending_blocks) < 0) return -1;
    if (set_u64(d, "fragmentation.largest_free_range", fr.largest_free_range) < 0) return -1;
    if (set_u64(d, "fragmentation.releasable_bytes", fr.releasable_bytes) < 0) return -1;
    if (set_u64(d, "fragmentation.largest_allocatable", fr.largest_allocatable) < 0) return -1;
    if (set_item(d, "fragmentation.external", PyFloat_FromDouble(fr.external)) < 0) return -1;
    if (set_item(d, "fragmentation.unused", PyFloat_FromDouble(fr.unused)) < 0) return -1;
    return 0;
}

PyObject *vgpy_stats_dict(vg_heap *h)
{
    vg_stats st;
    vg_heap_stats(h, &st);
    PyObject *d = PyDict_New();
    if (!d) return NULL;
    int rc = 0;
#define SET_STAT(name) if (!rc) rc = vgpy_set_stat(d, #name, st.name);
    VG_TOTALED_STAT_LIST(SET_STAT)
#undef SET_STAT
    for (size_t i = 0; !rc && i < sizeof counters / sizeof counters[0]; i++) {
        uint64_t v;
        memcpy(&v, (const char *)&st + counters[i].offset, sizeof v);
        rc = set_u64(d, counters[i].key, v);
    }
    if (!rc) rc = set_fragmentation(d, h);
    if (!rc) rc = set_u64(d, "budget_bytes", vg_heap_budget(h));
    if (!rc) rc = set_item(d, "arena", PyBool_FromLong(vg_heap_uses_arena(h)));
    if (!rc) rc = set_u64(d, "page_size", vg_heap_uses_arena(h) ? vg_heap_device(h)->page_size : 0);
    if (!rc) rc = set_item(d, "gc_threshold", PyFloat_FromDouble(vg_heap_gc_threshold(h)));
    if (rc) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}

/* ------------------------------------------------------------------ */
/* Segments and histogram                                              */
/* ------------------------------------------------------------------ */

/* Walks copy what they need into C memory while the heap is locked, and
 * build Python objects only after the lock is released: creating an object
 * can run the cyclic GC, and with it any finalizer (one that frees a tensor
 * into this heap, or one that lets another thread take the GIL and then
 * wait for this heap). Nothing here runs Python with the lock held. */

/* A mapped run of an arena range: offset from its start and bytes. */
typedef struct mapped_run {
    size_t offset, size;
} mapped_run;

typedef struct pool_id {
    uint64_t id0, id1;
    int set;
} pool_id;

typedef struct segments_copy {
    vg_segment_info *segs;
    vg_block_info *blocks;
    size_t nsegs, nblocks, segs_cap, blocks_cap;
    mapped_run *runs;
    size_t *seg_runs; /* per segment: its number of runs (segs_cap entries) */
    size_t nruns, runs_cap, seg_runs_cap;
    pool_id pool;      /* the private pool being visited (set = 0: a heap's own) */
    pool_id *seg_pool; /* per segment: its pool */
    size_t seg_pool_cap;
} segments_copy;

/* Host memory only (no Python allocator): this runs with the heap locked. */
static int grow(void **items, size_t *cap, size_t used, size_t item_size)
{
    if (used < *cap) return 0;
    size_t cap2 = *cap ? *cap * 2 : 64;
    void *grown = realloc(*items, cap2 * item_size);
    if (!grown) return -1;
    *items = grown;
    *cap = cap2;
    return 0;
}

static inline int page_bit(const vg_segment_info *si, size_t i)
{
    return (int)(si->pages[i / 64] >> (i % 64) & 1u);
}

/* The range's mapped runs, from its bitmap (a zero word at a time). */
static int copy_runs(segments_copy *c, const vg_segment_info *si, size_t *count)
{
    size_t end = si->page_words * 64, i = 0;
    *count = 0;
    while (i < end) {
        if (i % 64 == 0 && si->pages[i / 64] == 0) {
            i += 64;
            continue;
        }
        if (!page_bit(si, i)) {
            i++;
            continue;
        }
        size_t run = i;
        while (run < end && page_bit(si, run)) run++;
        if (grow((void **)&c->runs, &c->runs_cap, c->nruns, sizeof *c->runs) < 0) return -1;
        c->runs[c->nruns++] = (mapped_run){i * si->page_size, (run - i) * si->page_size};
        ++*count;
        i = run;
    }
    return 0;
}

static int copy_segment(void *arg, const vg_segment_info *si)
{
    segments_copy *c = arg;
    if (grow((void **)&c->segs, &c->segs_cap, c->nsegs, sizeof *c->segs) < 0) return -1;
    if (grow((void **)&c->seg_runs, &c->seg_runs_cap, c->nsegs, sizeof *c->seg_runs) < 0) return -1;
    if (grow((void **)&c->seg_pool, &c->seg_pool_cap, c->nsegs, sizeof *c->seg_pool) < 0) return -1;
    size_t count = 0;
    if (si->pages && copy_runs(c, si, &count) < 0) return -1;
    c->seg_runs[c->nsegs] = count;
    c->seg_pool[c->nsegs] = c->pool;
    c->segs[c->nsegs] = *si;
    c->segs[c->nsegs].pages = NULL; /* not valid past the walk */
    c->nsegs++;
    return 0;
}

static int copy_pool(void *arg, uint64_t id0, uint64_t id1)
{
    segments_copy *c = arg;
    c->pool = (pool_id){id0, id1, 1};
    return 0;
}

static int copy_block(void *arg, const vg_block_info *bi)
{
    segments_copy *c = arg;
    if (grow((void **)&c->blocks, &c->blocks_cap, c->nblocks, sizeof *c->blocks) < 0) return -1;
    c->blocks[c->nblocks++] = *bi;
    return 0;
}

static const char *const state_names[] = {"free", "live", "pending"};

static PyObject *block_dict(const vg_block_info *bi)
{
    PyObject *d = Py_BuildValue("{s:K,s:K,s:K,s:s}", "address", (unsigned long long)bi->addr, "size",
                                (unsigned long long)bi->size, "requested",
                                (unsigned long long)bi->requested, "state", state_names[bi->state]);
    /* A live block a recording with stacks made: its stack id (py_stacks.c). */
    if (d && bi->stack) {
        PyObject *stack = PyLong_FromUnsignedLong(bi->stack);
        if (!stack || PyDict_SetItemString(d, "stack", stack) < 0) Py_CLEAR(d);
        Py_XDECREF(stack);
    }
    return d;
}

/* A segment's dict, with the list of its blocks (its si->blocks entries of
 * `blocks`, in address order). */
static PyObject *runs_list(const vg_segment_info *si, const mapped_run *runs, size_t n)
{
    if (!si->page_size) Py_RETURN_NONE;
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list && i < n; i++) {
        PyObject *pair = Py_BuildValue("(KK)", (unsigned long long)runs[i].offset,
                                       (unsigned long long)runs[i].size);
        if (!pair) Py_CLEAR(list);
        else if (PyList_SetItem(list, (Py_ssize_t)i, pair) < 0) Py_CLEAR(list);
    }
    return list;
}

static PyObject *segment_dict(const vg_segment_info *si, const vg_block_info *blocks,
                              const mapped_run *runs, size_t nruns, pool_id pool)
{
    PyObject *mapped_runs = runs_list(si, runs, nruns);
    if (!mapped_runs) return NULL;
    PyObject *list = PyList_New((Py_ssize_t)si->blocks);
    for (size_t i = 0; list && i < si->blocks; i++) {
        PyObject *blk = block_dict(&blocks[i]);
        if (!blk) Py_CLEAR(list);
        else if (PyList_SetItem(list, (Py_ssize_t)i, blk) < 0) Py_CLEAR(list);
    }
    if (!list) {
        Py_DECREF(mapped_runs);
        return NULL;
    }
    PyObject *d = Py_BuildValue("{s:K,s:K,s:K,s:s,s:K,s:K,s:N,s:N}", "address",
                                (unsigned long long)si->addr, "size", (unsigned long long)si->size,
                                "stream", (unsigned long long)si->stream, "pool",
                                si->pool == VG_POOL_SMALL ? "small" : "large", "allocated",
                                (unsigned long long)si->allocated, "mapped",
                                (unsigned long long)si->mapped, "mapped_runs", mapped_runs, "blocks",
                                list);
    /* A CUDA graph's private pool: its id, as PyTorch's MempoolId_t. */
    if (d && pool.set) {
        PyObject *id = Py_BuildValue("(KK)", (unsigned long long)pool.id0, (unsigned long long)pool.id1);
        if (!id || PyDict_SetItemString(d, "pool_id", id) < 0) Py_CLEAR(d);
        Py_XDECREF(id);
    }
    return d;
}

/* The list of a copy's segments, built after the locks are let go; frees
 * the copy. rc: the visit's (non-zero: host memory ran out). */
static PyObject *segments_of_copy(segments_copy *c, int rc)
{
    PyObject *list = rc ? PyErr_NoMemory() : PyList_New((Py_ssize_t)c->nsegs);
    const vg_block_info *blocks = c->blocks;
    const mapped_run *runs = c->runs;
    for (size_t i = 0; list && i < c->nsegs; i++) {
        PyObject *seg = segment_dict(&c->segs[i], blocks, runs, c->seg_runs[i], c->seg_pool[i]);
        blocks += c->segs[i].blocks;
        runs += c->seg_runs[i];
        if (!seg) Py_CLEAR(list);
        else if (PyList_SetItem(list, (Py_ssize_t)i, seg) < 0) Py_CLEAR(list);
    }
    free(c->segs);
    free(c->blocks);
    free(c->runs);
    free(c->seg_runs);
    free(c->seg_pool);
    return list;
}

PyObject *vgpy_segments_list(vg_heap *h)
{
    segments_copy c = {0};
    return segments_of_copy(&c, vg_heap_visit(h, copy_segment, copy_block, &c));
}

PyObject *vgpy_pool_segments_list(int device)
{
    segments_copy c = {0};
    return segments_of_copy(&c, vg_devices_visit_pools(device, copy_pool, copy_segment, copy_block, &c));
}

PyObject *vgpy_histogram_list(vg_heap *h)
{
    /* One call, with room for every class: what it returns was written. */
    uint64_t *lower = malloc(VG_SIZE_CLASSES * sizeof *lower);
    uint64_t *count = malloc(VG_SIZE_CLASSES * sizeof *count);
    size_t n = lower && count ? vg_heap_histogram(h, lower, count, VG_SIZE_CLASSES) : 0;
    PyObject *list = lower && count ? PyList_New((Py_ssize_t)n) : PyErr_NoMemory();
    for (size_t i = 0; list && i < n; i++) {
        PyObject *pair = Py_BuildValue("(KK)", (unsigned long long)lower[i], (unsigned long long)count[i]);
        if (!pair) Py_CLEAR(list);
        else if (PyList_SetItem(list, (Py_ssize_t)i, pair) < 0) Py_CLEAR(list);
    }
    free(lower);
    free(count);
    return list;
}

/* ------------------------------------------------------------------ */
/* OOM                                                                 */
/* ------------------------------------------------------------------ */

/* Raise `type(msg)` with each item of `attrs` (a new reference, or NULL
 * with an error set) as an attribute of the exception. */
static void raise_with_attrs(PyObject *type, const char *msg, PyObject *attrs)
{
    if (!attrs) return;
    PyObject *exc = PyObject_CallFunction(type, "s", msg);
    if (exc) {
        PyObject *key, *value;
        Py_ssize_t pos = 0;
        while (PyDict_Next(attrs, &pos, &key, &value)) {
            if (PyObject_SetAttr(exc, key, value) < 0) break;
        }
        if (!PyErr_Occurred()) PyErr_SetObject(type, exc);
        Py_DECREF(exc);
    }
    Py_DECREF(attrs);
}

/* A device error is not an out-of-memory: RuntimeError, as PyTorch raises
 * for a failed CUDA call, with the runtime's error name beside it. */
static void raise_device_error(const vg_oom_info *info, const char *device_kind)
{
    char msg[1536];
    vg_format_device_error(info, device_kind, msg, sizeof msg);
    PyObject *attrs = Py_BuildValue("{s:s,s:i,s:s,s:K,s:i}", "error_name", info->device_error.name,
                                    "error_code", info->device_error.code, "failed_call",
                                    info->device_error.call, "requested_bytes",
                                    (unsigned long long)info->requested, "device", info->device);
    raise_with_attrs(PyExc_RuntimeError, msg, attrs);
}

void vgpy_raise_oom(const vg_oom_info *oom, const char *device_kind)
{
    if (oom->status == VG_ERR_DEVICE) {
        raise_device_error(oom, device_kind);
        return;
    }
    char msg[1024];
    vg_format_oom(oom, device_kind, msg, sizeof msg);
    PyObject *attrs = Py_BuildValue(
        "{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:i,s:O}", "requested_bytes",
        (unsigned long long)oom->requested, "rounded_bytes", (unsigned long long)oom->rounded,
        "budget_bytes", (unsigned long long)oom->budget, "device_total",
        (unsigned long long)oom->device_total, "device_free", (unsigned long long)oom->device_free,
        "allocated_bytes", (unsigned long long)oom->allocated, "reserved_bytes",
        (unsigned long long)oom->reserved, "largest_free_block",
        (unsigned long long)oom->largest_free_block, "free_blocks",
        (unsigned long long)oom->free_blocks, "free_bytes", (unsigned long long)oom->free_bytes,
        "largest_allocatable", (unsigned long long)oom->largest_allocatable,
        "device", oom->device, "budget_refused", oom->budget_refused ? Py_True : Py_False);
    if (attrs && oom->arena) {
        /* The arena's own terms: mapped memory, its ranges, what was
         * unmapped; largest_free_range is address space, kept for programs
         * that read it (the message shows largest_allocatable). */
        PyObject *extra = Py_BuildValue("{s:O,s:K,s:K,s:K}", "arena", Py_True, "ranges",
                                        (unsigned long long)oom->ranges, "largest_free_range",
                                        (unsigned long long)oom->largest_free_range,
                                        "unmapped_bytes", (unsigned long long)oom->unmapped_bytes);
        if (!extra || PyDict_Update(attrs, extra) < 0) Py_CLEAR(attrs);
        Py_XDECREF(extra);
    }
    raise_with_attrs(PyExc_MemoryError, msg, attrs);
}
