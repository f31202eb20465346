/* The event ring: a fixed array written round and round, so recording costs
 * no allocation per event. When full, the oldest event is overwritten and
 * counted, so a reader knows the trace is incomplete. */
#include "recording.h"
#include "vramguard/history.h"

#include <stdlib.h>
#include <time.h>

struct vg_history {
    vg_history_event *ring;
    size_t capacity;
    size_t start;     /* index of the oldest event */
    size_t count;
    uint64_t dropped;
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void vg__history_note(vg_history *t, uint32_t kind, uintptr_t addr, size_t size,
                     size_t requested, vg_stream_t stream, uint32_t stack)
{
    size_t slot;
    if (t->count < t->capacity) {
        slot = (t->start + t->count++) % t->capacity;
    } else {
        slot = t->start;
        t->start = (t->start + 1) % t->capacity;
        t->dropped++;
    }
    vg_history_event *ev = &t->ring[slot];
    ev->time_ns = now_ns();
    ev->addr = addr;
    ev->size = size;
    ev->requested = requested;
    ev->stream = stream;
    ev->kind = kind;
    ev->stack = stack;
}

void vg__history_destroy(vg_history *t)
{
    if (!t) return;
    free(t->ring);
    free(t);
}

/* Whether a ring still holds events a reader has not taken (its dropped
 * count is told by every take, so it is never left untold). */
static bool untaken(const vg_history *t)
{
    return t && t->count;
}

int vg_heap_history_start(vg_heap *h, size_t capacity)
{
    return vg_heap_history_start_stacks(h, capacity, NULL);
}

int vg_heap_history_start_stacks(vg_heap *h, size_t capacity, vg_stack_source source)
{
    if (capacity == 0 || capacity > ((size_t)1 << 32)) return VG_ERR_ARG;
    vg_history *t = calloc(1, sizeof *t);
    if (!t) return VG_ERR_NOMEM;
    t->ring = calloc(capacity, sizeof *t->ring);
    if (!t->ring) {
        free(t);
        return VG_ERR_NOMEM;
    }
    t->capacity = capacity;
    /* One ring, one reader: a second start would throw away what the first
     * recording has not taken yet, so it is refused instead. */
    vg_lock_acquire(&h->lock);
    vg_history *old = h->history;
    bool busy = h->recording || untaken(old);
    if (!busy) {
        h->history = t;
        h->recording = true;
        atomic_store_explicit(&h->stack_source, source, memory_order_relaxed);
    }
    vg_lock_release(&h->lock);
    vg__history_destroy(busy ? t : old);
    return busy ? VG_ERR_BUSY : VG_OK;
}

void vg_heap_history_stop(vg_heap *h)
{
    vg_lock_acquire(&h->lock);
    h->recording = false;
    atomic_store_explicit(&h->stack_source, NULL, memory_order_relaxed);
    vg_lock_release(&h->lock);
}

int vg_heap_history_active(vg_heap *h)
{
    vg_lock_acquire(&h->lock);
    int active = h->recording;
    vg_lock_release(&h->lock);
    return active;
}

size_t vg_heap_history_take(vg_heap *h, vg_history_event *out, size_t max, uint64_t *dropped)
{
    vg_lock_acquire(&h->lock);
    vg_history *t = h->history;
    size_t n = 0;
    if (t) {
        for (; n < max && t->count; n++) {
            out[n] = t->ring[t->start];
            t->start = (t->start + 1) % t->capacity;
            t->count--;
        }
    }
    if (dropped) *dropped = t ? t->dropped : 0;
    vg_lock_release(&h->lock);
    return n;
}
