/* cuBLAS stand-in: the computing calls PyTorch makes (GEMMs, the rest of
 * BLAS levels 1-3 that libtorch_cuda and libtorch_cuda_linalg import, the
 * batched LU/QR/least-squares helpers). Each checks its arguments the way
 * cuBLAS does (a live handle, known operations, non-negative sizes, leading
 * dimensions that fit) and computes nothing: numerics are not the fake's
 * concern, only that the call succeeds where it would on a GPU.
 *
 * Results that cuBLAS writes to host memory (a dot product, a norm, an index
 * in CUBLAS_POINTER_MODE_HOST, the info of the batched solvers) are zeros.
 * In device pointer mode they stay as they are, as everything the kernels
 * would have written does.
 *
 * Functions come in families with one shape per element type, so each family
 * is one macro; the compiler checks every expansion against the prototype in
 * the wheel's cublas_api.h.
 */
#include <string.h>

#include "cublas_fake.h"

/* The entry points take every argument of the real prototype and use few. */
#pragma GCC diagnostic ignored "-Wunused-parameter"

static int max1(int x)
{
    return x > 1 ? x : 1;
}

static int op_ok(cublasOperation_t op)
{
    return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C;
}

static int uplo_ok(cublasFillMode_t uplo)
{
    return uplo == CUBLAS_FILL_MODE_LOWER || uplo == CUBLAS_FILL_MODE_UPPER;
}

static int side_ok(cublasSideMode_t side)
{
    return side == CUBLAS_SIDE_LEFT || side == CUBLAS_SIDE_RIGHT;
}

static int diag_ok(cublasDiagType_t diag)
{
    return diag == CUBLAS_DIAG_NON_UNIT || diag == CUBLAS_DIAG_UNIT;
}

/* Every call ends here: a dead handle first, then bad arguments; an empty
 * problem launches nothing; anything else "launches" (vgcb_launch: fails
 * only under the fake device's sticky error). */
static cublasStatus_t run_(const char *fn, cublasHandle_t h, int args_ok, int empty)
{
    vgcb_trace(fn);
    cublasStatus_t st = vgcb_check_handle(h);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    if (!args_ok)
        return CUBLAS_STATUS_INVALID_VALUE;
    return empty ? CUBLAS_STATUS_SUCCESS : vgcb_launch();
}

/* The same for a call with a result: zeros where the host reads it. */
static cublasStatus_t run_result_(const char *fn, cublasHandle_t h, int args_ok, int empty,
                                  void *result, size_t size)
{
    vgcb_trace(fn);
    cublasStatus_t st = vgcb_check_handle(h);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    if (!args_ok || !result)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (h->pointer_mode == CUBLAS_POINTER_MODE_HOST)
        memset(result, 0, size);
    return empty ? CUBLAS_STATUS_SUCCESS : vgcb_launch();
}

/* C = alpha op(A) op(B) + beta C, op(A) m x k, op(B) k x n. */
static cublasStatus_t gemm_(const char *fn, cublasHandle_t h, cublasOperation_t ta,
                            cublasOperation_t tb, int m, int n, int k, int lda, int ldb, int ldc,
                            int batches, int complex_type)
{
    int ok = op_ok(ta) && op_ok(tb) && m >= 0 && n >= 0 && k >= 0 && batches >= 0 &&
             lda >= max1(ta == CUBLAS_OP_N ? m : k) && ldb >= max1(tb == CUBLAS_OP_N ? k : n) &&
             ldc >= max1(m);
    int empty = m == 0 || n == 0 || batches == 0;
    cublasStatus_t st = run_(fn, h, ok, empty);
    if (st == CUBLAS_STATUS_SUCCESS && ok && !empty) /* what launched: its work */
        vgfc_count_gemm((uint64_t)m, (uint64_t)n, (uint64_t)k, (uint64_t)batches, complex_type);
    return st;
}

