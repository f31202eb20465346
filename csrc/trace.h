/* The heap's event ring, internal side. */
#ifndef VG_TRACE_H
#define VG_TRACE_H

#include "vramguard.h"

typedef struct vg_trace vg_trace;

void vg__trace_event(vg_trace *t, uint32_t kind, uintptr_t addr, size_t size,
                     size_t requested, vg_stream_t stream);
void vg__trace_destroy(vg_trace *t);

/* One branch when not recording, stopped recordings included. */
#define VG_TRACE(h, kind, addr, size, requested, stream)                         \
    do {                                                                         \
        if ((h)->tracing) vg__trace_event((h)->trace, (kind), (addr), (size),    \
                                          (requested), (stream));                \
    } while (0)

#endif
