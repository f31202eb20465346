/* The budget's arithmetic (budget.c): what may still be reserved, asked
 * wherever memory would grow (the ladders, the policies' sizes). */
#ifndef VG_BUDGET_H
#define VG_BUDGET_H

#include "heap_internal.h"

/* Can `bytes` more be reserved without passing the budget? What the
 * heaps sharing it reserve counts too:
 *   reserved + reserved_elsewhere + bytes <= budget */
bool vg__within_budget(const vg_heap *h, size_t bytes);
size_t vg__reserved(const vg_heap *h);
/* What this heap's reserved memory may not pass: the budget, or else the
 * device, less what the heaps sharing it reserve (0 when they hold it all). */
size_t vg__ceiling(const vg_heap *h);

#endif
