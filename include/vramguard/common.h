/* vramguard: what every layer shares: status codes, handles, and the
 * sizes the allocator is built around (each defined once, here). */
#ifndef VRAMGUARD_COMMON_H
#define VRAMGUARD_COMMON_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef uintptr_t vg_stream_t; /* opaque stream handle (cudaStream_t), 0 = default */
typedef uintptr_t vg_event_t;  /* opaque event handle owned by a provider */

enum vg_status {
    VG_OK = 0,
    VG_ERR_INVALID = 1,      /* pointer unknown to the heap, or already freed */
    VG_ERR_NOMEM = 2,        /* the device (or the host, for metadata) said no */
    VG_ERR_ARG = 3,          /* an argument out of range */
    VG_ERR_DEVICE = 4,       /* the provider failed for another reason */
    VG_ERR_BUSY = 5,         /* the heap is doing it already (a recording runs) */
};

/* The rule every fraction setting (a budget as a share of the device, the
 * gc threshold) follows, in the core and in Python: a number in [0, 1],
 * 0 meaning off. Written so that NaN fails it. */
static inline int vg_valid_fraction(double x)
{
    return x >= 0.0 && x <= 1.0;
}

/* Allocation granularity: every block size is a multiple of this (512). */
#define VG_ALIGN_SHIFT 9
#define VG_ALIGN ((size_t)1 << VG_ALIGN_SHIFT)
/* Requests up to this size come from the small pool (1 MiB). */
#define VG_SMALL_REQUEST ((size_t)1 << 20)
/* Providers hand out memory in multiples of this (2 MiB, cudaMalloc's page). */
#define VG_SEGMENT_GRANULE ((size_t)2 << 20)
/* Segment size of the small pool: one granule. */
#define VG_SMALL_SEGMENT VG_SEGMENT_GRANULE
/* Largest request a heap will consider; anything above is an OOM. */
#define VG_MAX_REQUEST_SHIFT 47
#define VG_MAX_REQUEST ((size_t)1 << VG_MAX_REQUEST_SHIFT)

enum vg_pool { VG_POOL_SMALL = 0, VG_POOL_LARGE = 1, VG_POOL_COUNT = 2 };

#ifdef __cplusplus
}
#endif
#endif
