/* The cuBLAS and cuBLASLt stand-ins' own test (csrc/phantom/cublas*.c),
 * linked against them and the fake runtime and driver: two devices of 1 GiB
 * and 512 MiB. Every hand-written entry point is called at least once;
 * handles and descriptors give back what was set; the default workspace is
 * device memory; computing calls check their arguments, compute nothing,
 * write zeros where the host reads a result, and fail under a sticky
 * error; the generated stubs refuse and say so once.
 *
 *   make test-fakecuda            all of it (test-fakecuda-san: sanitized)
 *   build/fakecuda/test_cublas lt     the tests whose name contains "lt"
 */
#include <cuda_runtime_api.h>
#include <cublas_v2.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* cublasLt.h declares cublasLtLoggerForceDisable() without a prototype. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <cublasLt.h>
#pragma GCC diagnostic pop

#include "fakecuda.h"
#include "harness.h"
#include "rerun.h"

#define MiB (1ull << 20)

#include "cublas_half.h"

#define HALF struct __half

#define OK CUBLAS_STATUS_SUCCESS
#define BAD CUBLAS_STATUS_INVALID_VALUE

/* Device buffers every computing call gets: 16x16 of the widest element
 * (double complex), and arrays of pointers to them for the batched calls. */
static void *dev_a, *dev_b, *dev_c;
static void *const *arr_a, *const *arr_b, *const *arr_c;

static void setup_buffers(void)
{
    cudaSetDevice(0);
    cudaMalloc(&dev_a, 4096);
    cudaMalloc(&dev_b, 4096);
    cudaMalloc(&dev_c, 4096);
    static void *pa[1], *pb[1], *pc[1];
    pa[0] = dev_a, pb[0] = dev_b, pc[0] = dev_c;
    arr_a = pa, arr_b = pb, arr_c = pc;
}

static cublasHandle_t new_handle(void)
{
    cublasHandle_t h = NULL;
    cudaSetDevice(0);
    return cublasCreate(&h) == OK ? h : NULL;
}

/* ---- handles ---------------------------------------------------------- */

static void test_handle(void)
{
    vg_fakecuda_reset();
    cudaSetDevice(0);
    long long before = vg_fakecuda_bytes_in_use(0);
    long mallocs = vg_fakecuda_malloc_calls();
    cublasHandle_t h = NULL;
    CHECK_EQ(cublasCreate(NULL), BAD);
    CHECK_EQ(cublasCreate(&h), OK);
    CHECK(h != NULL);
    /* cuBLAS's default workspace, 32 MiB on the fake's compute capability
     * 9.0, taken from the driver: the runtime counted no cudaMalloc. */
    CHECK_EQ(vg_fakecuda_bytes_in_use(0), before + 32 * MiB);
    CHECK_EQ(vg_fakecuda_malloc_calls(), mallocs);

    cudaStream_t s = NULL, got = (cudaStream_t)1;
    CHECK_EQ(cudaStreamCreate(&s), cudaSuccess);
    CHECK_EQ(cublasGetStream(h, &got), OK);
    CHECK(got == NULL);
    CHECK_EQ(cublasSetStream(h, s), OK);
    CHECK_EQ(cublasGetStream(h, &got), OK);
    CHECK(got == s);
    CHECK_EQ(cublasGetStream(h, NULL), BAD);

    void *ws = NULL;
    CHECK_EQ(cudaMalloc(&ws, 4 * MiB), cudaSuccess);
    CHECK_EQ(cublasSetWorkspace(h, ws, 4 * MiB), OK);
    CHECK_EQ(cublasSetWorkspace(h, (char *)ws + 128, MiB), BAD); /* 256-byte alignment */
    CHECK_EQ(cublasSetWorkspace(h, NULL, 1), BAD);
    CHECK_EQ(cublasSetWorkspace(h, NULL, 0), OK);

    cublasPointerMode_t pm = CUBLAS_POINTER_MODE_DEVICE;
    CHECK_EQ(cublasGetPointerMode(h, &pm), OK);
    CHECK_EQ(pm, CUBLAS_POINTER_MODE_HOST);
    CHECK_EQ(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_DEVICE), OK);
    CHECK_EQ(cublasGetPointerMode(h, &pm), OK);
    CHECK_EQ(pm, CUBLAS_POINTER_MODE_DEVICE);
    CHECK_EQ(cublasSetPointerMode(h, (cublasPointerMode_t)7), BAD);
    CHECK_EQ(cublasGetPointerMode(h, NULL), BAD);

    cublasAtomicsMode_t am = CUBLAS_ATOMICS_ALLOWED;
    CHECK_EQ(cublasGetAtomicsMode(h, &am), OK);
    CHECK_EQ(am, CUBLAS_ATOMICS_NOT_ALLOWED);
    CHECK_EQ(cublasSetAtomicsMode(h, CUBLAS_ATOMICS_ALLOWED), OK);
    CHECK_EQ(cublasGetAtomicsMode(h, &am), OK);
    CHECK_EQ(am, CUBLAS_ATOMICS_ALLOWED);
    CHECK_EQ(cublasSetAtomicsMode(h, (cublasAtomicsMode_t)5), BAD);
    CHECK_EQ(cublasGetAtomicsMode(h, NULL), BAD);

    /* What PyTorch sets and reads back, flags combined. */
    cublasMath_t mm = CUBLAS_TF32_TENSOR_OP_MATH;
    CHECK_EQ(cublasGetMathMode(h, &mm), OK);
    CHECK_EQ(mm, CUBLAS_DEFAULT_MATH);
    cublasMath_t flags = (cublasMath_t)(CUBLAS_DEFAULT_MATH |
                                        CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION);
    CHECK_EQ(cublasSetMathMode(h, flags), OK);
    CHECK_EQ(cublasGetMathMode(h, &mm), OK);
    CHECK_EQ(mm, flags);
    CHECK_EQ(cublasGetMathMode(h, NULL), BAD);

    int sms = -1;
    CHECK_EQ(cublasGetSmCountTarget(h, &sms), OK);
    CHECK_EQ(sms, 0);
    CHECK_EQ(cublasSetSmCountTarget(h, 100), OK);
    CHECK_EQ(cublasGetSmCountTarget(h, &sms), OK);
    CHECK_EQ(sms, 100);
    CHECK_EQ(cublasSetSmCountTarget(h, -1), BAD);
    CHECK_EQ(cublasGetSmCountTarget(h, NULL), BAD);

    /* Handles it did not create: none, and something else. */
    uint32_t not_a_handle[16] = {0};
    CHECK_EQ(cublasSetStream(NULL, s), CUBLAS_STATUS_NOT_INITIALIZED);
    CHECK_EQ(cublasSetMathMode((cublasHandle_t)not_a_handle, CUBLAS_DEFAULT_MATH),
             CUBLAS_STATUS_NOT_INITIALIZED);
    CHECK_EQ(cublasDestroy((cublasHandle_t)not_a_handle), CUBLAS_STATUS_NOT_INITIALIZED);

    CHECK_EQ(cublasDestroy(h), OK);
    CHECK_EQ(vg_fakecuda_bytes_in_use(0), before + 4 * MiB);
    cudaFree(ws);
    cudaStreamDestroy(s);
    CHECK_EQ(vg_fakecuda_bytes_in_use(0), before);
}

/* Each handle holds its workspace on the device current when it was made;
 * a full device refuses the handle as a GPU does (PyTorch then reports
 * CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate). */
static void test_handle_devices_and_oom(void)
{
    vg_fakecuda_reset();
    cublasHandle_t h1 = NULL, h = (cublasHandle_t)1;
    CHECK_EQ(cudaSetDevice(1), cudaSuccess);
    long long before1 = vg_fakecuda_bytes_in_use(1);
    CHECK_EQ(cublasCreate(&h1), OK);
    CHECK_EQ(vg_fakecuda_bytes_in_use(1), before1 + 32 * MiB);

    size_t free_b = 0, total = 0;
    CHECK_EQ(cudaMemGetInfo(&free_b, &total), cudaSuccess);
    void *fill = NULL;
    CHECK_EQ(cudaMalloc(&fill, free_b - 16 * MiB), cudaSuccess);
    CHECK_EQ(cublasCreate(&h), CUBLAS_STATUS_ALLOC_FAILED);
    CHECK(h == NULL);
    cudaFree(fill);
    CHECK_EQ(cublasDestroy(h1), OK);
    CHECK_EQ(vg_fakecuda_bytes_in_use(1), before1);
    cudaSetDevice(0);
}

