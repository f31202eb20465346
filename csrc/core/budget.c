/* The budget: the bytes a heap may reserve, shared with the heaps that
 * share its device (a device's heap and its CUDA-graph pools), and the
 * arithmetic every step that would grow reserved memory asks first
 * (vg__within_budget, vg__ceiling). Setting a lower budget releases what
 * is cached above it. */
#include "budget.h"
#include "arena.h"
#include "segments.h"

size_t vg__reserved(const vg_heap *h)
{
    return (size_t)h->stats.reserved_bytes[VG_STAT_ALL].current;
}

static size_t reserved_elsewhere(const vg_heap *h)
{
    return h->reserved_elsewhere ? h->reserved_elsewhere(h->reserved_elsewhere_ctx) : 0;
}

size_t vg__ceiling(const vg_heap *h)
{
    size_t limit = h->budget ? h->budget : h->device_total;
    size_t others = reserved_elsewhere(h);
    return others < limit ? limit - others : 0;
}

bool vg__within_budget(const vg_heap *h, size_t bytes)
{
    if (!h->budget) return true;
    size_t reserved = vg__reserved(h) + reserved_elsewhere(h);
    return bytes <= h->budget && reserved <= h->budget - bytes;
}

int vg_heap_set_budget(vg_heap *h, size_t budget)
{
    vg_lock_acquire(&h->lock);
    h->budget = budget;
    size_t reserved = vg__reserved(h), limit = vg__ceiling(h);
    if (budget && reserved > limit) {
        if (h->arena) vg__arena_trim(h, reserved - limit, &h->stats.num_budget_releases);
        else vg__release_idle(h, NULL, reserved - limit, &h->stats.num_budget_releases);
    }
    vg_lock_release(&h->lock);
    return VG_OK;
}

void vg_heap_share_budget(vg_heap *h, size_t (*reserved_elsewhere_fn)(void *ctx), void *ctx)
{
    vg_lock_acquire(&h->lock);
    h->reserved_elsewhere = reserved_elsewhere_fn;
    h->reserved_elsewhere_ctx = ctx;
    vg_lock_release(&h->lock);
}

size_t vg_heap_budget(vg_heap *h)
{
    vg_lock_acquire(&h->lock);
    size_t budget = h->budget;
    vg_lock_release(&h->lock);
    return budget;
}
