/* vramguard: the report of a failed allocation: what it saw, and the
 * message built from it (oom_message.c). An allocation fails for one of
 * two reasons, never confused: out of memory (the device or the budget
 * said no, after the cache was released), or a device error (any other
 * failure of the runtime, reported as itself, with nothing released). */
#ifndef VRAMGUARD_OOM_H
#define VRAMGUARD_OOM_H

#include "vramguard/common.h"
#include "vramguard/device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Everything a message needs, taken at the moment of failure. */
typedef struct vg_oom_info {
    /* VG_ERR_NOMEM, or VG_ERR_DEVICE (then `device_error` says what
     * failed, and the device's free/total memory are not asked for). */
    int status;
    size_t requested;
    size_t rounded;
    size_t budget;             /* 0 when none */
    size_t device_total;
    size_t device_free;
    size_t allocated;
    size_t reserved;
    size_t largest_free_block;
    size_t free_blocks;
    size_t free_bytes;         /* reserved - active bytes (a pending block is not free) */
    /* The largest request that could be allocated right after the failure,
     * within the budget and the device's free memory (vg_fragmentation's
     * largest_allocatable, capped by device_free): what the message reports. */
    size_t largest_allocatable;
    int device;
    int budget_refused;        /* the budget, not the device, said no */
    /* The arena, where it runs: reserved is mapped memory, in `ranges`
     * ranges; largest_free_block is the largest free mapped stretch, and
     * largest_free_range the largest free stretch of address space (kept
     * for programs that read it; the message does not show it);
     * unmapped_bytes, what the heap has unmapped so far. */
    int arena;
    size_t ranges;
    size_t largest_free_range;
    uint64_t unmapped_bytes;
    vg_device_error device_error;
    /* The device's CUDA-graph private pools, which share its budget
     * (filled by the registry after the failure; zero without pools).
     * `allocated` and `reserved` above stay the device heap's own, the pools
     * apart. `in_private_pool`: the request was a capture's and failed in
     * its pool, so free_bytes, free_blocks and largest_free_block are that
     * pool's. */
    size_t pools;              /* private pools holding memory */
    size_t pools_reserved;     /* what they hold (kept for the graphs' replays) */
    size_t pools_allocated;    /* of it, live blocks */
    int in_private_pool;
} vg_oom_info;

/* "512 bytes", "1.50 KiB", "20.00 MiB", "14.75 GiB", as PyTorch writes them. */
void vg_format_size(uint64_t bytes, char *buf, size_t n);
/* PyTorch's OOM wording ("<device_kind> out of memory. Tried to allocate
 * ..."), then a line naming the most likely cause. Returns the length. */
size_t vg_format_oom(const vg_oom_info *oom, const char *device_kind, char *buf, size_t n);
/* For status VG_ERR_DEVICE: PyTorch's wording for a failed runtime call
 * ("<device_kind> error: <the runtime's description>"), then a line naming
 * the call, the runtime's error name, and that nothing was retried. It
 * never says "out of memory", so OOM detectors do not mistake it. */
size_t vg_format_device_error(const vg_oom_info *info, const char *device_kind, char *buf,
                              size_t n);

#ifdef __cplusplus
}
#endif
#endif