static void test_versions_and_status(void)
{
    int v = 0;
    CHECK_EQ(cublasGetVersion(NULL, &v), OK);
    CHECK_EQ(v, CUBLAS_VERSION);
    CHECK_EQ(cublasGetVersion(NULL, NULL), BAD);
    CHECK_EQ(cublasGetProperty(MAJOR_VERSION, &v), OK);
    CHECK_EQ(v, CUBLAS_VER_MAJOR);
    CHECK_EQ(cublasGetProperty(MINOR_VERSION, &v), OK);
    CHECK_EQ(v, CUBLAS_VER_MINOR);
    CHECK_EQ(cublasGetProperty(PATCH_LEVEL, &v), OK);
    CHECK_EQ(v, CUBLAS_VER_PATCH);
    CHECK_EQ(cublasGetProperty((libraryPropertyType)9, &v), BAD);
    CHECK_EQ(cublasGetProperty(MAJOR_VERSION, NULL), BAD);
    CHECK_EQ(cublasGetCudartVersion(), CUDART_VERSION);
    CHECK(strcmp(cublasGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED), "CUBLAS_STATUS_NOT_SUPPORTED") == 0);
    CHECK(strcmp(cublasGetStatusName((cublasStatus_t)99), "CUBLAS_STATUS_UNKNOWN") == 0);
    CHECK(strcmp(cublasGetStatusString(CUBLAS_STATUS_SUCCESS), "success") == 0);
    CHECK(strcmp(cublasGetStatusString((cublasStatus_t)99), "unknown error") == 0);

    CHECK_EQ(cublasLtGetVersion(), CUBLAS_VERSION);
    CHECK_EQ(cublasLtGetCudartVersion(), CUDART_VERSION);
    CHECK_EQ(cublasLtGetProperty(MAJOR_VERSION, &v), OK);
    CHECK_EQ(v, CUBLAS_VER_MAJOR);
    CHECK_EQ(cublasLtGetProperty(MAJOR_VERSION, NULL), BAD);
    CHECK(strcmp(cublasLtGetStatusName(CUBLAS_STATUS_ALLOC_FAILED), "CUBLAS_STATUS_ALLOC_FAILED") == 0);
    CHECK(strcmp(cublasLtGetStatusString(CUBLAS_STATUS_EXECUTION_FAILED),
                 "the GPU program failed to execute") == 0);
}

/* ---- transfers: copies, so they are done ------------------------------- */

static void test_transfers(void)
{
    cudaSetDevice(0);
    float host[12], back[12];
    for (int i = 0; i < 12; i++)
        host[i] = (float)i, back[i] = -1.0f;
    void *dev = NULL;
    CHECK_EQ(cudaMalloc(&dev, 256), cudaSuccess);
    /* A 2x3 matrix with leading dimension 4 into one with 2, and back. */
    CHECK_EQ(cublasSetMatrix(2, 3, 4, host, 4, dev, 2), OK);
    CHECK_EQ(cublasGetMatrix(2, 3, 4, dev, 2, back, 2), OK);
    float want[6] = {0, 1, 4, 5, 8, 9};
    CHECK(memcmp(back, want, sizeof want) == 0);
    CHECK_EQ(cublasSetMatrixAsync(2, 3, 4, host + 1, 4, dev, 2, NULL), OK);
    CHECK_EQ(cublasGetMatrixAsync(2, 3, 4, dev, 2, back, 2, NULL), OK);
    CHECK(back[0] == 1 && back[5] == 10);
    CHECK_EQ(cublasSetMatrix(3, 1, 4, host, 2, dev, 3), BAD); /* lda < rows */
    CHECK_EQ(cublasSetMatrix(0, 5, 4, host, 1, dev, 1), OK);  /* nothing to copy */

    /* Every third element into a dense vector, and back every other. */
    CHECK_EQ(cublasSetVector(4, 4, host, 3, dev, 1), OK);
    CHECK_EQ(cublasGetVector(4, 4, dev, 1, back, 2), OK);
    CHECK(back[0] == 0 && back[2] == 3 && back[4] == 6 && back[6] == 9);
    CHECK_EQ(cublasSetVectorAsync(2, 4, host + 2, 1, dev, 1, NULL), OK);
    CHECK_EQ(cublasGetVectorAsync(2, 4, dev, 1, back, 1, NULL), OK);
    CHECK(back[0] == 2 && back[1] == 3);
    CHECK_EQ(cublasSetVector(4, 4, host, 0, dev, 1), BAD);

    /* Memory that is no longer device memory: cuBLAS's mapping error. */
    CHECK_EQ(cudaFree(dev), cudaSuccess);
    CHECK_EQ(cublasSetVector(4, 4, host, 1, dev, 1), CUBLAS_STATUS_MAPPING_ERROR);
    cudaGetLastError();
}

/* ---- GEMMs -------------------------------------------------------------- */

#define TRY_GEMM(fn, T)                                                                  \
    do {                                                                                 \
        cuDoubleComplex one; /* wide enough for any scalar */                                                                           \
        memset((void *)&one, 0, sizeof one);                                                     \
        CHECK_EQ(fn(h, CUBLAS_OP_N, CUBLAS_OP_T, 4, 3, 2, (void *)&one, dev_a, 4, dev_b, 3, (void *)&one, \
                    dev_c, 4), OK);                                                      \
        CHECK_EQ(fn(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 3, 2, (void *)&one, dev_a, 3, dev_b, 2, (void *)&one, \
                    dev_c, 4), BAD); /* lda < m */                                       \
        CHECK_EQ(fn(h, CUBLAS_OP_T, (cublasOperation_t)9, 4, 3, 2, (void *)&one, dev_a, 4, dev_b, \
                    3, (void *)&one, dev_c, 4), BAD);                                            \
        CHECK_EQ(fn(NULL, CUBLAS_OP_N, CUBLAS_OP_N, 4, 3, 2, (void *)&one, dev_a, 4, dev_b, 2,   \
                    (void *)&one, dev_c, 4), CUBLAS_STATUS_NOT_INITIALIZED);                     \
    } while (0)

#define TRY_GEMM_STRIDED(fn, T)                                                          \
    do {                                                                                 \
        cuDoubleComplex one; /* wide enough for any scalar */                                                                           \
        memset((void *)&one, 0, sizeof one);                                                     \
        CHECK_EQ(fn(h, CUBLAS_OP_T, CUBLAS_OP_N, 4, 3, 2, (void *)&one, dev_a, 2, 8, dev_b, 2, 6, \
                    (void *)&one, dev_c, 4, 12, 5), OK);                                         \
        CHECK_EQ(fn(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 3, 2, (void *)&one, dev_a, 4, 8, dev_b, 2, 6, \
                    (void *)&one, dev_c, 4, 12, -1), BAD);                                       \
    } while (0)

#define TRY_GEMM_BATCHED(fn, T)                                                          \
    do {                                                                                 \
        cuDoubleComplex one; /* wide enough for any scalar */                                                                           \
        memset((void *)&one, 0, sizeof one);                                                     \
        CHECK_EQ(fn(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 3, 2, (void *)&one, (const T *const *)arr_a, 4, \
                    (const T *const *)arr_b, 2, (void *)&one, (T *const *)arr_c, 4, 1), OK);     \
        CHECK_EQ(fn(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 3, -2, (void *)&one, (const T *const *)arr_a, 4, \
                    (const T *const *)arr_b, 2, (void *)&one, (T *const *)arr_c, 4, 1), BAD);    \
    } while (0)