/* Each entry point passes its name down, for the trace. */
#define run(...) run_(__func__, __VA_ARGS__)
#define run_result(...) run_result_(__func__, __VA_ARGS__)
#define gemm(...) gemm_(__func__, __VA_ARGS__)

/* ---- level 3: GEMM and its batched forms ------------------------------- */

#include "cublas_half.h"

#define GEMM(name, T, CPLX)                                                              \
    cublasStatus_t name(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,    \
                        int m, int n, int k, const T *alpha, const T *A, int lda,        \
                        const T *B, int ldb, const T *beta, T *C, int ldc)               \
    {                                                                                    \
        return gemm(h, ta, tb, m, n, k, lda, ldb, ldc, 1, CPLX);                         \
    }
GEMM(cublasSgemm_v2, float, 0)
GEMM(cublasDgemm_v2, double, 0)
GEMM(cublasCgemm_v2, cuComplex, 1)
GEMM(cublasZgemm_v2, cuDoubleComplex, 1)
GEMM(cublasHgemm, struct __half, 0)

#define GEMM_STRIDED(name, T, CPLX)                                                      \
    cublasStatus_t name(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,    \
                        int m, int n, int k, const T *alpha, const T *A, int lda,        \
                        long long int strideA, const T *B, int ldb, long long int strideB, \
                        const T *beta, T *C, int ldc, long long int strideC, int batches) \
    {                                                                                    \
        return gemm(h, ta, tb, m, n, k, lda, ldb, ldc, batches, CPLX);                   \
    }
GEMM_STRIDED(cublasSgemmStridedBatched, float, 0)
GEMM_STRIDED(cublasDgemmStridedBatched, double, 0)
GEMM_STRIDED(cublasCgemmStridedBatched, cuComplex, 1)
GEMM_STRIDED(cublasZgemmStridedBatched, cuDoubleComplex, 1)
GEMM_STRIDED(cublasHgemmStridedBatched, struct __half, 0)

#define GEMM_BATCHED(name, T, CPLX)                                                      \
    cublasStatus_t name(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,    \
                        int m, int n, int k, const T *alpha, const T *const A[], int lda, \
                        const T *const B[], int ldb, const T *beta, T *const C[], int ldc, \
                        int batches)                                                     \
    {                                                                                    \
        return gemm(h, ta, tb, m, n, k, lda, ldb, ldc, batches, CPLX);                   \
    }
GEMM_BATCHED(cublasSgemmBatched, float, 0)
GEMM_BATCHED(cublasDgemmBatched, double, 0)
GEMM_BATCHED(cublasCgemmBatched, cuComplex, 1)
GEMM_BATCHED(cublasZgemmBatched, cuDoubleComplex, 1)
GEMM_BATCHED(cublasHgemmBatched, struct __half, 0)

cublasStatus_t cublasSgemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                             int n, int k, const float *alpha, const void *A, cudaDataType Atype,
                             int lda, const void *B, cudaDataType Btype, int ldb,
                             const float *beta, void *C, cudaDataType Ctype, int ldc)
{
    return gemm(h, ta, tb, m, n, k, lda, ldb, ldc, 1, vgcb_complex_type(Atype));
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                            int n, int k, const void *alpha, const void *A, cudaDataType Atype,
                            int lda, const void *B, cudaDataType Btype, int ldb, const void *beta,
                            void *C, cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t algo)
{
    return gemm(h, ta, tb, m, n, k, lda, ldb, ldc, 1, vgcb_complex_type(Atype));
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta,
                                          cublasOperation_t tb, int m, int n, int k,
                                          const void *alpha, const void *A, cudaDataType Atype,
                                          int lda, long long int strideA, const void *B,
                                          cudaDataType Btype, int ldb, long long int strideB,
                                          const void *beta, void *C, cudaDataType Ctype, int ldc,
                                          long long int strideC, int batches,
                                          cublasComputeType_t computeType, cublasGemmAlgo_t algo)
{
    return gemm(h, ta, tb, m, n, k, lda, ldb, ldc, batches, vgcb_complex_type(Atype));
}

