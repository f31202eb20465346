/* The work the library stand-ins were asked to do: the floating-point
 * operations of every GEMM that cuBLAS and cuBLASLt received, from the
 * call's shapes. A phantom computes nothing, but the shapes are the real
 * program's: a dry run compares the work of a step under one setting with
 * another (activation checkpointing recomputes the forward's GEMMs) from
 * these counts, which cover eager and compiled programs alike, since both
 * reach the same library calls.
 *
 * Lock-free: two relaxed atomic adds per call, from any thread. */
#include <stdint.h>

#include "core.h"
#include "fakecuda.h"

static unsigned long long gemm_flops;
static long gemm_calls;

void vgfc_count_gemm(uint64_t m, uint64_t n, uint64_t k, uint64_t batches, int complex_type)
{
    /* one multiply and one add per (i, j, l); a complex one is four real
     * multiplies and four adds */
    unsigned long long flops = 2ULL * m * n * k * batches * (complex_type ? 4ULL : 1ULL);
    __atomic_add_fetch(&gemm_flops, flops, __ATOMIC_RELAXED);
    __atomic_add_fetch(&gemm_calls, 1, __ATOMIC_RELAXED);
}

long long vg_fakecuda_gemm_flops(void)
{
    unsigned long long v = __atomic_load_n(&gemm_flops, __ATOMIC_RELAXED);
    return v > (unsigned long long)INT64_MAX ? INT64_MAX : (long long)v;
}

long vg_fakecuda_gemm_calls(void)
{
    return __atomic_load_n(&gemm_calls, __ATOMIC_RELAXED);
}

void vgfc_work_reset(void)
{
    __atomic_store_n(&gemm_flops, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&gemm_calls, 0, __ATOMIC_RELAXED);
}
