/* Replaying a recorded allocation trace through a heap: the engine behind
 * "would this fit in 15 GiB?" and behind the policy comparisons. It runs
 * in C so that a bisection over budgets replays millions of ops a second. */
#include "heap_internal.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

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

typedef struct window {
    vg_replay_sample *samples;
    size_t capacity, count, width, filled;
    vg_replay_sample current;
} window;

static void window_note(window *w, uint64_t op, const vg_stats *st)
{
    if (!w->samples || w->count >= w->capacity) return;
    vg_replay_sample *c = &w->current;
    uint64_t req = (uint64_t)st->requested_bytes[VG_STAT_ALL].current;
    uint64_t alloc = (uint64_t)st->allocated_bytes[VG_STAT_ALL].current;
    uint64_t res = (uint64_t)st->reserved_bytes[VG_STAT_ALL].current;
    if (req > c->requested) c->requested = req;
    if (alloc > c->allocated) c->allocated = alloc;
    if (res > c->reserved) c->reserved = res;
    c->op = op;
    if (++w->filled == w->width) {
        w->samples[w->count++] = *c;
        memset(c, 0, sizeof *c);
        w->filled = 0;
    }
}

int vg_replay(vg_heap *h, const vg_trace_ops *t, vg_replay_sample *samples, size_t nsamples,
              size_t window_ops, vg_replay_result *out)
{
    void **ptr = calloc(t->nids ? t->nids : 1, sizeof *ptr);
    if (!ptr) return VG_ERR_NOMEM;
    memset(out, 0, sizeof *out);
    out->first_oom = -1;
    window w = {samples, nsamples, 0, window_ops ? window_ops : 1, 0, {0, 0, 0, 0}};
    /* The replay owns the heap: its counters can be read without the lock. */
    const vg_stats *st = &h->stats;
    double t0 = now_s();
    for (size_t i = 0; i < t->n; i++) {
        switch (t->kinds[i]) {
        case VG_OP_ALLOC:
            ptr[t->ids[i]] = vg_heap_alloc(h, t->sizes[i], t->streams[i], NULL);
            out->allocs++;
            if (!ptr[t->ids[i]]) {
                if (out->first_oom < 0) out->first_oom = (int64_t)i;
                out->ooms++;
            }
            break;
        case VG_OP_FREE:
            /* An allocation that failed has nothing to free. */
            if (ptr[t->ids[i]]) vg_heap_free(h, ptr[t->ids[i]]);
            ptr[t->ids[i]] = NULL;
            out->frees++;
            break;
        case VG_OP_EMPTY_CACHE:
            vg_heap_empty_cache(h);
            break;
        case VG_OP_SYNCHRONIZE:
            vg_heap_synchronize(h);
            break;
        }
        if (samples) window_note(&w, i, st);
    }
    out->seconds = now_s() - t0;
    if (samples && w.filled && w.count < w.capacity) samples[w.count++] = w.current;
    out->ops = t->n;
    out->samples = w.count;
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