cublasStatus_t cublasGemmBatchedEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,
                                   int m, int n, int k, const void *alpha, const void *const A[],
                                   cudaDataType Atype, int lda, const void *const B[],
                                   cudaDataType Btype, int ldb, const void *beta,
                                   void *const C[], cudaDataType Ctype, int ldc, int batches,
                                   cublasComputeType_t computeType, cublasGemmAlgo_t algo)
{
    return gemm(h, ta, tb, m, n, k, lda, ldb, ldc, batches, vgcb_complex_type(Atype));
}

/* ---- level 3: the rest ------------------------------------------------- */

#define SYMM(name, T)                                                                    \
    cublasStatus_t name(cublasHandle_t h, cublasSideMode_t side, cublasFillMode_t uplo,  \
                        int m, int n, const T *alpha, const T *A, int lda, const T *B,   \
                        int ldb, const T *beta, T *C, int ldc)                           \
    {                                                                                    \
        int ok = side_ok(side) && uplo_ok(uplo) && m >= 0 && n >= 0 &&                   \
                 lda >= max1(side == CUBLAS_SIDE_LEFT ? m : n) && ldb >= max1(m) &&      \
                 ldc >= max1(m);                                                         \
        return run(h, ok, m == 0 || n == 0);                                             \
    }
SYMM(cublasSsymm_v2, float)
SYMM(cublasDsymm_v2, double)
SYMM(cublasCsymm_v2, cuComplex)
SYMM(cublasZsymm_v2, cuDoubleComplex)
SYMM(cublasChemm_v2, cuComplex)
SYMM(cublasZhemm_v2, cuDoubleComplex)

/* S: the type of alpha and beta (real for herk). */
#define SYRK(name, T, S)                                                                 \
    cublasStatus_t name(cublasHandle_t h, cublasFillMode_t uplo, cublasOperation_t trans, \
                        int n, int k, const S *alpha, const T *A, int lda, const S *beta, \
                        T *C, int ldc)                                                   \
    {                                                                                    \
        int ok = uplo_ok(uplo) && op_ok(trans) && n >= 0 && k >= 0 &&                    \
                 lda >= max1(trans == CUBLAS_OP_N ? n : k) && ldc >= max1(n);            \
        return run(h, ok, n == 0);                                                       \
    }
SYRK(cublasSsyrk_v2, float, float)
SYRK(cublasDsyrk_v2, double, double)
SYRK(cublasCsyrk_v2, cuComplex, cuComplex)
SYRK(cublasZsyrk_v2, cuDoubleComplex, cuDoubleComplex)
SYRK(cublasCherk_v2, cuComplex, float)
SYRK(cublasZherk_v2, cuDoubleComplex, double)

/* B: the type of beta (real for her2k). */
#define SYR2K(name, T, B_)                                                               \
    cublasStatus_t name(cublasHandle_t h, cublasFillMode_t uplo, cublasOperation_t trans, \
                        int n, int k, const T *alpha, const T *A, int lda, const T *B,   \
                        int ldb, const B_ *beta, T *C, int ldc)                          \
    {                                                                                    \
        int rows = trans == CUBLAS_OP_N ? n : k;                                         \
        int ok = uplo_ok(uplo) && op_ok(trans) && n >= 0 && k >= 0 && lda >= max1(rows) && \
                 ldb >= max1(rows) && ldc >= max1(n);                                    \
        return run(h, ok, n == 0);                                                       \
    }
SYR2K(cublasSsyr2k_v2, float, float)
SYR2K(cublasDsyr2k_v2, double, double)
SYR2K(cublasCsyr2k_v2, cuComplex, cuComplex)
SYR2K(cublasZsyr2k_v2, cuDoubleComplex, cuDoubleComplex)
SYR2K(cublasCher2k_v2, cuComplex, float)
SYR2K(cublasZher2k_v2, cuDoubleComplex, double)

