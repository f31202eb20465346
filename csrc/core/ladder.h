/* The out-of-memory ladder (ladder.c): what an allocation asks when it
 * needs a block, and the request it carries through the steps. */
#ifndef VG_LADDER_H
#define VG_LADDER_H

#include "heap_internal.h"

/* ladder.c: for an allocation of r->rounded bytes (a multiple of VG_ALIGN)
 * in r->pool for r->stream, a free block in r->block, from the cache or
 * from the out-of-memory ladder; false when every step failed. */
typedef struct vg_request {
    vg_stream_state *stream;
    int pool;
    size_t rounded;
    vg_block *block;        /* the answer */
    vg_block *kept_whole;   /* a cached fit the policy keeps whole */
    bool budget_refused;    /* the budget refused the last segment asked for */
    bool fresh;             /* the answer is a segment reserved for it (arena:
                               pages were mapped for it) */
    size_t missing;         /* arena: bytes the last placement had to map */
} vg_request;
bool vg__find_block(vg_heap *h, vg_request *r);

#endif
