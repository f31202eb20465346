/* What the heap knows of an address. Which segment holds it: what
 * PyTorch's getBaseAllocation asks (the base and size of the cudaMalloc a
 * pointer lies in, for IPC and for code that registers memory with other
 * libraries). Rare, so a live block's start is looked up in the address
 * map and anything else by walking the segments. And the size of the live
 * block that starts there. */
#include "heap_internal.h"
#include "addr_map.h"

int vg_heap_segment_of(vg_heap *h, const void *ptr, uintptr_t *base, size_t *size)
{
    uintptr_t addr = (uintptr_t)ptr;
    const vg_segment *found = NULL;
    vg_lock_acquire(&h->lock);
    const vg_block *blk = vg__map_get(&h->live, addr);
    if (blk) {
        found = blk->seg;
    } else {
        for (const vg_segment *seg = h->segments; seg && !found; seg = seg->next)
            if (addr >= seg->addr && addr - seg->addr < seg->size) found = seg;
    }
    if (found) {
        *base = found->addr;
        *size = found->size;
    }
    vg_lock_release(&h->lock);
    return found ? VG_OK : VG_ERR_INVALID;
}

/* The size of the live block at `ptr`, 0 when none starts there. */
size_t vg_heap_block_size(vg_heap *h, void *ptr)
{
    vg_lock_acquire(&h->lock);
    vg_block *blk = vg__map_get(&h->live, (uintptr_t)ptr);
    size_t size = blk ? blk->size : 0;
    vg_lock_release(&h->lock);
    return size;
}