static int tri_ok(cublasSideMode_t side, cublasFillMode_t uplo, cublasOperation_t trans,
                  cublasDiagType_t diag, int m, int n, int lda, int ldb)
{
    return side_ok(side) && uplo_ok(uplo) && op_ok(trans) && diag_ok(diag) && m >= 0 &&
           n >= 0 && lda >= max1(side == CUBLAS_SIDE_LEFT ? m : n) && ldb >= max1(m);
}

#define TRMM(name, T)                                                                    \
    cublasStatus_t name(cublasHandle_t h, cublasSideMode_t side, cublasFillMode_t uplo,  \
                        cublasOperation_t trans, cublasDiagType_t diag, int m, int n,    \
                        const T *alpha, const T *A, int lda, const T *B, int ldb, T *C,  \
                        int ldc)                                                         \
    {                                                                                    \
        int ok = tri_ok(side, uplo, trans, diag, m, n, lda, ldb) && ldc >= max1(m);      \
        return run(h, ok, m == 0 || n == 0);                                             \
    }
TRMM(cublasStrmm_v2, float)
TRMM(cublasDtrmm_v2, double)
TRMM(cublasCtrmm_v2, cuComplex)
TRMM(cublasZtrmm_v2, cuDoubleComplex)

#define TRSM(name, T)                                                                    \
    cublasStatus_t name(cublasHandle_t h, cublasSideMode_t side, cublasFillMode_t uplo,  \
                        cublasOperation_t trans, cublasDiagType_t diag, int m, int n,    \
                        const T *alpha, const T *A, int lda, T *B, int ldb)              \
    {                                                                                    \
        return run(h, tri_ok(side, uplo, trans, diag, m, n, lda, ldb), m == 0 || n == 0); \
    }
TRSM(cublasStrsm_v2, float)
TRSM(cublasDtrsm_v2, double)
TRSM(cublasCtrsm_v2, cuComplex)
TRSM(cublasZtrsm_v2, cuDoubleComplex)

#define TRSM_BATCHED(name, T)                                                            \
    cublasStatus_t name(cublasHandle_t h, cublasSideMode_t side, cublasFillMode_t uplo,  \
                        cublasOperation_t trans, cublasDiagType_t diag, int m, int n,    \
                        const T *alpha, const T *const A[], int lda, T *const B[], int ldb, \
                        int batches)                                                     \
    {                                                                                    \
        int ok = tri_ok(side, uplo, trans, diag, m, n, lda, ldb) && batches >= 0;        \
        return run(h, ok, m == 0 || n == 0 || batches == 0);                             \
    }
TRSM_BATCHED(cublasStrsmBatched, float)
TRSM_BATCHED(cublasDtrsmBatched, double)
TRSM_BATCHED(cublasCtrsmBatched, cuComplex)
TRSM_BATCHED(cublasZtrsmBatched, cuDoubleComplex)

/* ---- batched LU, QR and least squares ----------------------------------
 * `info` of getrs, geqrf and gels is on the host: 0 says the arguments
 * were valid. getrf's (and gels's devInfoArray) are on the device. */

static cublasStatus_t run_info_(const char *fn, cublasHandle_t h, int args_ok, int empty,
                                int *info)
{
    vgcb_trace(fn);
    cublasStatus_t st = vgcb_check_handle(h);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    if (!info)
        return CUBLAS_STATUS_INVALID_VALUE;
    *info = 0;
    if (!args_ok)
        return CUBLAS_STATUS_INVALID_VALUE;
    return empty ? CUBLAS_STATUS_SUCCESS : vgcb_launch();
}
#define run_info(...) run_info_(__func__, __VA_ARGS__)

#define GETRF_BATCHED(name, T)                                                           \
    cublasStatus_t name(cublasHandle_t h, int n, T *const A[], int lda, int *P, int *info, \
                        int batches)                                                     \
    {                                                                                    \
        int ok = n >= 0 && lda >= max1(n) && batches >= 0 && info;                       \
        return run(h, ok, n == 0 || batches == 0);                                       \
    }