static void test_gemm(void)
{
    vg_fakecuda_reset();
    cublasHandle_t h = new_handle();
    CHECK(h != NULL);
    TRY_GEMM(cublasSgemm, float);
    TRY_GEMM(cublasDgemm, double);
    TRY_GEMM(cublasCgemm, cuComplex);
    TRY_GEMM(cublasZgemm, cuDoubleComplex);
    TRY_GEMM(cublasHgemm, HALF);
    TRY_GEMM_STRIDED(cublasSgemmStridedBatched, float);
    TRY_GEMM_STRIDED(cublasDgemmStridedBatched, double);
    TRY_GEMM_STRIDED(cublasCgemmStridedBatched, cuComplex);
    TRY_GEMM_STRIDED(cublasZgemmStridedBatched, cuDoubleComplex);
    TRY_GEMM_STRIDED(cublasHgemmStridedBatched, HALF);
    TRY_GEMM_BATCHED(cublasSgemmBatched, float);
    TRY_GEMM_BATCHED(cublasDgemmBatched, double);
    TRY_GEMM_BATCHED(cublasCgemmBatched, cuComplex);
    TRY_GEMM_BATCHED(cublasZgemmBatched, cuDoubleComplex);
    TRY_GEMM_BATCHED(cublasHgemmBatched, HALF);

    float one = 1.0f;
    CHECK_EQ(cublasSgemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 3, 2, &one, dev_a, CUDA_R_16BF, 4,
                           dev_b, CUDA_R_16BF, 2, &one, dev_c, CUDA_R_32F, 4), OK);
    CHECK_EQ(cublasSgemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 3, 2, &one, dev_a, CUDA_R_16BF, 4,
                           dev_b, CUDA_R_16BF, 2, &one, dev_c, CUDA_R_32F, 2), BAD);
    CHECK_EQ(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, 4, 3, 2, &one, dev_a, CUDA_R_16F, 2,
                          dev_b, CUDA_R_16F, 2, &one, dev_c, CUDA_R_16F, 4, CUBLAS_COMPUTE_32F,
                          CUBLAS_GEMM_DEFAULT_TENSOR_OP), OK);
    CHECK_EQ(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, 4, 3, 2, &one, dev_a, CUDA_R_16F, 1,
                          dev_b, CUDA_R_16F, 2, &one, dev_c, CUDA_R_16F, 4, CUBLAS_COMPUTE_32F,
                          CUBLAS_GEMM_DEFAULT_TENSOR_OP), BAD);
    CHECK_EQ(cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 3, 2, &one, dev_a,
                                        CUDA_R_16BF, 4, 8, dev_b, CUDA_R_16BF, 2, 6, &one, dev_c,
                                        CUDA_R_16BF, 4, 12, 3, CUBLAS_COMPUTE_32F,
                                        CUBLAS_GEMM_DEFAULT), OK);
    CHECK_EQ(cublasGemmBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 3, 2, &one,
                                 (const void *const *)arr_a, CUDA_R_32F, 4,
                                 (const void *const *)arr_b, CUDA_R_32F, 2, &one, arr_c,
                                 CUDA_R_32F, 4, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT), OK);

    /* Empty problems launch nothing; the rest "launch", and a sticky error
     * of the device (an illegal address before) fails them as it fails a
     * launch. */
    vg_fakecuda_set_sticky_error(700);
    CHECK_EQ(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 3, 2, &one, dev_a, 4, dev_b, 2, &one,
                         dev_c, 4), CUBLAS_STATUS_EXECUTION_FAILED);
    CHECK_EQ(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 0, 3, 2, &one, dev_a, 4, dev_b, 2, &one,
                         dev_c, 4), OK);
    vg_fakecuda_set_sticky_error(0);
    cudaGetLastError();
    CHECK_EQ(cublasDestroy(h), OK);
}

/* ---- the rest of level 3, batched solvers ------------------------------- */

#define TRY_SYMM(fn, T)                                                                  \
    do {                                                                                 \
        T al;                                                                            \
        memset(&al, 0, sizeof al);                                                       \
        CHECK_EQ(fn(h, CUBLAS_SIDE_RIGHT, CUBLAS_FILL_MODE_UPPER, 4, 3, &al, dev_a, 3, dev_b, \
                    4, &al, dev_c, 4), OK);                                              \
        CHECK_EQ(fn(h, CUBLAS_SIDE_LEFT, CUBLAS_FILL_MODE_UPPER, 4, 3, &al, dev_a, 3, dev_b, \
                    4, &al, dev_c, 4), BAD);                                             \
    } while (0)

#define TRY_SYRK(fn, T, S)                                                               \
    do {                                                                                 \
        S al;                                                                            \
        memset(&al, 0, sizeof al);                                                       \
        CHECK_EQ(fn(h, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_T, 4, 3, &al, (const T *)dev_a, 3, \
                    &al, (T *)dev_c, 4), OK);                                            \
        CHECK_EQ(fn(h, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_N, 4, 3, &al, (const T *)dev_a, 3, \
                    &al, (T *)dev_c, 4), BAD);                                           \
    } while (0)

#define TRY_SYR2K(fn, T, B)                                                              \
    do {                                                                                 \
        T al;                                                                            \
        B be;                                                                            \
        memset(&al, 0, sizeof al);                                                       \
        memset(&be, 0, sizeof be);                                                       \
        CHECK_EQ(fn(h, CUBLAS_FILL_MODE_UPPER, CUBLAS_OP_N, 4, 3, &al, dev_a, 4, dev_b, 4, \
                    &be, dev_c, 4), OK);                                                 \
        CHECK_EQ(fn(h, CUBLAS_FILL_MODE_FULL, CUBLAS_OP_N, 4, 3, &al, dev_a, 4, dev_b, 4, \
                    &be, dev_c, 4), BAD);                                                \
    } while (0)

#define TRY_TRMM(fn, T)                                                                  \
    do {                                                                                 \
        T al;                                                                            \
        memset(&al, 0, sizeof al);                                                       \
        CHECK_EQ(fn(h, CUBLAS_SIDE_LEFT, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_N,            \
                    CUBLAS_DIAG_UNIT, 4, 3, &al, dev_a, 4, dev_b, 4, dev_c, 4), OK);     \
        CHECK_EQ(fn(h, CUBLAS_SIDE_LEFT, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_N,            \
                    (cublasDiagType_t)3, 4, 3, &al, dev_a, 4, dev_b, 4, dev_c, 4), BAD); \
    } while (0)

#define TRY_TRSM(fn, T)                                                                  \
    do {                                                                                 \
        T al;                                                                            \
        memset(&al, 0, sizeof al);                                                       \
        CHECK_EQ(fn(h, CUBLAS_SIDE_RIGHT, CUBLAS_FILL_MODE_UPPER, CUBLAS_OP_C,           \
                    CUBLAS_DIAG_NON_UNIT, 4, 3, &al, dev_a, 3, dev_b, 4), OK);           \
        CHECK_EQ(fn(h, CUBLAS_SIDE_RIGHT, CUBLAS_FILL_MODE_UPPER, CUBLAS_OP_C,           \
                    CUBLAS_DIAG_NON_UNIT, 4, 3, &al, dev_a, 3, dev_b, 3), BAD);          \
    } while (0)

#define TRY_TRSM_BATCHED(fn, T)                                                          \
    do {                                                                                 \
        T al;                                                                            \
        memset(&al, 0, sizeof al);                                                       \
        CHECK_EQ(fn(h, CUBLAS_SIDE_LEFT, CUBLAS_FILL_MODE_UPPER, CUBLAS_OP_N,            \
                    CUBLAS_DIAG_NON_UNIT, 4, 3, &al, (const T *const *)arr_a, 4,         \
                    (T *const *)arr_b, 4, 1), OK);                                       \
        CHECK_EQ(fn(h, CUBLAS_SIDE_LEFT, CUBLAS_FILL_MODE_UPPER, CUBLAS_OP_N,            \
                    CUBLAS_DIAG_NON_UNIT, 4, 3, &al, (const T *const *)arr_a, 4,         \
                    (T *const *)arr_b, 4, -1), BAD);                                     \
    } while (0)

