/* Stream-safe frees. A block that streams besides its own used
 * (record_stream) is not free when its owner frees it: an event is
 * recorded on each of those streams, and the block waits on the pending
 * list, oldest first, until every event has completed (or a synchronize
 * begun after the free has returned), then becomes free as any other
 * (vg__block_make_free, blocks.h). Allocations look at the list first;
 * the ladder synchronizes, with the lock released, when the cache runs
 * dry. */
#include "deferred_free.h"
#include "addr_map.h"
#include "blocks.h"
#include "recording.h"

#include <string.h>

/* ------------------------------------------------------------------ */
/* Stream-use records                                                  */
/* ------------------------------------------------------------------ */

static vg_stream_use *new_use(vg_heap *h)
{
    if (!h->spare_uses) {
        vg_stream_use *items = vg__slab_new(h, sizeof(vg_stream_use));
        if (!items) return NULL;
        for (size_t i = 0; i < VG_BLOCK_SLAB; i++) {
            items[i].next = h->spare_uses;
            h->spare_uses = &items[i];
        }
    }
    vg_stream_use *use = h->spare_uses;
    h->spare_uses = use->next;
    memset(use, 0, sizeof *use);
    return use;
}

void vg__uses_recycle(vg_heap *h, vg_block *blk)
{
    while (blk->uses) {
        vg_stream_use *use = blk->uses;
        blk->uses = use->next;
        if (use->has_event) h->dev->ops->event_release(h->dev, use->event);
        use->next = h->spare_uses;
        h->spare_uses = use;
    }
}

/* ------------------------------------------------------------------ */
/* The pending list                                                    */
/* ------------------------------------------------------------------ */

static void pending_append(vg_heap *h, vg_block *blk)
{
    blk->link.wait.next = NULL;
    blk->link.wait.prev = h->pending_tail;
    if (h->pending_tail) h->pending_tail->link.wait.next = blk;
    else h->pending = blk;
    h->pending_tail = blk;
}

static void pending_remove(vg_heap *h, vg_block *blk)
{
    if (blk->link.wait.prev) blk->link.wait.prev->link.wait.next = blk->link.wait.next;
    else h->pending = blk->link.wait.next;
    if (blk->link.wait.next) blk->link.wait.next->link.wait.prev = blk->link.wait.prev;
    else h->pending_tail = blk->link.wait.prev;
    blk->link.wait.prev = blk->link.wait.next = NULL;
}

/* The streams found busy in one pass over the pending list. Events on a
 * stream complete in the order they were recorded, and the list is in that
 * order: once one event of a stream is not finished, no later one is, and
 * it is not queried. Full, it only stops saving queries. */
#define BUSY_STREAMS 16
typedef struct busy_streams {
    int n;
    struct { vg_stream_t stream; int device; } at[BUSY_STREAMS];
} busy_streams;

static bool known_busy(const busy_streams *b, const vg_stream_use *use)
{
    for (int i = 0; i < b->n; i++)
        if (b->at[i].stream == use->stream && b->at[i].device == use->device) return true;
    return false;
}

/* A use without an event is not known to be finished until a synchronize
 * begun after the free has succeeded: not after one that failed, nor one
 * the provider skipped (VG_ERR_BUSY, during a capture). */
static bool use_finished(vg_heap *h, const vg_stream_use *use, busy_streams *busy)
{
    if (!use->has_event) return h->syncs_done > use->syncs_before;
    if (known_busy(busy, use)) return false;
    if (h->dev->ops->event_query(h->dev, use->event)) return true;
    if (busy->n < BUSY_STREAMS) {
        busy->at[busy->n].stream = use->stream;
        busy->at[busy->n].device = use->device;
        busy->n++;
    }
    return false;
}

static bool uses_finished(vg_heap *h, const vg_block *blk, busy_streams *busy)
{
    for (const vg_stream_use *use = blk->uses; use; use = use->next)
        if (!use_finished(h, use, busy)) return false;
    return true;
}

void vg__process_pending(vg_heap *h)
{
    busy_streams busy;
    busy.n = 0;
    vg_block *blk = h->pending;
    while (blk) {
        vg_block *next = blk->link.wait.next;
        if (uses_finished(h, blk, &busy)) {
            pending_remove(h, blk);
            vg__uses_recycle(h, blk);
            vg__block_make_free(h, blk);
        }
        blk = next;
    }
}