GETRF_BATCHED(cublasSgetrfBatched, float)
GETRF_BATCHED(cublasDgetrfBatched, double)
GETRF_BATCHED(cublasCgetrfBatched, cuComplex)
GETRF_BATCHED(cublasZgetrfBatched, cuDoubleComplex)

#define GETRS_BATCHED(name, T)                                                           \
    cublasStatus_t name(cublasHandle_t h, cublasOperation_t trans, int n, int nrhs,      \
                        const T *const A[], int lda, const int *ipiv, T *const B[], int ldb, \
                        int *info, int batches)                                          \
    {                                                                                    \
        int ok = op_ok(trans) && n >= 0 && nrhs >= 0 && lda >= max1(n) && ldb >= max1(n) && \
                 batches >= 0;                                                           \
        return run_info(h, ok, n == 0 || nrhs == 0 || batches == 0, info);               \
    }
GETRS_BATCHED(cublasSgetrsBatched, float)
GETRS_BATCHED(cublasDgetrsBatched, double)
GETRS_BATCHED(cublasCgetrsBatched, cuComplex)
GETRS_BATCHED(cublasZgetrsBatched, cuDoubleComplex)

#define GEQRF_BATCHED(name, T)                                                           \
    cublasStatus_t name(cublasHandle_t h, int m, int n, T *const A[], int lda,           \
                        T *const tau[], int *info, int batches)                          \
    {                                                                                    \
        int ok = m >= 0 && n >= 0 && lda >= max1(m) && batches >= 0;                     \
        return run_info(h, ok, m == 0 || n == 0 || batches == 0, info);                  \
    }
GEQRF_BATCHED(cublasSgeqrfBatched, float)
GEQRF_BATCHED(cublasDgeqrfBatched, double)
GEQRF_BATCHED(cublasCgeqrfBatched, cuComplex)
GEQRF_BATCHED(cublasZgeqrfBatched, cuDoubleComplex)

#define GELS_BATCHED(name, T)                                                            \
    cublasStatus_t name(cublasHandle_t h, cublasOperation_t trans, int m, int n, int nrhs, \
                        T *const A[], int lda, T *const C[], int ldc, int *info,         \
                        int *devInfo, int batches)                                       \
    {                                                                                    \
        int ok = op_ok(trans) && m >= 0 && n >= 0 && nrhs >= 0 && lda >= max1(m) &&     \
                 ldc >= max1(m > n ? m : n) && batches >= 0;                             \
        return run_info(h, ok, m == 0 || n == 0 || batches == 0, info);                  \
    }
GELS_BATCHED(cublasSgelsBatched, float)
GELS_BATCHED(cublasDgelsBatched, double)
GELS_BATCHED(cublasCgelsBatched, cuComplex)
GELS_BATCHED(cublasZgelsBatched, cuDoubleComplex)

/* ---- level 2 ----------------------------------------------------------- */

#define GEMV(name, T)                                                                    \
    cublasStatus_t name(cublasHandle_t h, cublasOperation_t trans, int m, int n,         \
                        const T *alpha, const T *A, int lda, const T *x, int incx,       \
                        const T *beta, T *y, int incy)                                   \
    {                                                                                    \
        int ok = op_ok(trans) && m >= 0 && n >= 0 && lda >= max1(m) && incx && incy;     \
        return run(h, ok, m == 0 || n == 0);                                             \
    }
GEMV(cublasSgemv_v2, float)
GEMV(cublasDgemv_v2, double)
GEMV(cublasCgemv_v2, cuComplex)
GEMV(cublasZgemv_v2, cuDoubleComplex)