/* info is on the host: 0 for valid arguments. */
#define TRY_SOLVERS(getrf, getrs, geqrf, gels, T)                                        \
    do {                                                                                 \
        int info = 77;                                                                   \
        CHECK_EQ(getrf(h, 4, (T *const *)arr_a, 4, (int *)dev_b, (int *)dev_c, 1), OK);  \
        CHECK_EQ(getrf(h, 4, (T *const *)arr_a, 3, (int *)dev_b, (int *)dev_c, 1), BAD); \
        CHECK_EQ(getrs(h, CUBLAS_OP_N, 4, 2, (const T *const *)arr_a, 4, (const int *)dev_c, \
                       (T *const *)arr_b, 4, &info, 1), OK);                             \
        CHECK_EQ(info, 0);                                                               \
        info = 77;                                                                       \
        CHECK_EQ(geqrf(h, 4, 3, (T *const *)arr_a, 4, (T *const *)arr_b, &info, 1), OK); \
        CHECK_EQ(info, 0);                                                               \
        info = 77;                                                                       \
        CHECK_EQ(gels(h, CUBLAS_OP_N, 4, 3, 2, (T *const *)arr_a, 4, (T *const *)arr_c, 4, \
                      &info, (int *)dev_b, 1), OK);                                      \
        CHECK_EQ(info, 0);                                                               \
        CHECK_EQ(gels(h, CUBLAS_OP_N, 4, 3, 2, (T *const *)arr_a, 4, (T *const *)arr_c, 4, \
                      NULL, (int *)dev_b, 1), BAD);                                      \
    } while (0)

static void test_level3_and_solvers(void)
{
    cublasHandle_t h = new_handle();
    CHECK(h != NULL);
    TRY_SYMM(cublasSsymm, float);
    TRY_SYMM(cublasDsymm, double);
    TRY_SYMM(cublasCsymm, cuComplex);
    TRY_SYMM(cublasZsymm, cuDoubleComplex);
    TRY_SYMM(cublasChemm, cuComplex);
    TRY_SYMM(cublasZhemm, cuDoubleComplex);
    TRY_SYRK(cublasSsyrk, float, float);
    TRY_SYRK(cublasDsyrk, double, double);
    TRY_SYRK(cublasCsyrk, cuComplex, cuComplex);
    TRY_SYRK(cublasZsyrk, cuDoubleComplex, cuDoubleComplex);
    TRY_SYRK(cublasCherk, cuComplex, float);
    TRY_SYRK(cublasZherk, cuDoubleComplex, double);
    TRY_SYR2K(cublasSsyr2k, float, float);
    TRY_SYR2K(cublasDsyr2k, double, double);
    TRY_SYR2K(cublasCsyr2k, cuComplex, cuComplex);
    TRY_SYR2K(cublasZsyr2k, cuDoubleComplex, cuDoubleComplex);
    TRY_SYR2K(cublasCher2k, cuComplex, float);
    TRY_SYR2K(cublasZher2k, cuDoubleComplex, double);
    TRY_TRMM(cublasStrmm, float);
    TRY_TRMM(cublasDtrmm, double);
    TRY_TRMM(cublasCtrmm, cuComplex);
    TRY_TRMM(cublasZtrmm, cuDoubleComplex);
    TRY_TRSM(cublasStrsm, float);
    TRY_TRSM(cublasDtrsm, double);
    TRY_TRSM(cublasCtrsm, cuComplex);
    TRY_TRSM(cublasZtrsm, cuDoubleComplex);
    TRY_TRSM_BATCHED(cublasStrsmBatched, float);
    TRY_TRSM_BATCHED(cublasDtrsmBatched, double);
    TRY_TRSM_BATCHED(cublasCtrsmBatched, cuComplex);
    TRY_TRSM_BATCHED(cublasZtrsmBatched, cuDoubleComplex);
    TRY_SOLVERS(cublasSgetrfBatched, cublasSgetrsBatched, cublasSgeqrfBatched, cublasSgelsBatched,
                float);
    TRY_SOLVERS(cublasDgetrfBatched, cublasDgetrsBatched, cublasDgeqrfBatched, cublasDgelsBatched,
                double);
    TRY_SOLVERS(cublasCgetrfBatched, cublasCgetrsBatched, cublasCgeqrfBatched, cublasCgelsBatched,
                cuComplex);
    TRY_SOLVERS(cublasZgetrfBatched, cublasZgetrsBatched, cublasZgeqrfBatched, cublasZgelsBatched,
                cuDoubleComplex);
    CHECK_EQ(cublasDestroy(h), OK);
}

/* ---- level 2 ------------------------------------------------------------ */

#define ZERO(T, v) T v; memset(&v, 0, sizeof v)

#define TRY_GEMV(fn, T)                                                                  \
    do {                                                                                 \
        ZERO(T, al);                                                                     \
        CHECK_EQ(fn(h, CUBLAS_OP_T, 4, 3, &al, dev_a, 4, dev_b, 1, &al, dev_c, 2), OK);  \
        CHECK_EQ(fn(h, CUBLAS_OP_T, 4, 3, &al, dev_a, 4, dev_b, 0, &al, dev_c, 2), BAD); \
    } while (0)

#define TRY_GER(fn, T)                                                                   \
    do {                                                                                 \
        ZERO(T, al);                                                                     \
        CHECK_EQ(fn(h, 4, 3, &al, dev_a, 1, dev_b, -1, dev_c, 4), OK);                   \
        CHECK_EQ(fn(h, 4, 3, &al, dev_a, 1, dev_b, -1, dev_c, 3), BAD);                  \
    } while (0)

#define TRY_SYMV(fn, T)                                                                  \
    do {                                                                                 \
        ZERO(T, al);                                                                     \
        CHECK_EQ(fn(h, CUBLAS_FILL_MODE_LOWER, 4, &al, dev_a, 4, dev_b, 1, &al, dev_c, 1), OK); \
        CHECK_EQ(fn(h, CUBLAS_FILL_MODE_LOWER, -4, &al, dev_a, 4, dev_b, 1, &al, dev_c, 1), BAD); \
    } while (0)

#define TRY_SYR(fn, T, S)                                                                \
    do {                                                                                 \
        ZERO(S, al);                                                                     \
        CHECK_EQ(fn(h, CUBLAS_FILL_MODE_UPPER, 4, &al, (const T *)dev_a, 1, (T *)dev_c, 4), OK); \
        CHECK_EQ(fn(h, CUBLAS_FILL_MODE_UPPER, 4, &al, (const T *)dev_a, 1, (T *)dev_c, 2), BAD); \
    } while (0)

#define TRY_SYR2(fn, T)                                                                  \
    do {                                                                                 \
        ZERO(T, al);                                                                     \
        CHECK_EQ(fn(h, CUBLAS_FILL_MODE_UPPER, 4, &al, dev_a, 1, dev_b, 1, dev_c, 4), OK); \
        CHECK_EQ(fn(h, CUBLAS_FILL_MODE_UPPER, 4, &al, dev_a, 0, dev_b, 1, dev_c, 4), BAD); \
    } while (0)

#define TRY_TRMV(fn)                                                                     \
    do {                                                                                 \
        CHECK_EQ(fn(h, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_N, CUBLAS_DIAG_UNIT, 4, dev_a, 4, \
                    dev_b, 1), OK);                                                      \
        CHECK_EQ(fn(h, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_N, CUBLAS_DIAG_UNIT, 4, dev_a, 4, \
                    dev_b, 0), BAD);                                                     \
    } while (0)

