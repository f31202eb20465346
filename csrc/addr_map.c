/* The live-address map: block address -> live block record.
 *
 * Open addressing with linear probing and backward-shift deletion (no
 * tombstones, so lookups stay short after millions of frees). Kept at most
 * half full. Addresses are multiples of VG_ALIGN and never 0, so 0 marks an
 * empty slot.
 */
#include "heap_internal.h"

#include <stdlib.h>

static inline size_t slot_of(const vg_addr_map *m, uintptr_t key)
{
    /* Fibonacci hashing of the address without its always-zero low bits. */
    return (size_t)(((uint64_t)key >> 9) * 0x9E3779B97F4A7C15ull >> 17) & m->mask;
}

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

static void insert_fresh(vg_addr_map *m, uintptr_t key, vg_block *val)
{
    size_t i = slot_of(m, key);
    while (m->keys[i]) i = (i + 1) & m->mask;
    m->keys[i] = key;
    m->vals[i] = val;
    m->count++;
}

static int grow(vg_addr_map *m)
{
    vg_addr_map bigger;
    if (vg__map_init(&bigger, (m->mask + 1) * 2) != VG_OK) return VG_ERR_NOMEM;
    for (size_t i = 0; i <= m->mask; i++)
        if (m->keys[i]) insert_fresh(&bigger, m->keys[i], m->vals[i]);
    vg__map_free(m);
    *m = bigger;
    return VG_OK;
}

int vg__map_put(vg_addr_map *m, uintptr_t key, vg_block *val)
{
    if ((m->count + 1) * 2 > m->mask + 1 && grow(m) != VG_OK) return VG_ERR_NOMEM;
    insert_fresh(m, key, val);
    return VG_OK;
}

vg_block *vg__map_get(const vg_addr_map *m, uintptr_t key)
{
    for (size_t i = slot_of(m, key); m->keys[i]; i = (i + 1) & m->mask)
        if (m->keys[i] == key) return m->vals[i];
    return NULL;
}

vg_block *vg__map_take(vg_addr_map *m, uintptr_t key)
{
    size_t i = slot_of(m, key);
    while (m->keys[i] && m->keys[i] != key) i = (i + 1) & m->mask;
    if (!m->keys[i]) return NULL;
    vg_block *val = m->vals[i];
    /* Backward shift: pull later entries of the probe run into the hole
     * unless their home slot lies cyclically after the hole. */
    size_t hole = i;
    for (size_t j = (i + 1) & m->mask; m->keys[j]; j = (j + 1) & m->mask) {
        size_t home = slot_of(m, m->keys[j]);
        bool stays = hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
        if (stays) continue;
        m->keys[hole] = m->keys[j];
        m->vals[hole] = m->vals[j];
        hole = j;
    }
    m->keys[hole] = 0;
    m->vals[hole] = NULL;
    m->count--;
    return val;
}
