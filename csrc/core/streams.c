/* What the heap keeps per stream: a record (vg_stream_state) holding the
 * maps of the classes where the stream has free blocks, found through a
 * chained hash of the stream's key, the last one asked for kept in front.
 *
 * A record lives while its stream owns a segment, or while an allocation
 * works for it (pinned: the ladder may release the stream's last segment
 * before it reserves a new one), and is freed when neither holds. A trace
 * that touches 100,000 streams once each leaves nothing behind once their
 * segments are released, and finding a stream costs the same whatever
 * their number.
 * The key and its hash are in streams.h.
 */
#include "streams.h"

#include <stdlib.h>

#define INITIAL_BITS 4

int vg__streams_init(vg_stream_table *t)
{
    t->buckets = calloc((size_t)1 << INITIAL_BITS, sizeof *t->buckets);
    if (!t->buckets) return VG_ERR_NOMEM;
    t->bits = INITIAL_BITS;
    t->count = 0;
    t->last = NULL;
    return VG_OK;
}

void vg__streams_destroy(vg_stream_table *t)
{
    for (size_t i = 0; t->buckets && i < (size_t)1 << t->bits; i++) {
        while (t->buckets[i]) {
            vg_stream_state *s = t->buckets[i];
            t->buckets[i] = s->hash_next;
            free(s);
        }
    }
    free(t->buckets);
    t->buckets = NULL;
}

/* Twice the buckets when the chains average more than one record. If the
 * host says no, the chains just grow longer. */
static void grow(vg_stream_table *t)
{
    unsigned bits = t->bits + 1;
    vg_stream_state **buckets = calloc((size_t)1 << bits, sizeof *buckets);
    if (!buckets) return;
    for (size_t i = 0; i < (size_t)1 << t->bits; i++) {
        while (t->buckets[i]) {
            vg_stream_state *s = t->buckets[i];
            t->buckets[i] = s->hash_next;
            size_t slot = vg__stream_hash(s->key, bits);
            s->hash_next = buckets[slot];
            buckets[slot] = s;
        }
    }
    free(t->buckets);
    t->buckets = buckets;
    t->bits = bits;
}

vg_stream_state *vg__stream_find(const vg_stream_table *t, vg_stream_t key)
{
    for (vg_stream_state *s = t->buckets[vg__stream_hash(key, t->bits)]; s; s = s->hash_next)
        if (vg__stream_key_equal(s->key, key)) return s;
    return NULL;
}

static vg_stream_state *find_or_add(vg_stream_table *t, vg_stream_t key)
{
    vg_stream_state *s = vg__stream_find(t, key);
    if (s) return s;
    size_t slot = vg__stream_hash(key, t->bits);
    s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->key = key;
    s->hash_next = t->buckets[slot];
    t->buckets[slot] = s;
    if (++t->count > (size_t)1 << t->bits) grow(t);
    return s;
}

void vg__stream_forget(vg_heap *h, vg_stream_state *s)
{
    vg_stream_table *t = &h->streams;
    vg_stream_state **link = &t->buckets[vg__stream_hash(s->key, t->bits)];
    while (*link != s) link = &(*link)->hash_next;
    *link = s->hash_next;
    t->count--;
    if (t->last == s) t->last = NULL;
    vg_assert_internal(s->classes[VG_POOL_SMALL].level_map == 0 &&
                       s->classes[VG_POOL_LARGE].level_map == 0);
    free(s);
}

vg_stream_state *vg__stream_pin_slow(vg_heap *h, vg_stream_t key)
{
    vg_stream_state *s = find_or_add(&h->streams, key);
    if (!s) return NULL;
    h->streams.last = s;
    s->pins++;
    return s;
}


void vg__stream_lost_segment(vg_heap *h, vg_stream_state *s)
{
    vg_assert_internal(s->segments > 0);
    if (!--s->segments && !s->pins) vg__stream_forget(h, s);
}