static void test_level2(void)
{
    cublasHandle_t h = new_handle();
    CHECK(h != NULL);
    TRY_GEMV(cublasSgemv, float);
    TRY_GEMV(cublasDgemv, double);
    TRY_GEMV(cublasCgemv, cuComplex);
    TRY_GEMV(cublasZgemv, cuDoubleComplex);
    TRY_GER(cublasSger, float);
    TRY_GER(cublasDger, double);
    TRY_GER(cublasCgeru, cuComplex);
    TRY_GER(cublasCgerc, cuComplex);
    TRY_GER(cublasZgeru, cuDoubleComplex);
    TRY_GER(cublasZgerc, cuDoubleComplex);
    TRY_SYMV(cublasSsymv, float);
    TRY_SYMV(cublasDsymv, double);
    TRY_SYMV(cublasCsymv, cuComplex);
    TRY_SYMV(cublasZsymv, cuDoubleComplex);
    TRY_SYMV(cublasChemv, cuComplex);
    TRY_SYMV(cublasZhemv, cuDoubleComplex);
    TRY_SYR(cublasSsyr, float, float);
    TRY_SYR(cublasDsyr, double, double);
    TRY_SYR(cublasCsyr, cuComplex, cuComplex);
    TRY_SYR(cublasZsyr, cuDoubleComplex, cuDoubleComplex);
    TRY_SYR(cublasCher, cuComplex, float);
    TRY_SYR(cublasZher, cuDoubleComplex, double);
    TRY_SYR2(cublasSsyr2, float);
    TRY_SYR2(cublasDsyr2, double);
    TRY_SYR2(cublasCsyr2, cuComplex);
    TRY_SYR2(cublasZsyr2, cuDoubleComplex);
    TRY_SYR2(cublasCher2, cuComplex);
    TRY_SYR2(cublasZher2, cuDoubleComplex);
    TRY_TRMV(cublasStrmv);
    TRY_TRMV(cublasDtrmv);
    TRY_TRMV(cublasCtrmv);
    TRY_TRMV(cublasZtrmv);
    TRY_TRMV(cublasStrsv);
    TRY_TRMV(cublasDtrsv);
    TRY_TRMV(cublasCtrsv);
    TRY_TRMV(cublasZtrsv);
    CHECK_EQ(cublasDestroy(h), OK);
}

/* ---- level 1 ------------------------------------------------------------ */

#define TRY_N(call) CHECK_EQ(call, OK)

/* A result read on the host is zeros; one on the device is left alone. */
#define TRY_RESULT(fn, R, ...)                                                           \
    do {                                                                                 \
        R r;                                                                             \
        memset(&r, 0x5a, sizeof r);                                                      \
        CHECK_EQ(fn(h, __VA_ARGS__, &r), OK);                                            \
        R zero;                                                                          \
        memset(&zero, 0, sizeof zero);                                                   \
        CHECK(memcmp(&r, &zero, sizeof r) == 0);                                         \
        CHECK_EQ(fn(h, __VA_ARGS__, NULL), BAD);                                         \
    } while (0)

static void test_level1(void)
{
    cublasHandle_t h = new_handle();
    CHECK(h != NULL);
    float fs = 1;
    double ds = 1;
    cuComplex cs = {1, 0};
    cuDoubleComplex zs = {1, 0};
    TRY_N(cublasSaxpy(h, 4, &fs, dev_a, 1, dev_b, 1));
    TRY_N(cublasDaxpy(h, 4, &ds, dev_a, 1, dev_b, 1));
    TRY_N(cublasCaxpy(h, 4, &cs, dev_a, 1, dev_b, 1));
    TRY_N(cublasZaxpy(h, 4, &zs, dev_a, 1, dev_b, 1));
    TRY_N(cublasScopy(h, 4, dev_a, 1, dev_b, 1));
    TRY_N(cublasDcopy(h, 4, dev_a, 1, dev_b, 1));
    TRY_N(cublasCcopy(h, 4, dev_a, 1, dev_b, 1));
    TRY_N(cublasZcopy(h, 4, dev_a, 1, dev_b, 1));
    TRY_N(cublasSswap(h, 4, dev_a, 1, dev_b, 1));
    TRY_N(cublasDswap(h, 4, dev_a, 1, dev_b, 1));
    TRY_N(cublasCswap(h, 4, dev_a, 1, dev_b, 1));
    TRY_N(cublasZswap(h, 4, dev_a, 1, dev_b, 1));
    TRY_N(cublasSscal(h, 4, &fs, dev_a, 1));
    TRY_N(cublasDscal(h, 4, &ds, dev_a, 1));
    TRY_N(cublasCscal(h, 4, &cs, dev_a, 1));
    TRY_N(cublasZscal(h, 4, &zs, dev_a, 1));
    TRY_N(cublasCsscal(h, 4, &fs, dev_a, 1));
    TRY_N(cublasZdscal(h, 4, &ds, dev_a, 1));
    TRY_N(cublasSrot(h, 4, dev_a, 1, dev_b, 1, &fs, &fs));
    TRY_N(cublasDrot(h, 4, dev_a, 1, dev_b, 1, &ds, &ds));
    TRY_N(cublasCrot(h, 4, dev_a, 1, dev_b, 1, &fs, &cs));
    TRY_N(cublasCsrot(h, 4, dev_a, 1, dev_b, 1, &fs, &fs));
    TRY_N(cublasZrot(h, 4, dev_a, 1, dev_b, 1, &ds, &zs));
    TRY_N(cublasZdrot(h, 4, dev_a, 1, dev_b, 1, &ds, &ds));
    float fparam[5] = {0};
    double dparam[5] = {0};
    TRY_N(cublasSrotm(h, 4, dev_a, 1, dev_b, 1, fparam));
    TRY_N(cublasDrotm(h, 4, dev_a, 1, dev_b, 1, dparam));

    TRY_RESULT(cublasSdot, float, 4, dev_a, 1, dev_b, 1);
    TRY_RESULT(cublasDdot, double, 4, dev_a, 1, dev_b, 1);
    TRY_RESULT(cublasCdotu, cuComplex, 4, dev_a, 1, dev_b, 1);
    TRY_RESULT(cublasCdotc, cuComplex, 4, dev_a, 1, dev_b, 1);
    TRY_RESULT(cublasZdotu, cuDoubleComplex, 4, dev_a, 1, dev_b, 1);
    TRY_RESULT(cublasZdotc, cuDoubleComplex, 4, dev_a, 1, dev_b, 1);
    TRY_RESULT(cublasSnrm2, float, 4, dev_a, 1);
    TRY_RESULT(cublasDnrm2, double, 4, dev_a, 1);
    TRY_RESULT(cublasScnrm2, float, 4, dev_a, 1);
    TRY_RESULT(cublasDznrm2, double, 4, dev_a, 1);
    TRY_RESULT(cublasSasum, float, 4, dev_a, 1);
    TRY_RESULT(cublasDasum, double, 4, dev_a, 1);
    TRY_RESULT(cublasScasum, float, 4, dev_a, 1);
    TRY_RESULT(cublasDzasum, double, 4, dev_a, 1);
    TRY_RESULT(cublasIsamax, int, 4, dev_a, 1);
    TRY_RESULT(cublasIdamax, int, 4, dev_a, 1);
    TRY_RESULT(cublasIcamax, int, 4, dev_a, 1);
    TRY_RESULT(cublasIzamax, int, 4, dev_a, 1);
    TRY_RESULT(cublasIsamin, int, 4, dev_a, 1);
    TRY_RESULT(cublasIdamin, int, 4, dev_a, 1);
    TRY_RESULT(cublasIcamin, int, 4, dev_a, 1);
    TRY_RESULT(cublasIzamin, int, 4, dev_a, 1);
    /* DotEx: the result's size follows its type. */
    double dr = 3;
    CHECK_EQ(cublasDotEx(h, 4, dev_a, CUDA_R_16BF, 1, dev_b, CUDA_R_16BF, 1, &dr, CUDA_R_64F,
                         CUDA_R_32F), OK);
    CHECK(dr == 0);
    CHECK_EQ(cublasDotEx(h, 4, dev_a, CUDA_R_16BF, 1, dev_b, CUDA_R_16BF, 1, &dr, CUDA_R_8I,
                         CUDA_R_32F), BAD);

    /* rotg and rotmg: scalars on the host, zeros. */
    float a = 3, b = 4, c = 1, s = 1;
    CHECK_EQ(cublasSrotg(h, &a, &b, &c, &s), OK);
    CHECK(a == 0 && b == 0 && c == 0 && s == 0);
    double da = 3, db = 4, dc = 1, dsn = 1;
    CHECK_EQ(cublasDrotg(h, &da, &db, &dc, &dsn), OK);
    CHECK(da == 0 && dc == 0);
    cuComplex ca = {3, 3}, cb = {4, 4}, csn = {1, 1};
    float cc = 1;
    CHECK_EQ(cublasCrotg(h, &ca, &cb, &cc, &csn), OK);
    CHECK(ca.x == 0 && cc == 0 && csn.y == 0);
    cuDoubleComplex za = {3, 3}, zb = {4, 4}, zsn = {1, 1};
    double zc = 1;
    CHECK_EQ(cublasZrotg(h, &za, &zb, &zc, &zsn), OK);
    CHECK(za.x == 0 && zc == 0);
    float d1 = 1, d2 = 1, x1 = 1, y1 = 1;
    fparam[0] = 7;
    CHECK_EQ(cublasSrotmg(h, &d1, &d2, &x1, &y1, fparam), OK);
    CHECK(d1 == 0 && x1 == 0 && fparam[0] == 0);
    double dd1 = 1, dd2 = 1, dx1 = 1, dy1 = 1;
    dparam[4] = 7;
    CHECK_EQ(cublasDrotmg(h, &dd1, &dd2, &dx1, &dy1, dparam), OK);
    CHECK(dd2 == 0 && dparam[4] == 0);

    /* Device pointer mode: the result is device memory, left as it was. */
    CHECK_EQ(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_DEVICE), OK);
    float mark = 42, back = 0;
    cudaMemcpy(dev_c, &mark, sizeof mark, cudaMemcpyHostToDevice);
    CHECK_EQ(cublasSdot(h, 4, dev_a, 1, dev_b, 1, dev_c), OK);
    cudaMemcpy(&back, dev_c, sizeof back, cudaMemcpyDeviceToHost);
    CHECK(back == 42);
    CHECK_EQ(cublasDestroy(h), OK);
}

