/* vramguard: traces (allocation sequences, recorded or imported) and their
 * replay through a heap (replay.c). */
#ifndef VRAMGUARD_REPLAY_H
#define VRAMGUARD_REPLAY_H

#include "vramguard/heap.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A trace is columnar: op kinds, allocation ids (dense, 0..nids-1), sizes
 * and streams, one entry per op. Frees name the id of their allocation. */
enum vg_op_kind {
    VG_OP_ALLOC = 1,       /* id, size (requested bytes), stream */
    VG_OP_FREE = 2,        /* id */
    VG_OP_EMPTY_CACHE = 3,
    VG_OP_SYNCHRONIZE = 4,
};

typedef struct vg_trace_ops {
    const uint8_t *kinds;
    const uint32_t *ids;
    const uint64_t *sizes;
    const uint64_t *streams;
    size_t n;
    size_t nids;
} vg_trace_ops;

/* One point of the memory curve: maxima over a window of ops. */
typedef struct vg_replay_sample {
    uint64_t op;               /* last op of the window */
    uint64_t requested;
    uint64_t allocated;
    uint64_t reserved;
} vg_replay_sample;

typedef struct vg_replay_result {
    uint64_t ops;
    uint64_t allocs, frees, ooms;
    int64_t first_oom;         /* op index, -1 if none */
    uint64_t peak_requested, peak_allocated, peak_reserved;
    uint64_t device_alloc, device_free, alloc_retries;
    uint64_t samples;          /* windows written to `samples` */
    double seconds;            /* the replay loop alone */
} vg_replay_result;

/* Check a trace before replaying it: no more ids than ops (so that what a
 * replay allocates per id is bounded by the trace's own size), kinds known,
 * ids in range, every free of a live id, no id allocated twice while live,
 * sizes from 1 to VG_MAX_REQUEST. NULL when valid, else a static message and
 * *bad_op the op at fault (SIZE_MAX when the fault is the trace as a whole). */
const char *vg_trace_validate(const vg_trace_ops *t, size_t *bad_op);
/* The message vg_trace_validate returns when the host, not the trace, failed. */
extern const char vg_trace_out_of_memory[];
/* Peak of live requested bytes of a validated trace: the physical limit,
 * whatever the policy. VG_ERR_NOMEM when the host runs out, VG_ERR_ARG when
 * the live bytes pass 2^64 - 1; *peak is set only on VG_OK. */
int vg_trace_peak_live(const vg_trace_ops *t, uint64_t *peak);
/* Replay a validated trace through `h`, which nobody else may use meanwhile
 * (its counters are read without the lock). `samples` (may be NULL) gets up
 * to `nsamples` windows of `window` ops. VG_ERR_NOMEM if the host runs out. */
int vg_replay(vg_heap *h, const vg_trace_ops *t, vg_replay_sample *samples, size_t nsamples,
              size_t window, vg_replay_result *out);

#ifdef __cplusplus
}
#endif
#endif
