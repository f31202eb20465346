/* The live-address map, the hot half: lookups, inserts and deletes run on
 * every allocation and free, so they are inline. addr_map.c has the rest
 * (creating, freeing, growing). */
#ifndef VG_ADDR_MAP_H
#define VG_ADDR_MAP_H

#include "heap_internal.h"

/* addr_map.c: the cold half. */
int vg__map_init(vg_addr_map *m, size_t capacity);
void vg__map_free(vg_addr_map *m);
/* Double the capacity; VG_ERR_NOMEM if the host says no. */
int vg__map_grow(vg_addr_map *m);

static inline size_t vg__map_slot(const vg_addr_map *m, uintptr_t key)
{
    /* Fibonacci hashing of the address without its always-zero low bits. */
    return (size_t)(((uint64_t)key >> 9) * 0x9E3779B97F4A7C15ull >> 17) & m->mask;
}

static inline void vg__map_insert_fresh(vg_addr_map *m, uintptr_t key, vg_block *val)
{
    size_t i = vg__map_slot(m, key);
    while (m->keys[i]) i = (i + 1) & m->mask;
    m->keys[i] = key;
    m->vals[i] = val;
    m->count++;
}

static inline int vg__map_put(vg_addr_map *m, uintptr_t key, vg_block *val)
{
    if ((m->count + 1) * 2 > m->mask + 1 && vg__map_grow(m) != VG_OK) return VG_ERR_NOMEM;
    vg__map_insert_fresh(m, key, val);
    return VG_OK;
}

static inline vg_block *vg__map_get(const vg_addr_map *m, uintptr_t key)
{
    for (size_t i = vg__map_slot(m, key); m->keys[i]; i = (i + 1) & m->mask)
        if (m->keys[i] == key) return m->vals[i];
    return NULL;
}

static inline vg_block *vg__map_take(vg_addr_map *m, uintptr_t key)
{
    size_t i = vg__map_slot(m, key);
    while (m->keys[i] && m->keys[i] != key) i = (i + 1) & m->mask;
    if (!m->keys[i]) return NULL;
    vg_block *val = m->vals[i];
    /* Backward shift: pull later entries of the probe run into the hole
     * unless their home slot lies cyclically after the hole. */
    size_t hole = i;
    for (size_t j = (i + 1) & m->mask; m->keys[j]; j = (j + 1) & m->mask) {
        size_t home = vg__map_slot(m, m->keys[j]);
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

#endif