/* ---- cuBLASLt ------------------------------------------------------------ */

static void test_lt_descriptors(void)
{
    cublasLtMatmulDesc_t desc = NULL;
    CHECK_EQ(cublasLtMatmulDescCreate(NULL, CUBLAS_COMPUTE_32F, CUDA_R_32F), BAD);
    CHECK_EQ(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F), OK);
    int32_t i32 = -5;
    size_t written = 0;
    /* What was given at creation, and the defaults. */
    CHECK_EQ(cublasLtMatmulDescGetAttribute(desc, CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, &i32,
                                            sizeof i32, &written), OK);
    CHECK_EQ(i32, CUBLAS_COMPUTE_32F_FAST_TF32);
    CHECK_EQ(written, 4);
    uint32_t epilogue = 0;
    CHECK_EQ(cublasLtMatmulDescGetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                            sizeof epilogue, NULL), OK);
    CHECK_EQ(epilogue, CUBLASLT_EPILOGUE_DEFAULT);
    CHECK_EQ(cublasLtMatmulDescGetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &i32,
                                            sizeof i32, NULL), OK);
    CHECK_EQ(i32, -1);
    /* Set, then read back: an operation, a pointer, a one-byte flag. */
    int32_t op = CUBLAS_OP_T;
    CHECK_EQ(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op, sizeof op), OK);
    CHECK_EQ(cublasLtMatmulDescGetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &i32, sizeof i32,
                                            NULL), OK);
    CHECK_EQ(i32, CUBLAS_OP_T);
    void *bias = dev_a, *got = NULL;
    CHECK_EQ(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                            sizeof bias), OK);
    CHECK_EQ(cublasLtMatmulDescGetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &got,
                                            sizeof got, &written), OK);
    CHECK(got == bias);
    CHECK_EQ(written, 8);
    int8_t fast = 1, fast_back = 0;
    CHECK_EQ(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, 1), OK);
    CHECK_EQ(cublasLtMatmulDescGetAttribute(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast_back, 1,
                                            NULL), OK);
    CHECK_EQ(fast_back, 1);
    /* The size asked for, without a buffer. */
    written = 0;
    CHECK_EQ(cublasLtMatmulDescGetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, NULL, 0,
                                            &written), OK);
    CHECK_EQ(written, 8);
    /* cuBLASLt refuses a value of another size, and an unknown attribute. */
    int64_t i64 = CUBLAS_OP_N;
    CHECK_EQ(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &i64, sizeof i64),
             BAD);
    CHECK_EQ(cublasLtMatmulDescGetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &i64, sizeof i64,
                                            NULL), BAD);
    CHECK_EQ(cublasLtMatmulDescSetAttribute(desc, (cublasLtMatmulDescAttributes_t)999, &op,
                                            sizeof op), BAD);
    CHECK_EQ(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, NULL, 4), BAD);
    CHECK_EQ(cublasLtMatmulDescGetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, NULL, 0, NULL), BAD);

    cublasLtMatrixLayout_t layout = NULL;
    CHECK_EQ(cublasLtMatrixLayoutCreate(&layout, CUDA_R_16BF, 64, 32, 64), OK);
    uint64_t u64 = 0;
    CHECK_EQ(cublasLtMatrixLayoutGetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_COLS, &u64,
                                              sizeof u64, NULL), OK);
    CHECK_EQ(u64, 32);
    uint32_t type = 0;
    CHECK_EQ(cublasLtMatrixLayoutGetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_TYPE, &type,
                                              sizeof type, NULL), OK);
    CHECK_EQ(type, CUDA_R_16BF);
    CHECK_EQ(cublasLtMatrixLayoutGetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &i32,
                                              sizeof i32, NULL), OK);
    CHECK_EQ(i32, 1);
    int32_t batches = 8;
    int64_t stride = 4096, stride_back = 0;
    CHECK_EQ(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batches,
                                              sizeof batches), OK);
    CHECK_EQ(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                              &stride, sizeof stride), OK);
    CHECK_EQ(cublasLtMatrixLayoutGetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                              &stride_back, sizeof stride_back, NULL), OK);
    CHECK_EQ(stride_back, 4096);
    CHECK_EQ(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &stride,
                                              sizeof stride), BAD);
    CHECK_EQ(cublasLtMatrixLayoutCreate(&layout, CUDA_R_16BF, 64, 32, -1), BAD);

    cublasLtMatmulPreference_t pref = NULL;
    CHECK_EQ(cublasLtMatmulPreferenceCreate(NULL), BAD);
    CHECK_EQ(cublasLtMatmulPreferenceCreate(&pref), OK);
    uint32_t align = 0;
    CHECK_EQ(cublasLtMatmulPreferenceGetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                  &align, sizeof align, NULL), OK);
    CHECK_EQ(align, 256);
    uint64_t ws = 1 << 20, ws_back = 0;
    CHECK_EQ(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &ws, sizeof ws), OK);
    CHECK_EQ(cublasLtMatmulPreferenceGetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &ws_back, sizeof ws_back, &written), OK);
    CHECK_EQ(ws_back, 1 << 20);
    CHECK_EQ(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &align, sizeof align), BAD);

    /* A descriptor of one kind is not one of another. */
    CHECK_EQ(cublasLtMatrixLayoutSetAttribute((cublasLtMatrixLayout_t)desc,
                                              CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batches,
                                              sizeof batches), BAD);
    CHECK_EQ(cublasLtMatmulPreferenceDestroy((cublasLtMatmulPreference_t)layout), BAD);
    CHECK_EQ(cublasLtMatmulDescDestroy(desc), OK);
    CHECK_EQ(cublasLtMatrixLayoutDestroy(layout), OK);
    CHECK_EQ(cublasLtMatmulPreferenceDestroy(pref), OK);
    CHECK_EQ(cublasLtMatmulDescDestroy(NULL), BAD);
}

/* PyTorch's path: a cuBLAS handle cast to a cuBLASLt one, the heuristic
 * (one result, no workspace), then the matmul. */
