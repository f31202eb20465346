/* Block bookkeeping, the cold half: the slabs that block and stream-use
 * records are cut from. blocks.h has the hot half (records from the free
 * list, split, coalesce), inline. */
#include "blocks.h"

#include <stdlib.h>

void *vg__slab_new(vg_heap *h, size_t item_size)
{
    size_t header = (sizeof(vg_slab) + 15) & ~(size_t)15;
    vg_slab *slab = malloc(header + item_size * VG_BLOCK_SLAB);
    if (!slab) return NULL;
    slab->next = h->slabs;
    h->slabs = slab;
    return (char *)slab + header;
}

void vg__slabs_free(vg_heap *h)
{
    while (h->slabs) {
        vg_slab *slab = h->slabs;
        h->slabs = slab->next;
        free(slab);
    }
}

bool vg__block_record_refill(vg_heap *h)
{
    vg_block *items = vg__slab_new(h, sizeof(vg_block));
    if (!items) return false;
    for (size_t i = 0; i < VG_BLOCK_SLAB; i++) {
        items[i].link.spare_next = h->spare_blocks;
        h->spare_blocks = &items[i];
    }
    return true;
}
