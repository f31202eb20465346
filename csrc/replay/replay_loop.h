/* The loop that drives a trace through an allocator, shared by the heap's
 * replay (replay.c) and the emulation of PyTorch's expandable segments
 * (torch_expandable.c), so that both count allocations, OOMs and the
 * memory curve by the same rules.
 *
 * The loop is a static inline function, always inlined, and each caller
 * passes a constant table of its allocator's calls: the compiler then calls
 * them directly, as the hand-written loops did, and a bisection over
 * budgets keeps its millions of ops a second. */
#ifndef VG_REPLAY_LOOP_H
#define VG_REPLAY_LOOP_H

#include "vramguard/replay.h"

#include <stdbool.h>
#include <string.h>
#include <time.h>

/* An allocator as the replay sees it. `self` is the caller's. */
typedef struct vg_replay_engine {
    void *(*alloc)(void *self, uint64_t size, uint64_t stream);
    void (*free)(void *self, void *p);
    void (*empty_cache)(void *self);
    void (*synchronize)(void *self); /* NULL: the allocator is not involved */
    /* The current requested, allocated and reserved bytes: the curve. */
    void (*levels)(const void *self, vg_replay_sample *now);
    /* True once the host ran out of memory: the replay stops, and a NULL
     * from alloc was no OOM. NULL: the host never fails mid-replay. */
    bool (*host_failed)(const void *self);
} vg_replay_engine;

/* The memory curve: maxima over windows of `width` ops, `count` of them
 * written to `samples` (at most `capacity`). */
typedef struct vg_replay_window {
    vg_replay_sample *samples;
    size_t capacity, count, width, filled;
    vg_replay_sample current;
} vg_replay_window;

static inline double vg__replay_clock(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* One op into the current window (maxima). */
static inline __attribute__((always_inline)) void
vg__replay_window_note(vg_replay_window *w, uint64_t op, const vg_replay_engine *eng,
                       const void *self)
{
    if (w->count >= w->capacity) return;
    vg_replay_sample now, *c = &w->current;
    eng->levels(self, &now);
    if (now.requested > c->requested) c->requested = now.requested;
    if (now.allocated > c->allocated) c->allocated = now.allocated;
    if (now.reserved > c->reserved) c->reserved = now.reserved;
    c->op = op;
    if (++w->filled == w->width) {
        w->samples[w->count++] = *c;
        memset(c, 0, sizeof *c);
        w->filled = 0;
    }
}

/* Replays t's ops through `eng`, live[id] holding each allocation (NULL
 * for one refused), counting into `out` the ops, allocs, frees, OOMs, the
 * first OOM, the samples and the loop's seconds; `samples` (may be NULL)
 * gets up to `nsamples` windows of `window_ops` ops. False when the host
 * ran out of memory: the loop stopped there and `out` is partial. The
 * caller fills in the peaks and device calls, and frees what is live. */
static inline __attribute__((always_inline)) bool
vg__replay_loop(const vg_trace_ops *t, const vg_replay_engine *eng, void *self, void **live,
                vg_replay_sample *samples, size_t nsamples, size_t window_ops,
                vg_replay_result *out)
{
    vg_replay_window w = {samples, nsamples, 0, window_ops ? window_ops : 1, 0, {0, 0, 0, 0}};
    bool ok = true;
    double t0 = vg__replay_clock();
    for (size_t i = 0; ok && i < t->n; i++) {
        switch (t->kinds[i]) {
        case VG_OP_ALLOC: {
            uint32_t id = t->ids[i];
            live[id] = eng->alloc(self, t->sizes[i], t->streams ? t->streams[i] : 0);
            out->allocs++;
            if (!live[id]) {
                if (eng->host_failed && eng->host_failed(self)) {
                    ok = false;
                    break;
                }
                if (out->first_oom < 0) out->first_oom = (int64_t)i;
                out->ooms++;
            }
            break;
        }
        case VG_OP_FREE:
            /* An allocation that was refused has nothing to free. */
            if (live[t->ids[i]]) eng->free(self, live[t->ids[i]]);
            live[t->ids[i]] = NULL;
            out->frees++;
            break;
        case VG_OP_EMPTY_CACHE:
            eng->empty_cache(self);
            if (eng->host_failed && eng->host_failed(self)) ok = false;
            break;
        case VG_OP_SYNCHRONIZE:
            if (eng->synchronize) eng->synchronize(self);
            break;
        }
        if (samples) vg__replay_window_note(&w, i, eng, self);
    }
    out->seconds = vg__replay_clock() - t0;
    if (samples && w.filled && w.count < w.capacity) samples[w.count++] = w.current;
    out->ops = t->n;
    out->samples = w.count;
    return ok;
}

#endif