#define GER(name, T)                                                                     \
    cublasStatus_t name(cublasHandle_t h, int m, int n, const T *alpha, const T *x,      \
                        int incx, const T *y, int incy, T *A, int lda)                   \
    {                                                                                    \
        int ok = m >= 0 && n >= 0 && incx && incy && lda >= max1(m);                     \
        return run(h, ok, m == 0 || n == 0);                                             \
    }
GER(cublasSger_v2, float)
GER(cublasDger_v2, double)
GER(cublasCgeru_v2, cuComplex)
GER(cublasCgerc_v2, cuComplex)
GER(cublasZgeru_v2, cuDoubleComplex)
GER(cublasZgerc_v2, cuDoubleComplex)

#define SYMV(name, T)                                                                    \
    cublasStatus_t name(cublasHandle_t h, cublasFillMode_t uplo, int n, const T *alpha,  \
                        const T *A, int lda, const T *x, int incx, const T *beta, T *y,  \
                        int incy)                                                        \
    {                                                                                    \
        int ok = uplo_ok(uplo) && n >= 0 && lda >= max1(n) && incx && incy;              \
        return run(h, ok, n == 0);                                                       \
    }
SYMV(cublasSsymv_v2, float)
SYMV(cublasDsymv_v2, double)
SYMV(cublasCsymv_v2, cuComplex)
SYMV(cublasZsymv_v2, cuDoubleComplex)
SYMV(cublasChemv_v2, cuComplex)
SYMV(cublasZhemv_v2, cuDoubleComplex)

/* S: the type of alpha (real for her). */
#define SYR(name, T, S)                                                                  \
    cublasStatus_t name(cublasHandle_t h, cublasFillMode_t uplo, int n, const S *alpha,  \
                        const T *x, int incx, T *A, int lda)                             \
    {                                                                                    \
        int ok = uplo_ok(uplo) && n >= 0 && incx && lda >= max1(n);                      \
        return run(h, ok, n == 0);                                                       \
    }
SYR(cublasSsyr_v2, float, float)
SYR(cublasDsyr_v2, double, double)
SYR(cublasCsyr_v2, cuComplex, cuComplex)
SYR(cublasZsyr_v2, cuDoubleComplex, cuDoubleComplex)
SYR(cublasCher_v2, cuComplex, float)
SYR(cublasZher_v2, cuDoubleComplex, double)

#define SYR2(name, T)                                                                    \
    cublasStatus_t name(cublasHandle_t h, cublasFillMode_t uplo, int n, const T *alpha,  \
                        const T *x, int incx, const T *y, int incy, T *A, int lda)       \
    {                                                                                    \
        int ok = uplo_ok(uplo) && n >= 0 && incx && incy && lda >= max1(n);              \
        return run(h, ok, n == 0);                                                       \
    }
SYR2(cublasSsyr2_v2, float)
SYR2(cublasDsyr2_v2, double)
SYR2(cublasCsyr2_v2, cuComplex)
SYR2(cublasZsyr2_v2, cuDoubleComplex)
SYR2(cublasCher2_v2, cuComplex)
SYR2(cublasZher2_v2, cuDoubleComplex)

/* trmv and trsv share a shape. */
#define TRMV(name, T)                                                                    \
    cublasStatus_t name(cublasHandle_t h, cublasFillMode_t uplo, cublasOperation_t trans, \
                        cublasDiagType_t diag, int n, const T *A, int lda, T *x, int incx) \
    {                                                                                    \
        int ok = uplo_ok(uplo) && op_ok(trans) && diag_ok(diag) && n >= 0 &&             \
                 lda >= max1(n) && incx;                                                 \
        return run(h, ok, n == 0);                                                       \
    }
TRMV(cublasStrmv_v2, float)
TRMV(cublasDtrmv_v2, double)
TRMV(cublasCtrmv_v2, cuComplex)
TRMV(cublasZtrmv_v2, cuDoubleComplex)
TRMV(cublasStrsv_v2, float)
TRMV(cublasDtrsv_v2, double)
TRMV(cublasCtrsv_v2, cuComplex)
TRMV(cublasZtrsv_v2, cuDoubleComplex)

