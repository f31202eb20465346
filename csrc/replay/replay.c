/* Replaying a recorded allocation trace through a heap: the engine behind
 * "would this fit in 15 GiB?" and behind the policy comparisons. It runs
 * in C so that a bisection over budgets replays millions of ops a second. */
#include "heap_internal.h"
#include "replay_loop.h"

#include <stdlib.h>
#include <string.h>

const char vg_trace_out_of_memory[] = "out of host memory";

_Static_assert(VG_MAX_REQUEST == (size_t)1 << 47, "op_fault's message names 128 TiB");

/* The first fault of one op, given which ids are live before it. */
static const char *op_fault(const vg_trace_ops *t, size_t i, const uint8_t *live)
{
    uint8_t kind = t->kinds[i];
    if (kind == VG_OP_EMPTY_CACHE || kind == VG_OP_SYNCHRONIZE) return NULL;
    if (kind != VG_OP_ALLOC && kind != VG_OP_FREE) return "unknown op kind";
    if (t->ids[i] >= t->nids) return "allocation id out of range";
    if (kind == VG_OP_FREE) return live[t->ids[i]] ? NULL : "free of an id that is not live";
    if (live[t->ids[i]]) return "id allocated again while live";
    if (t->sizes[i] == 0) return "allocation of 0 bytes";
    if (t->sizes[i] > VG_MAX_REQUEST) return "allocation larger than any heap serves (128 TiB)";
    return NULL;
}

const char *vg_trace_validate(const vg_trace_ops *t, size_t *bad_op)
{
    /* Every id is allocated by an op, so a count above the ops is a lie
     * that would size the arrays below (and a replay's) from nothing. */
    if (t->nids > t->n) {
        if (bad_op) *bad_op = SIZE_MAX;
        return "more allocation ids than ops";
    }
    uint8_t *live = calloc(t->nids ? t->nids : 1, 1);
    if (!live) {
        if (bad_op) *bad_op = SIZE_MAX;
        return vg_trace_out_of_memory;
    }
    const char *err = NULL;
    size_t i = 0;
    for (; i < t->n; i++) {
        err = op_fault(t, i, live);
        if (err) break;
        if (t->kinds[i] == VG_OP_ALLOC || t->kinds[i] == VG_OP_FREE)
            live[t->ids[i]] = t->kinds[i] == VG_OP_ALLOC;
    }
    if (err && bad_op) *bad_op = i;
    free(live);
    return err;
}

int vg_trace_peak_live(const vg_trace_ops *t, uint64_t *peak_out)
{
    uint64_t *size_of = calloc(t->nids ? t->nids : 1, sizeof *size_of);
    if (!size_of) return VG_ERR_NOMEM;
    uint64_t live = 0, peak = 0;
    int rc = VG_OK;
    for (size_t i = 0; i < t->n; i++) {
        if (t->kinds[i] == VG_OP_ALLOC) {
            if (t->sizes[i] > UINT64_MAX - live) {
                rc = VG_ERR_ARG; /* more than 2^64 bytes live at once */
                break;
            }
            size_of[t->ids[i]] = t->sizes[i];
            live += t->sizes[i];
            if (live > peak) peak = live;
        } else if (t->kinds[i] == VG_OP_FREE) {
            live -= size_of[t->ids[i]];
        }
    }
    free(size_of);
    if (rc == VG_OK) *peak_out = peak;
    return rc;
}

/* The heap as the replay loop drives it. */
static void *heap_alloc(void *h, uint64_t size, uint64_t stream)
{
    return vg_heap_alloc(h, size, stream, NULL);
}

static void heap_free(void *h, void *p)
{
    vg_heap_free(h, p);
}

static void heap_empty_cache(void *h)
{
    vg_heap_empty_cache(h);
}

static void heap_synchronize(void *h)
{
    vg_heap_synchronize(h);
}

/* The replay owns the heap: its counters can be read without the lock. */
static void heap_levels(const void *h, vg_replay_sample *now)
{
    const vg_stats *st = &((const vg_heap *)h)->stats;
    now->requested = (uint64_t)st->requested_bytes[VG_STAT_ALL].current;
    now->allocated = (uint64_t)st->allocated_bytes[VG_STAT_ALL].current;
    now->reserved = (uint64_t)st->reserved_bytes[VG_STAT_ALL].current;
}

static const vg_replay_engine heap_engine = {
    .alloc = heap_alloc,
    .free = heap_free,
    .empty_cache = heap_empty_cache,
    .synchronize = heap_synchronize,
    .levels = heap_levels,
    .host_failed = NULL, /* a heap that cannot get host memory refuses: an OOM */
};

int vg_replay(vg_heap *h, const vg_trace_ops *t, vg_replay_sample *samples, size_t nsamples,
              size_t window_ops, vg_replay_result *out)
{
    void **ptr = calloc(t->nids ? t->nids : 1, sizeof *ptr);
    if (!ptr) return VG_ERR_NOMEM;
    memset(out, 0, sizeof *out);
    out->first_oom = -1;
    vg__replay_loop(t, &heap_engine, h, ptr, samples, nsamples, window_ops, out);
    const vg_stats *st = &h->stats;
    out->peak_requested = (uint64_t)st->requested_bytes[VG_STAT_ALL].peak;
    out->peak_allocated = (uint64_t)st->allocated_bytes[VG_STAT_ALL].peak;
    out->peak_reserved = (uint64_t)st->reserved_bytes[VG_STAT_ALL].peak;
    out->device_alloc = st->num_device_alloc;
    out->device_free = st->num_device_free;
    out->alloc_retries = st->num_alloc_retries;
    for (size_t i = 0; i < t->nids; i++) vg_heap_free(h, ptr[i]);
    free(ptr);
    return VG_OK;
}