/* The wait itself, with the heap's lock released so that the heap's other
 * callers (a free, a stats read, another allocation) are not held up for
 * the device. */
static int wait_for_device(vg_heap *h, vg_device_error *error)
{
    uint64_t begun = ++h->syncs_begun;
    h->device_waiters++;
    vg_lock_release(&h->lock);
    pthread_mutex_lock(&h->device_wait);
    int rc = h->dev->ops->synchronize(h->dev);
    /* The provider's words, this thread's, copied before it next calls. */
    if (rc != VG_OK) *error = *vg_device_last_error();
    pthread_mutex_unlock(&h->device_wait);
    vg_lock_acquire(&h->lock);
    h->device_waiters--;
    if (rc == VG_OK && begun > h->syncs_done) h->syncs_done = begun;
    return rc;
}

void vg__synchronize(vg_heap *h)
{
    vg_device_error error;
    int rc = wait_for_device(h, &error);
    /* device_failed is the current allocation's: another one may have set
     * it while the lock was released; this caller's was false (the ladder
     * stops at an error before it synchronizes). */
    h->device_failed = false;
    /* Skipped (a capture underway) is no error: nothing was waited for,
     * and nothing without an event is freed on its strength. */
    if (rc != VG_OK && rc != VG_ERR_BUSY) {
        /* vg__device_error, with the words copied at the wait. */
        h->stats.num_device_errors++;
        h->device_error = error;
        h->device_failed = true;
    }
    vg__process_pending(h);
}

/* If an event cannot be recorded, waiting for the whole device is the safe
 * answer. */
void vg__defer_free(vg_heap *h, vg_block *blk)
{
    bool recorded = true;
    for (vg_stream_use *use = blk->uses; use; use = use->next) {
        int rc = h->dev->ops->event_record(h->dev, use->device, use->stream, &use->event);
        if (rc == VG_OK) use->has_event = true;
        else recorded = false;
        use->syncs_before = h->syncs_begun;
        if (rc == VG_ERR_DEVICE) vg__device_error(h);
    }
    blk->state = VG_BLOCK_PENDING;
    pending_append(h, blk);
    h->stats.num_deferred_frees++;
    if (!recorded) vg__synchronize(h);
}

/* ------------------------------------------------------------------ */
/* The public calls                                                    */
/* ------------------------------------------------------------------ */

int vg_heap_record_stream(vg_heap *h, void *ptr, vg_stream_t stream)
{
    return vg_heap_record_device_stream(h, ptr, h->dev->index, stream);
}

int vg_heap_record_device_stream(vg_heap *h, void *ptr, int device, vg_stream_t stream)
{
    if (device < 0 || device >= VG_MAX_DEVICES) return VG_ERR_ARG;
    vg_lock_acquire(&h->lock);
    int rc = VG_OK;
    vg_block *blk = vg__map_get(&h->live, (uintptr_t)ptr);
    if (!blk) {
        rc = VG_ERR_INVALID;
    } else if (device != h->dev->index || stream != blk->seg->stream->key) {
        vg_stream_use *use = blk->uses;
        while (use && (use->stream != stream || use->device != device)) use = use->next;
        if (!use) {
            use = new_use(h);
            if (!use) {
                rc = VG_ERR_NOMEM;
            } else {
                use->stream = stream;
                use->device = device;
                use->next = blk->uses;
                blk->uses = use;
                h->stats.num_record_stream++;
                VG_HISTORY(h, VG_EV_RECORD_STREAM, blk->addr, blk->size, 0, stream);
            }
        }
    }
    vg_lock_release(&h->lock);
    return rc;
}

void vg_heap_synchronize(vg_heap *h)
{
    vg_lock_acquire(&h->lock);
    vg__synchronize(h);
    vg_lock_release(&h->lock);
}

void vg_heap_wait_for_calls(vg_heap *h)
{
    vg_lock_acquire(&h->lock);
    vg_lock_release(&h->lock);
    pthread_mutex_lock(&h->device_wait);
    pthread_mutex_unlock(&h->device_wait);
}
