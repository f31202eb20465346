/* The live-address map: block address -> live block record.
 *
 * Open addressing with linear probing and backward-shift deletion (no
 * tombstones, so lookups stay short after millions of frees). Kept at most
 * half full. Addresses are multiples of VG_ALIGN and never 0, so 0 marks an
 * empty slot.
 */
#include "addr_map.h"

#include <stdlib.h>

int vg__map_init(vg_addr_map *m, size_t capacity)
{
    size_t cap = 16;
    while (cap < capacity) cap <<= 1;
    m->keys = calloc(cap, sizeof *m->keys);
    m->vals = calloc(cap, sizeof *m->vals);
    if (!m->keys || !m->vals) {
        free(m->keys);
        free(m->vals);
        m->keys = NULL;
        m->vals = NULL;
        return VG_ERR_NOMEM;
    }
    m->mask = cap - 1;
    m->count = 0;
    return VG_OK;
}

void vg__map_free(vg_addr_map *m)
{
    free(m->keys);
    free(m->vals);
    m->keys = NULL;
    m->vals = NULL;
    m->count = 0;
}

int vg__map_grow(vg_addr_map *m)
{
    vg_addr_map bigger;
    if (vg__map_init(&bigger, (m->mask + 1) * 2) != VG_OK) return VG_ERR_NOMEM;
    for (size_t i = 0; i <= m->mask; i++)
        if (m->keys[i]) vg__map_insert_fresh(&bigger, m->keys[i], m->vals[i]);
    vg__map_free(m);
    *m = bigger;
    return VG_OK;
}
