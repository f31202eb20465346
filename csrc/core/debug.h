/* Internal assertions, as mimalloc's mi_assert_internal: with VG_DEBUG
 * defined (the C tests and the sanitizer builds) each one is checked and a
 * failure aborts with the expression and where it failed; otherwise (the
 * benchmark, the Python extension, NDEBUG) it compiles to nothing, and its
 * expression is not evaluated. */
#ifndef VG_DEBUG_H
#define VG_DEBUG_H

#if defined(VG_DEBUG) && !defined(NDEBUG)
#define VG_DEBUG_CHECKS 1
#define vg_assert_internal(expr) \
    ((expr) ? (void)0 : vg__assert_fail(#expr, __FILE__, __LINE__, __func__))
#else
#define VG_DEBUG_CHECKS 0
#define vg_assert_internal(expr) ((void)0)
#endif

/* check.c: print where and abort. */
_Noreturn void vg__assert_fail(const char *expr, const char *file, int line, const char *func);

/* Debug builds count the nodes the bin trees visit (descents and in-order
 * steps), per thread, so that tests can bound the work of best fit by
 * counting rather than timing. */
#if VG_DEBUG_CHECKS
#include <stdint.h>
extern _Thread_local uint64_t vg__debug_tree_steps;
#define VG_DEBUG_TREE_STEP() (vg__debug_tree_steps++)
#else
#define VG_DEBUG_TREE_STEP() ((void)0)
#endif

#endif
