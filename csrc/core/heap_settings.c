/* The heap's settings and what it was made with. A setting's calls take
 * the lock around its one field, so that a change made by one thread is
 * seen whole by the next call of any other; what was fixed at creation
 * (the device, the policy, the arena) is read without it. The budget's
 * calls are budget.c's (a lower budget releases memory); empty_cache is
 * segments.c's. */
#include "heap_internal.h"

void vg_heap_set_keep_segments(vg_heap *h, int keep)
{
    vg_lock_acquire(&h->lock);
    h->keep_segments = keep != 0;
    vg_lock_release(&h->lock);
}

int vg_heap_set_gc_threshold(vg_heap *h, double fraction)
{
    if (!vg_valid_fraction(fraction)) return VG_ERR_ARG;
    vg_lock_acquire(&h->lock);
    h->gc_threshold = fraction;
    vg_lock_release(&h->lock);
    return VG_OK;
}

double vg_heap_gc_threshold(vg_heap *h)
{
    vg_lock_acquire(&h->lock);
    double fraction = h->gc_threshold;
    vg_lock_release(&h->lock);
    return fraction;
}

size_t vg_heap_device_total(vg_heap *h)
{
    vg_lock_acquire(&h->lock);
    size_t total = h->device_total;
    vg_lock_release(&h->lock);
    return total;
}

vg_device *vg_heap_device(const vg_heap *h)
{
    return h->dev;
}

const char *vg_heap_policy_name(const vg_heap *h)
{
    return h->policy->name;
}

int vg_heap_uses_arena(const vg_heap *h)
{
    return h->arena;
}
