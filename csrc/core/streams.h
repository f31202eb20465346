/* Stream records, the hot half: the key, and pinning the stream of an
 * allocation, inline because every allocation does it. streams.c has the
 * table. */
#ifndef VG_STREAMS_H
#define VG_STREAMS_H

#include "heap_internal.h"

/* The key is the stream handle, because a heap serves one device. Were a
 * heap to serve streams of several devices, the key would become (device,
 * handle) here, and nowhere else. */
static inline size_t vg__stream_hash(vg_stream_t key, unsigned bits)
{
    /* Fibonacci hashing: handles are pointers or small integers. */
    return (size_t)(((uint64_t)key * 0x9E3779B97F4A7C15ull) >> (64 - bits));
}

static inline bool vg__stream_key_equal(vg_stream_t a, vg_stream_t b)
{
    return a == b;
}

/* streams.c: the table. */
int vg__streams_init(vg_stream_table *t);
void vg__streams_destroy(vg_stream_table *t);
/* A segment of `s` was released: forget `s` if that was its last. */
void vg__stream_lost_segment(vg_heap *h, vg_stream_state *s);
/* The record of `key`, NULL if there is none. */
vg_stream_state *vg__stream_find(const vg_stream_table *t, vg_stream_t key);
vg_stream_state *vg__stream_pin_slow(vg_heap *h, vg_stream_t key);
void vg__stream_forget(vg_heap *h, vg_stream_state *s);

/* The stream's record, created if need be, pinned until vg__stream_unpin
 * (the ladder may release its last segment before it reserves another):
 * NULL when the host is out of memory. */
static inline vg_stream_state *vg__stream_pin(vg_heap *h, vg_stream_t key)
{
    vg_stream_state *s = h->streams.last;
    if (!s || !vg__stream_key_equal(s->key, key)) return vg__stream_pin_slow(h, key);
    s->pins++;
    return s;
}

/* Forget the record if its stream owns no segment. */
static inline void vg__stream_unpin(vg_heap *h, vg_stream_state *s)
{
    if (!--s->pins && !s->segments) vg__stream_forget(h, s);
}

#endif
