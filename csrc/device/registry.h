/* Internal to the registry (device/heaps.c, device/pools.c). Not installed. */
#ifndef VG_DEVICE_REGISTRY_H
#define VG_DEVICE_REGISTRY_H

#include "vramguard/devices.h"

/* heaps.c: a new provider for `device`, simulated or CUDA as the settings
 * say (read under the registry's mutex, which this takes: never call it
 * with that mutex held); NULL with the reason in vg_devices_error(). A
 * simulated one hands out addresses from `sim_base` (0: the simulator's
 * default), so that the heaps of one device never share an address. */
vg_device *vg__devices_provider(int device, uintptr_t sim_base);
/* Set what vg_devices_error() says. */
void vg__devices_set_error(const char *message);

/* pools.c, for the registry's own calls. Each returns VG_ERR_INVALID when
 * no pool's heap holds `ptr`. */
/* Routes an allocation when a begin on `device` accepts `stream`: returns
 * 1 with *rc as vg_devices_alloc's, or 0 when no pool wants it. */
int vg__pools_alloc(size_t size, int device, vg_stream_t stream, void **out, vg_oom_info *oom,
                    int *rc);
int vg__pools_free(void *ptr);
int vg__pools_record_stream(void *ptr, int stream_device, vg_stream_t stream);
int vg__pools_segment_of(const void *ptr, uintptr_t *base, size_t *size);
/* Empties the released pools; returns the bytes released. */
size_t vg__pools_empty_cache(void);
/* What the pools of `device` reserve (ctx: the device, as an intptr_t):
 * the device heap's share of its budget (vg_heap_share_budget). Reads an
 * atomic, takes no lock. */
size_t vg__pools_reserved_on(void *device);
/* Fills the pools' part of an out-of-memory report of `device`'s heap.
 * Takes the pools' mutex: never call it with a heap lock held. */
void vg__pools_explain(int device, vg_oom_info *oom);

#endif
