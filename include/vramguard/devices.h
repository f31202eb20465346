/* vramguard: the per-device heap registry (device/heaps.c): one heap per
 * CUDA device, shared by the torch entry points and Python. */
#ifndef VRAMGUARD_DEVICES_H
#define VRAMGUARD_DEVICES_H

#include "vramguard/heap.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The heap of `device`, created on first use; NULL (see vg_devices_error)
 * when the device cannot be used. */
vg_heap *vg_devices_heap(int device);
/* The heap of `device` if it exists; never creates one. */
vg_heap *vg_devices_existing(int device);
/* Why the last heap could not be created. */
const char *vg_devices_error(void);

/* Budget in bytes, or as a fraction of each device's total (which wins when
 * positive); 0 for none. Applies to existing heaps and to those to come.
 * VG_ERR_ARG unless both fractions are vg_valid_fraction (NaN is not). */
int vg_devices_configure(size_t budget, double budget_fraction, double gc_threshold);
int vg_devices_set_budget(int device, size_t budget, double budget_fraction);
/* Tests: every device is simulated with this capacity. Only before any
 * device heap exists (VG_ERR_ARG after). */
int vg_devices_simulate(size_t capacity);
int vg_devices_simulated(void);

/* The entry points' work. Size 0 gives NULL and VG_OK, as PyTorch's own
 * allocator does. A failure of the heap fills `oom` and returns its status:
 * VG_ERR_NOMEM (an out-of-memory) or VG_ERR_DEVICE (a device error, said
 * in oom->device_error). VG_ERR_DEVICE with oom->status VG_OK means the
 * device has no heap (vg_devices_error says why). */
int vg_devices_alloc(size_t size, int device, vg_stream_t stream, void **out, vg_oom_info *oom);
/* Never fails: a pointer no heap knows is counted and reported once. */
void vg_devices_free(void *ptr, int device);
/* The block at `ptr`, on whichever device heap holds it, is also used by
 * `stream` of device `stream_device` (-1: of the block's own device).
 * VG_ERR_INVALID when no heap holds it. */
int vg_devices_record_stream(void *ptr, int stream_device, vg_stream_t stream);

#ifdef __cplusplus
}
#endif
#endif
