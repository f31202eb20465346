/* The invariants' checks (check.c) that debug builds assert as the heap
 * runs, through vg_assert_internal (debug.h): without VG_DEBUG the
 * assertions compile to nothing and these are called only by
 * vg_heap_check. */
#ifndef VG_CHECK_H
#define VG_CHECK_H

#include "heap_internal.h"

/* check.c: parts of vg_heap_check, NULL when they hold, that debug builds
 * assert as the heap runs: the invariants around a block (for every block
 * an operation changes), of a whole segment (as segments come and go), the
 * equations between the counters (after every call), and free_blocks
 * against the bins (as segments come and go: it reads every bin). */
const char *vg__check_block(const vg_heap *h, const vg_block *blk);
const char *vg__check_segment(const vg_heap *h, const vg_segment *seg);
const char *vg__check_totals(vg_heap *h);
const char *vg__check_bin_counts(const vg_heap *h);

#endif
