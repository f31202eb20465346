/* The recording's side of the heap's paths: what they call to note an
 * event in the ring (history.c), and the allocation's stack id. Both cost
 * one branch when nothing is being recorded. */
#ifndef VG_RECORDING_H
#define VG_RECORDING_H

#include "heap_internal.h"

#include <stdatomic.h>

/* history.c: the recording ring. */
void vg__history_note(vg_history *r, uint32_t kind, uintptr_t addr, size_t size,
                      size_t requested, vg_stream_t stream, uint32_t stack);
void vg__history_destroy(vg_history *r);

/* One branch when not recording, stopped recordings included. */
#define VG_HISTORY(h, kind, addr, size, requested, stream)                       \
    do {                                                                         \
        if ((h)->recording) vg__history_note((h)->history, (kind), (addr), (size), \
                                             (requested), (stream), 0);          \
    } while (0)

/* The allocation's stack id, asked before the heap's lock is taken (the
 * source may look at the caller's Python frames): one relaxed load and a
 * branch when the recording keeps no stacks. */
static inline uint32_t vg__history_stack(vg_heap *h)
{
    vg_stack_source source = atomic_load_explicit(&h->stack_source, memory_order_relaxed);
    return source ? source() : 0;
}

#endif
