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

const char *vg_trace_validate(const vg_trace_ops *t, size_t *bad_op)
{
    uint8_t *live = calloc(t->nids ? t->nids : 1, 1);
    if (!live) return "out of host memory";
    const char *err = NULL;
    size_t i = 0;
    for (; i < t->n && !err; i++) {
        uint8_t kind = t->kinds[i];
        if (kind == VG_OP_EMPTY_CACHE || kind == VG_OP_SYNCHRONIZE) continue;
        if (kind != VG_OP_ALLOC && kind != VG_OP_FREE) err = "unknown op kind";
        else if (t->ids[i] >= t->nids) err = "allocation id out of range";
        else if (kind == VG_OP_ALLOC && live[t->ids[i]]) err = "id allocated again while live";
        else if (kind == VG_OP_ALLOC && t->sizes[i] == 0) err = "allocation of 0 bytes";
        else if (kind == VG_OP_FREE && !live[t->ids[i]]) err = "free of an id that is not live";
        else live[t->ids[i]] = kind == VG_OP_ALLOC;
    }
    if (err && bad_op) *bad_op = i - 1;
    free(live);
    return err;
}

uint64_t vg_trace_peak_live(const vg_trace_ops *t)
{
    uint64_t *size_of = calloc(t->nids ? t->nids : 1, sizeof *size_of);
    if (!size_of) return 0;
    uint64_t live = 0, peak = 0;
    for (size_t i = 0; i < t->n; i++) {
        if (t->kinds[i] == VG_OP_ALLOC) {
            size_of[t->ids[i]] = t->sizes[i];
            live += t->sizes[i];
            if (live > peak) peak = live;
        } else if (t->kinds[i] == VG_OP_FREE) {
            live -= size_of[t->ids[i]];
        }
    }
    free(size_of);
    return peak;
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