static void test_lt_matmul(void)
{
    vg_fakecuda_reset();
    cublasLtHandle_t lt = NULL;
    CHECK_EQ(cublasLtCreate(NULL), BAD);
    CHECK_EQ(cublasLtCreate(&lt), OK);
    cublasHandle_t blas = new_handle();
    CHECK(blas != NULL);
    cublasLtHandle_t handles[2] = {lt, (cublasLtHandle_t)blas};

    cublasLtMatmulDesc_t desc = NULL;
    cublasLtMatrixLayout_t a = NULL, b = NULL, c = NULL, wrong = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    CHECK_EQ(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), OK);
    int32_t t = CUBLAS_OP_T;
    CHECK_EQ(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t), OK);
    /* op(A) = A^T is 16 x 8 (A stored 8 x 16), B 8 x 4, C and D 16 x 4. */
    CHECK_EQ(cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, 8, 16, 8), OK);
    CHECK_EQ(cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, 8, 4, 8), OK);
    CHECK_EQ(cublasLtMatrixLayoutCreate(&c, CUDA_R_16BF, 16, 4, 16), OK);
    CHECK_EQ(cublasLtMatrixLayoutCreate(&wrong, CUDA_R_16BF, 16, 5, 16), OK);
    CHECK_EQ(cublasLtMatmulPreferenceCreate(&pref), OK);
    float one = 1, zero = 0;

    for (int i = 0; i < 2; i++) {
        cublasLtHandle_t h = handles[i];
        cublasLtMatmulHeuristicResult_t results[4];
        memset(results, 0x5a, sizeof results);
        int returned = -1;
        CHECK_EQ(cublasLtMatmulAlgoGetHeuristic(h, desc, a, b, c, c, pref, 4, results, &returned),
                 OK);
        CHECK_EQ(returned, 1);
        CHECK_EQ(results[0].state, OK);
        CHECK_EQ(results[0].workspaceSize, 0);
        CHECK(results[0].wavesCount == 1.0f);
        CHECK_EQ(cublasLtMatmulAlgoGetHeuristic(h, desc, a, b, c, wrong, pref, 1, results,
                                                &returned), BAD);
        CHECK_EQ(cublasLtMatmulAlgoGetHeuristic(h, desc, a, b, c, c, pref, 0, results,
                                                &returned), BAD);
        CHECK_EQ(cublasLtMatmul(h, desc, &one, dev_a, a, dev_b, b, &zero, dev_c, c, dev_c, c,
                                &results[0].algo, dev_a, 4096, NULL), OK);
        CHECK_EQ(cublasLtMatmul(h, desc, &one, dev_a, a, dev_b, b, &zero, dev_c, c, dev_c, c,
                                NULL, NULL, 0, NULL), OK);
        CHECK_EQ(cublasLtMatmul(h, desc, &one, dev_a, a, dev_b, b, &zero, dev_c, c, dev_c, wrong,
                                NULL, NULL, 0, NULL), BAD);
        CHECK_EQ(cublasLtMatmul(h, desc, &one, dev_a, a, dev_b, b, &zero, dev_c, c, dev_c, c,
                                NULL, NULL, 64, NULL), BAD);
        cublasLtMatmulHeuristicResult_t checked;
        memset(&checked, 0x5a, sizeof checked);
        CHECK_EQ(cublasLtMatmulAlgoCheck(h, desc, a, b, c, c, &results[0].algo, &checked), OK);
        CHECK_EQ(checked.state, OK);
        CHECK_EQ(checked.workspaceSize, 0);
        CHECK_EQ(cublasLtMatmulAlgoCheck(h, desc, a, b, c, c, NULL, &checked), BAD);
    }
    vg_fakecuda_set_sticky_error(700);
    CHECK_EQ(cublasLtMatmul(lt, desc, &one, dev_a, a, dev_b, b, &zero, dev_c, c, dev_c, c, NULL,
                            NULL, 0, NULL), CUBLAS_STATUS_EXECUTION_FAILED);
    vg_fakecuda_set_sticky_error(0);
    cudaGetLastError();
    CHECK_EQ(cublasLtMatmul(NULL, desc, &one, dev_a, a, dev_b, b, &zero, dev_c, c, dev_c, c,
                            NULL, NULL, 0, NULL), CUBLAS_STATUS_NOT_INITIALIZED);

    /* A cuBLAS handle is cublasDestroy's to destroy. */
    CHECK_EQ(cublasLtDestroy((cublasLtHandle_t)blas), CUBLAS_STATUS_NOT_INITIALIZED);
    CHECK_EQ(cublasLtDestroy(lt), OK);
    CHECK_EQ(cublasDestroy(blas), OK);
    cublasLtMatmulDescDestroy(desc);
    cublasLtMatrixLayoutDestroy(a);
    cublasLtMatrixLayoutDestroy(b);
    cublasLtMatrixLayoutDestroy(c);
    cublasLtMatrixLayoutDestroy(wrong);
    cublasLtMatmulPreferenceDestroy(pref);
}

/* ---- work: the FLOPs of a known GEMM sequence --------------------------- */

static void test_gemm_work(void)
{
    vg_fakecuda_reset();
    CHECK_EQ(vg_fakecuda_gemm_flops(), 0);
    CHECK_EQ(vg_fakecuda_gemm_calls(), 0);
    cublasHandle_t h = new_handle();
    CHECK(h != NULL);
    float one = 1.0f;
    /* 4 x 3 x 2: 2*4*3*2 = 48 */
    CHECK_EQ(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 3, 2, &one, dev_a, 4, dev_b, 2, &one,
                         dev_c, 4), OK);
    CHECK_EQ(vg_fakecuda_gemm_flops(), 48);
    /* three of them, strided: 3 * 48 */
    CHECK_EQ(cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 3, 2, &one, dev_a,
                                        CUDA_R_16BF, 4, 8, dev_b, CUDA_R_16BF, 2, 6, &one, dev_c,
                                        CUDA_R_16BF, 4, 12, 3, CUBLAS_COMPUTE_32F,
                                        CUBLAS_GEMM_DEFAULT), OK);
    CHECK_EQ(vg_fakecuda_gemm_flops(), 48 + 144);
    /* complex: four real multiplies and four adds per term, 8*4*3*2 = 192 */
    cuComplex cone = {1.0f, 0.0f};
    CHECK_EQ(cublasCgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 3, 2, &cone, dev_a, 4, dev_b, 2, &cone,
                         dev_c, 4), OK);
    CHECK_EQ(vg_fakecuda_gemm_flops(), 48 + 144 + 192);
    CHECK_EQ(vg_fakecuda_gemm_calls(), 3);
    /* refused, empty and failed calls count nothing */
    CHECK_EQ(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 3, 2, &one, dev_a, 1, dev_b, 2, &one,
                         dev_c, 4), BAD);
    CHECK_EQ(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 0, 3, 2, &one, dev_a, 4, dev_b, 2, &one,
                         dev_c, 4), OK);
    vg_fakecuda_set_sticky_error(700);
    CHECK_EQ(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 3, 2, &one, dev_a, 4, dev_b, 2, &one,
                         dev_c, 4), CUBLAS_STATUS_EXECUTION_FAILED);
    vg_fakecuda_set_sticky_error(0);
    cudaGetLastError();
    CHECK_EQ(vg_fakecuda_gemm_flops(), 48 + 144 + 192);
    CHECK_EQ(vg_fakecuda_gemm_calls(), 3);

    /* cuBLASLt: op(A) = A^T 16 x 8, B 8 x 4, in 5 batches: 2*16*4*8*5 = 5120 */
    cublasLtHandle_t lt = NULL;
    CHECK_EQ(cublasLtCreate(&lt), OK);
    cublasLtMatmulDesc_t desc = NULL;
    cublasLtMatrixLayout_t a = NULL, b = NULL, c = NULL;
    CHECK_EQ(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), OK);
    int32_t t = CUBLAS_OP_T, batches = 5;
    CHECK_EQ(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t), OK);
    CHECK_EQ(cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, 8, 16, 8), OK);
    CHECK_EQ(cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, 8, 4, 8), OK);
    CHECK_EQ(cublasLtMatrixLayoutCreate(&c, CUDA_R_16BF, 16, 4, 16), OK);
    cublasLtMatrixLayout_t layouts[3] = {a, b, c};
    for (int i = 0; i < 3; i++)
        CHECK_EQ(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                  &batches, sizeof batches), OK);
    float zero = 0;
    CHECK_EQ(cublasLtMatmul(lt, desc, &one, dev_a, a, dev_b, b, &zero, dev_c, c, dev_c, c, NULL,
                            NULL, 0, NULL), OK);
    CHECK_EQ(vg_fakecuda_gemm_flops(), 48 + 144 + 192 + 5120);
    CHECK_EQ(vg_fakecuda_gemm_calls(), 4);
    vg_fakecuda_reset();
    CHECK_EQ(vg_fakecuda_gemm_flops(), 0);
    CHECK_EQ(vg_fakecuda_gemm_calls(), 0);
    cublasLtMatmulDescDestroy(desc);
    cublasLtMatrixLayoutDestroy(a);
    cublasLtMatrixLayoutDestroy(b);
    cublasLtMatrixLayoutDestroy(c);
    CHECK_EQ(cublasLtDestroy(lt), OK);
    CHECK_EQ(cublasDestroy(h), OK);
}