/* ---- level 1 ----------------------------------------------------------- */

#define AXPY(name, T)                                                                    \
    cublasStatus_t name(cublasHandle_t h, int n, const T *alpha, const T *x, int incx,   \
                        T *y, int incy)                                                  \
    {                                                                                    \
        return run(h, 1, n <= 0);                                                        \
    }
AXPY(cublasSaxpy_v2, float)
AXPY(cublasDaxpy_v2, double)
AXPY(cublasCaxpy_v2, cuComplex)
AXPY(cublasZaxpy_v2, cuDoubleComplex)

/* copy and swap share a shape (copy's x is const). */
#define COPY(name, T, CONST)                                                             \
    cublasStatus_t name(cublasHandle_t h, int n, CONST T *x, int incx, T *y, int incy)   \
    {                                                                                    \
        return run(h, 1, n <= 0);                                                        \
    }
COPY(cublasScopy_v2, float, const)
COPY(cublasDcopy_v2, double, const)
COPY(cublasCcopy_v2, cuComplex, const)
COPY(cublasZcopy_v2, cuDoubleComplex, const)
COPY(cublasSswap_v2, float, )
COPY(cublasDswap_v2, double, )
COPY(cublasCswap_v2, cuComplex, )
COPY(cublasZswap_v2, cuDoubleComplex, )

/* S: the type of alpha (real for Csscal, Zdscal). */
#define SCAL(name, T, S)                                                                 \
    cublasStatus_t name(cublasHandle_t h, int n, const S *alpha, T *x, int incx)         \
    {                                                                                    \
        return run(h, 1, n <= 0);                                                        \
    }
SCAL(cublasSscal_v2, float, float)
SCAL(cublasDscal_v2, double, double)
SCAL(cublasCscal_v2, cuComplex, cuComplex)
SCAL(cublasZscal_v2, cuDoubleComplex, cuDoubleComplex)
SCAL(cublasCsscal_v2, cuComplex, float)
SCAL(cublasZdscal_v2, cuDoubleComplex, double)

#define DOT(name, T)                                                                     \
    cublasStatus_t name(cublasHandle_t h, int n, const T *x, int incx, const T *y,       \
                        int incy, T *result)                                             \
    {                                                                                    \
        return run_result(h, 1, n <= 0, result, sizeof *result);                         \
    }
DOT(cublasSdot_v2, float)
DOT(cublasDdot_v2, double)
DOT(cublasCdotu_v2, cuComplex)
DOT(cublasCdotc_v2, cuComplex)
DOT(cublasZdotu_v2, cuDoubleComplex)
DOT(cublasZdotc_v2, cuDoubleComplex)

/* The size of an element of a cudaDataType result (DotEx): 0 for a type
 * that is not one cuBLAS computes dot products in. */
static size_t data_type_size(cudaDataType type)
{
    switch (type) {
    case CUDA_R_16F: case CUDA_R_16BF: return 2;
    case CUDA_R_32F: case CUDA_C_16F: case CUDA_C_16BF: return 4;
    case CUDA_R_64F: case CUDA_C_32F: return 8;
    case CUDA_C_64F: return 16;
    default: return 0;
    }
}

cublasStatus_t cublasDotEx(cublasHandle_t h, int n, const void *x, cudaDataType xType, int incx,
                           const void *y, cudaDataType yType, int incy, void *result,
                           cudaDataType resultType, cudaDataType executionType)
{
    size_t size = data_type_size(resultType);
    return run_result(h, size != 0, n <= 0, result, size);
}

/* nrm2 and asum: a real result R of a vector of T. */
#define NRM2(name, T, R)                                                                 \
    cublasStatus_t name(cublasHandle_t h, int n, const T *x, int incx, R *result)        \
    {                                                                                    \
        return run_result(h, 1, n <= 0 || incx <= 0, result, sizeof *result);            \
    }
