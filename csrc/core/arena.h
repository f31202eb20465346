/* The arena (arena.c): ranges of address space with pages mapped as
 * blocks need them; its own ladder, its trim, and what the readers ask. */
#ifndef VG_ARENA_H
#define VG_ARENA_H

#include "heap_internal.h"
#include "ladder.h"

/* arena.c: the arena's ladder, and its cache control. */
bool vg__arena_usable(const vg_device *dev);
bool vg__arena_find_block(vg_heap *h, vg_request *r);
/* Unmap free pages, synchronizing first, until `target` bytes are unmapped
 * (SIZE_MAX = all), then release ranges wholly free and unmapped; for
 * empty_cache and a lower budget. Returns the bytes unmapped. */
size_t vg__arena_trim(vg_heap *h, size_t target, uint64_t *counter);
/* An idle range with no page mapped: give it back. */
void vg__arena_release_range(vg_heap *h, vg_segment *seg);
/* At heap destruction: unmap every page and give the range back. */
void vg__arena_destroy_range(vg_heap *h, vg_segment *seg);
/* Free memory as it can serve requests without a map: the mapped pieces
 * of free blocks (their count and the longest), and the largest free block
 * mapped or not (arena.c). */
void vg__arena_free_pieces(const vg_heap *h, uint64_t *pieces, uint64_t *mapped_stretch,
                           uint64_t *range);
/* The mapped bytes of whole pages inside free blocks: what unmapping every
 * free page (the ladder's last step) gives back. */
uint64_t vg__arena_releasable(const vg_heap *h);
/* Whether every page [addr, addr+size) touches is mapped (check.c). */
bool vg__arena_pages_mapped(const vg_heap *h, const vg_segment *seg, uintptr_t addr, size_t size);
size_t vg__arena_count_mapped(const vg_heap *h, const vg_segment *seg);

#endif
