/* Segments (segments.c): reserved from the provider, adopted as one free
 * block, released whole. The ladders build on these; the blocks inside a
 * segment are blocks.h's. */
#ifndef VG_SEGMENTS_H
#define VG_SEGMENTS_H

#include "heap_internal.h"

/* A segment of `size` bytes from the provider for stream `s`, counted;
 * NULL when the provider or the host says no (a device error is recorded
 * with vg__device_error). */
vg_segment *vg__segment_create(vg_heap *h, vg_stream_state *s, int pool, size_t size);
/* Give an idle segment back to the provider (a range: to the arena). */
void vg__segment_release(vg_heap *h, vg_segment *seg);
/* A segment record for [addr, addr+size) of stream `s`, one free block,
 * idle, in the heap's lists (no stats); NULL when the host says no. */
vg_segment *vg__segment_adopt(vg_heap *h, vg_stream_state *s, int pool, uintptr_t addr,
                              size_t size);
/* Take an idle segment out of the heap's books (no provider call, no
 * stats) and free its record. */
void vg__segment_forget(vg_heap *h, vg_segment *seg);
/* Release wholly free segments, oldest first, until `target` bytes are
 * released (SIZE_MAX = all); only those of `only` when it is not NULL.
 * Returns the bytes released. */
size_t vg__release_idle(vg_heap *h, const vg_stream_state *only, size_t target,
                        uint64_t *counter);
/* A size rounded up to the segment granule (the policies' sizes). */
size_t vg__round_to_granule(size_t bytes);

#endif