NRM2(cublasSnrm2_v2, float, float)
NRM2(cublasDnrm2_v2, double, double)
NRM2(cublasScnrm2_v2, cuComplex, float)
NRM2(cublasDznrm2_v2, cuDoubleComplex, double)
NRM2(cublasSasum_v2, float, float)
NRM2(cublasDasum_v2, double, double)
NRM2(cublasScasum_v2, cuComplex, float)
NRM2(cublasDzasum_v2, cuDoubleComplex, double)
/* i?amax, i?amin: a 1-based index, 0 for an empty vector (so 0 here too). */
NRM2(cublasIsamax_v2, float, int)
NRM2(cublasIdamax_v2, double, int)
NRM2(cublasIcamax_v2, cuComplex, int)
NRM2(cublasIzamax_v2, cuDoubleComplex, int)
NRM2(cublasIsamin_v2, float, int)
NRM2(cublasIdamin_v2, double, int)
NRM2(cublasIcamin_v2, cuComplex, int)
NRM2(cublasIzamin_v2, cuDoubleComplex, int)

/* C: the type of the cosine, S of the sine. */
#define ROT(name, T, C, S)                                                               \
    cublasStatus_t name(cublasHandle_t h, int n, T *x, int incx, T *y, int incy,         \
                        const C *c, const S *s)                                          \
    {                                                                                    \
        return run(h, 1, n <= 0);                                                        \
    }
ROT(cublasSrot_v2, float, float, float)
ROT(cublasDrot_v2, double, double, double)
ROT(cublasCrot_v2, cuComplex, float, cuComplex)
ROT(cublasCsrot_v2, cuComplex, float, float)
ROT(cublasZrot_v2, cuDoubleComplex, double, cuDoubleComplex)
ROT(cublasZdrot_v2, cuDoubleComplex, double, double)

#define ROTM(name, T)                                                                    \
    cublasStatus_t name(cublasHandle_t h, int n, T *x, int incx, T *y, int incy,         \
                        const T *param)                                                  \
    {                                                                                    \
        return run(h, 1, n <= 0);                                                        \
    }
ROTM(cublasSrotm_v2, float)
ROTM(cublasDrotm_v2, double)

/* rotg and rotmg compute on scalars: in host pointer mode their outputs are
 * host memory, written with zeros. */
#define ROTG(name, T, R)                                                                 \
    cublasStatus_t name(cublasHandle_t h, T *a, T *b, R *c, T *s)                        \
    {                                                                                    \
        cublasStatus_t st = run_result(h, a && b && s, 0, c, sizeof *c);                 \
        if (st == CUBLAS_STATUS_SUCCESS && h->pointer_mode == CUBLAS_POINTER_MODE_HOST) { \
            memset(a, 0, sizeof *a);                                                     \
            memset(b, 0, sizeof *b);                                                     \
            memset(s, 0, sizeof *s);                                                     \
        }                                                                                \
        return st;                                                                       \
    }
ROTG(cublasSrotg_v2, float, float)
ROTG(cublasDrotg_v2, double, double)
ROTG(cublasCrotg_v2, cuComplex, float)
ROTG(cublasZrotg_v2, cuDoubleComplex, double)

/* param: the flag and the four entries of H. */
#define ROTMG(name, T)                                                                   \
    cublasStatus_t name(cublasHandle_t h, T *d1, T *d2, T *x1, const T *y1, T *param)    \
    {                                                                                    \
        cublasStatus_t st = run_result(h, d1 && d2 && x1 && y1, 0, param, 5 * sizeof *param); \
        if (st == CUBLAS_STATUS_SUCCESS && h->pointer_mode == CUBLAS_POINTER_MODE_HOST) { \
            *d1 = 0;                                                                     \
            *d2 = 0;                                                                     \
            *x1 = 0;                                                                     \
        }                                                                                \
        return st;                                                                       \
    }
ROTMG(cublasSrotmg_v2, float)
ROTMG(cublasDrotmg_v2, double)
