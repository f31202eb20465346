/* Stream-safe frees (deferred_free.c): a block another stream used
 * (record_stream) waits on the pending list until that stream's work is
 * done, and synchronizing the device finishes every such wait. */
#ifndef VG_DEFERRED_FREE_H
#define VG_DEFERRED_FREE_H

#include "heap_internal.h"

/* Record an event on every other stream that used `blk`, just freed, and
 * put it on the pending list (it becomes free once they have passed it). */
void vg__defer_free(vg_heap *h, vg_block *blk);
/* Finish deferred frees whose events have completed. */
void vg__process_pending(vg_heap *h);
/* Wait for the device and finish every deferred free. Called with the
 * lock held, it releases the lock for the wait and takes it again: the
 * heap may have changed meanwhile, so a caller looks again at whatever it
 * had found before (blocks, segments, the bins). */
void vg__synchronize(vg_heap *h);
/* Give back a block's stream-use records, and their events. */
void vg__uses_recycle(vg_heap *h, vg_block *blk);

#endif