static void test_lt_algos(void)
{
    cublasLtHandle_t lt = NULL;
    CHECK_EQ(cublasLtCreate(&lt), OK);
    cublasLtMatmulAlgo_t algo;
    CHECK_EQ(cublasLtMatmulAlgoInit(lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F,
                                    CUDA_R_32F, CUDA_R_32F, 21, &algo), OK);
    CHECK_EQ(cublasLtMatmulAlgoInit(lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F,
                                    CUDA_R_32F, CUDA_R_32F, -1, &algo), BAD);
    CHECK_EQ(cublasLtMatmulAlgoInit(NULL, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F,
                                    CUDA_R_32F, CUDA_R_32F, 0, &algo), CUBLAS_STATUS_NOT_INITIALIZED);
    int32_t id = -1, splits = 0;
    size_t written = 0;
    CHECK_EQ(cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id,
                                                  &written), OK);
    CHECK_EQ(id, 21);
    CHECK_EQ(written, 4);
    CHECK_EQ(cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits,
                                                  sizeof splits, NULL), OK);
    CHECK_EQ(splits, 1);
    /* The id is read-only; the rest round-trip at their own sizes, and the
     * algorithm carries them when copied. */
    CHECK_EQ(cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id),
             BAD);
    splits = 4;
    CHECK_EQ(cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits,
                                                  sizeof splits), OK);
    uint16_t cluster = 3, cluster_back = 0;
    CHECK_EQ(cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID,
                                                  &cluster, sizeof cluster), OK);
    CHECK_EQ(cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID,
                                                  &splits, sizeof splits), BAD);
    cublasLtMatmulAlgo_t copy = algo;
    splits = 0;
    CHECK_EQ(cublasLtMatmulAlgoConfigGetAttribute(&copy, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits,
                                                  sizeof splits, NULL), OK);
    CHECK_EQ(splits, 4);
    CHECK_EQ(cublasLtMatmulAlgoConfigGetAttribute(&copy, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID,
                                                  &cluster_back, sizeof cluster_back, &written), OK);
    CHECK_EQ(cluster_back, 3);
    CHECK_EQ(written, 2);
    CHECK_EQ(cublasLtMatmulAlgoConfigGetAttribute(&copy, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID,
                                                  NULL, 0, &written), OK);
    CHECK_EQ(written, 2);
    CHECK_EQ(cublasLtMatmulAlgoConfigGetAttribute(&copy, CUBLASLT_ALGO_CONFIG_ID, &cluster_back,
                                                  sizeof cluster_back, NULL), BAD);
    CHECK_EQ(cublasLtMatmulAlgoConfigGetAttribute(&copy, (cublasLtMatmulAlgoConfigAttributes_t)99,
                                                  &id, sizeof id, NULL), BAD);

    size_t capacity = 0;
    CHECK_EQ(cublasLtHeuristicsCacheSetCapacity(123), OK);
    CHECK_EQ(cublasLtHeuristicsCacheGetCapacity(&capacity), OK);
    CHECK_EQ(capacity, 123);
    CHECK_EQ(cublasLtHeuristicsCacheGetCapacity(NULL), BAD);
    CHECK_EQ(cublasLtDestroy(lt), OK);
}

/* ---- stubs ------------------------------------------------------------- */

/* A function the stand-in does not model refuses, is counted with the
 * fake's other stubs, and names itself on stderr once. */
static void test_stubs(void)
{
    vg_fakecuda_reset();
    cublasHandle_t h = new_handle();
    CHECK(h != NULL);
    fflush(stderr);
    FILE *capture = tmpfile();
    CHECK(capture != NULL);
    int saved = dup(2);
    dup2(fileno(capture), 2);
    float result = 0;
    cublasStatus_t first = cublasSnrm2_64(h, 4, dev_a, 1, &result);
    cublasStatus_t second = cublasSnrm2_64(h, 4, dev_a, 1, &result);
    cublasStatus_t lt = cublasLtMatrixTransform(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                                                NULL, NULL, NULL);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    CHECK_EQ(first, CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK_EQ(second, CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK_EQ(lt, CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK_EQ(vg_fakecuda_unsupported_calls(), 3);
    CHECK(strcmp(vg_fakecuda_last_unsupported(), "cublasLtMatrixTransform") == 0);
    char text[1024] = {0};
    rewind(capture);
    size_t n = fread(text, 1, sizeof text - 1, capture);
    fclose(capture);
    CHECK(n > 0);
    const char *one = strstr(text, "cublasSnrm2_v2_64 is not modelled");
    CHECK(one != NULL);
    CHECK(strstr(one + 1, "cublasSnrm2_v2_64") == NULL); /* said once */
    CHECK(strstr(text, "cublasLtMatrixTransform is not modelled") != NULL);
    CHECK_EQ(cublasDestroy(h), OK);
}

/* ---- other configurations, in a child process -------------------------- */

/* Before Hopper cuBLAS's default workspace is 4 MiB; VG_FAKECUDA_CUBLAS_HANDLE
 * sets what a handle takes; on a phantom (device memory without host pages)
 * nothing here touches device memory. */
static int child(const char *what)
{
    cublasHandle_t h = NULL;
    cudaSetDevice(0);
    long long before = vg_fakecuda_bytes_in_use(0);
    if (cublasCreate(&h) != OK)
        return 2;
    long long workspace = vg_fakecuda_bytes_in_use(0) - before;
    if (strcmp(what, "--ampere") == 0 || strcmp(what, "--knob") == 0) {
        long long want = (long long)(what[2] == 'a' ? 4 * MiB : 68 * MiB);
        return cublasDestroy(h) == OK && workspace == want ? 0 : 3;
    }
    void *a = NULL;
    float one = 1, result = 5;
    if (cudaMalloc(&a, 4096) != cudaSuccess)
        return 4;
    if (cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &one, a, 8, a, 8, &one, a, 8) != OK ||
        cublasSdot(h, 8, a, 1, a, 1, &result) != OK || result != 0)
        return 5;
    cublasSetPointerMode(h, CUBLAS_POINTER_MODE_DEVICE);
    if (cublasSnrm2(h, 8, a, 1, a) != OK)
        return 6;
    return cublasDestroy(h) == OK ? 0 : 7;
}

static void test_other_devices(void)
{
    CHECK_EQ(rerun("VG_FAKECUDA_CC=8.6", "--ampere"), 0);
    CHECK_EQ(rerun("VG_FAKECUDA_CUBLAS_HANDLE=68MiB", "--knob"), 0);
    CHECK(rerun("VG_FAKECUDA_CUBLAS_HANDLE=lots", "--knob 2>/dev/null") >= 128);
    CHECK_EQ(rerun("VG_FAKECUDA_PHANTOM=1", "--phantom"), 0);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strncmp(argv[1], "--", 2) == 0)
        return child(argv[1]);
    /* Before the first CUDA call, which reads them. */
    setenv("VG_FAKECUDA_DEVICES", "2", 1);
    setenv("VG_FAKECUDA_MEM", "1GiB,512MiB", 1);
    setup_buffers();
    static const harness_test tests[] = {
        {"handle", test_handle},
        {"handle_devices_and_oom", test_handle_devices_and_oom},
        {"versions_and_status", test_versions_and_status},
        {"transfers", test_transfers},
        {"gemm", test_gemm},
        {"level3_and_solvers", test_level3_and_solvers},
        {"level2", test_level2},
        {"level1", test_level1},
        {"lt_descriptors", test_lt_descriptors},
        {"lt_matmul", test_lt_matmul},
        {"lt_algos", test_lt_algos},
        {"gemm_work", test_gemm_work},
        {"stubs", test_stubs},
        {"other_devices", test_other_devices},
    };
    return harness_run(tests, sizeof tests / sizeof tests[0], argc > 1 ? argv[1] : NULL);
}
