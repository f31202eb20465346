/* Captures underway per device (include/vramguard/device.h): a count, not
 * a flag, since several begins may be active on one device at once (two
 * graphs captured on two streams, or a thread allocating to a pool while a
 * graph is captured). Read on every provider call that could break a
 * capture, so a relaxed atomic load; the registry's begin and end order
 * it with the allocations they route. */
#include "vramguard/device.h"

#include <stdatomic.h>

static atomic_int underway[VG_MAX_DEVICES];

static int in_range(int device)
{
    return device >= 0 && device < VG_MAX_DEVICES;
}

void vg_capture_enter(int device)
{
    if (in_range(device)) atomic_fetch_add(&underway[device], 1);
}

void vg_capture_leave(int device)
{
    if (in_range(device)) atomic_fetch_sub(&underway[device], 1);
}

int vg_capture_active(int device)
{
    return in_range(device) ? atomic_load_explicit(&underway[device], memory_order_acquire) : 0;
}

int vg_capture_any(void)
{
    for (int d = 0; d < VG_MAX_DEVICES; d++)
        if (atomic_load_explicit(&underway[d], memory_order_acquire)) return 1;
    return 0;
}
