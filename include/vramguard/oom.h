/* vramguard: the out-of-memory report: what a failed allocation saw, and
 * the message built from it (oom_message.c). */
#ifndef VRAMGUARD_OOM_H
#define VRAMGUARD_OOM_H

#include "vramguard/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Everything an OOM message needs, taken at the moment of failure. */
typedef struct vg_oom_info {
    size_t requested;
    size_t rounded;
    size_t budget;             /* 0 when none */
    size_t device_total;
    size_t device_free;
    size_t allocated;
    size_t reserved;
    size_t largest_free_block;
    size_t free_blocks;
    size_t free_bytes;         /* reserved - allocated */
    int device;
    int budget_refused;        /* the budget, not the device, said no */
} vg_oom_info;

/* "512 bytes", "1.50 KiB", "20.00 MiB", "14.75 GiB", as PyTorch writes them. */
void vg_format_size(uint64_t bytes, char *buf, size_t n);
/* PyTorch's OOM wording ("<device_kind> out of memory. Tried to allocate
 * ..."), then a line naming the most likely cause. Returns the length. */
size_t vg_format_oom(const vg_oom_info *oom, const char *device_kind, char *buf, size_t n);

#ifdef __cplusplus
}
#endif
#endif
