/* cuBLAS stand-in: handles and what is set on them (stream, workspace,
 * pointer/atomics/math modes, SM count target), versions, status names, and
 * the host <-> device transfers of matrices and vectors, which are copies
 * and so are done (through the fake runtime's cudaMemcpy2DAsync).
 *
 * A handle holds device memory as the real one does: cublasCreate allocates
 * it on the current device, outside PyTorch's allocator, so that
 * mem_get_info() shows it as on a GPU. By default that is cuBLAS's default
 * workspace, the size cuBLAS's documentation gives for the device's
 * architecture (32 MiB from Hopper on, 4 MiB before); a real handle holds
 * more (kernels, internal buffers: 68 MiB in all at cublasCreate on an
 * H200 with cuBLAS 13.0), which VG_FAKECUDA_CUBLAS_HANDLE sets. It is taken
 * from the driver (cuMemAlloc), as the real library's own static runtime
 * would take it: the runtime's counters keep counting only the
 * application's calls.
 */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "core.h"
#include "cublas_fake.h"

cublasStatus_t vgcb_check_handle(cublasHandle_t handle)
{
    return vgcb_is_handle(handle, 0) ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED;
}

#define CHECK_HANDLE(h)                                                          \
    do {                                                                         \
        cublasStatus_t check_ = vgcb_check_handle(h);                            \
        if (check_ != CUBLAS_STATUS_SUCCESS)                                     \
            return check_;                                                       \
    } while (0)

static size_t handle_bytes_knob; /* 0: by architecture */
static pthread_once_t knob_once = PTHREAD_ONCE_INIT;

/* Malformed, it stops the process, as the fake's other knobs do. */
static void read_knob(void)
{
    const char *text = getenv("VG_FAKECUDA_CUBLAS_HANDLE");
    if (text && *text && (vgfc_parse_size(text, &handle_bytes_knob) != 0 || !handle_bytes_knob)) {
        fprintf(stderr, "vg_fakecuda: VG_FAKECUDA_CUBLAS_HANDLE=\"%s\": want a size like 68MiB\n",
                text);
        abort();
    }
}

static size_t default_workspace_size(int dev)
{
    pthread_once(&knob_once, read_knob);
    if (handle_bytes_knob)
        return handle_bytes_knob;
    int major = 0;
    if (cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev))
        return 4u << 20;
    return major >= 9 ? 32u << 20 : 4u << 20;
}

/* The current device, with a current context to allocate in: the
 * application's (PyTorch has one by then), else the device's primary
 * context, made current as cuBLAS's own runtime would. */
static cublasStatus_t current_device(int *dev)
{
    if (cudaGetDevice(dev) != cudaSuccess)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    CUcontext ctx = NULL;
    if (cuCtxGetCurrent(&ctx) != CUDA_SUCCESS)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!ctx && (cuDevicePrimaryCtxRetain(&ctx, *dev) != CUDA_SUCCESS ||
                 cuCtxSetCurrent(ctx) != CUDA_SUCCESS))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasCreate_v2(cublasHandle_t *handle)
{
    vgcb_trace(__func__);
    if (!handle)
        return CUBLAS_STATUS_INVALID_VALUE;
    *handle = NULL;
    int dev;
    cublasStatus_t st = current_device(&dev);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    struct cublasContext *h = calloc(1, sizeof *h);
    if (!h)
        return CUBLAS_STATUS_ALLOC_FAILED;
    h->device = dev;
    h->pointer_mode = CUBLAS_POINTER_MODE_HOST;
    h->atomics_mode = CUBLAS_ATOMICS_NOT_ALLOWED;
    h->math_mode = CUBLAS_DEFAULT_MATH;
    h->default_workspace_size = default_workspace_size(dev);
    /* A full device fails here, as on a GPU: PyTorch then reports
     * CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate(handle). */
    CUdeviceptr ws;
    if (cuMemAlloc(&ws, h->default_workspace_size) != CUDA_SUCCESS) {
        free(h);
        return CUBLAS_STATUS_ALLOC_FAILED;
    }
    h->default_workspace = (void *)(uintptr_t)ws;
    h->magic = VGCB_MAGIC_BLAS;
    *handle = h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t handle)
{
    CHECK_HANDLE(handle);
    cuMemFree((CUdeviceptr)(uintptr_t)handle->default_workspace);
    handle->magic = 0; /* a later use is refused, not a use of freed state */
    free(handle);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetVersion_v2(cublasHandle_t handle, int *version)
{
    (void)handle; /* cuBLAS answers without a handle too */
    if (!version)
        return CUBLAS_STATUS_INVALID_VALUE;
    *version = CUBLAS_VERSION;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetProperty(libraryPropertyType type, int *value)
{
    return vgcb_property(type, value);
}

size_t cublasGetCudartVersion(void)
{
    return CUDART_VERSION;
}

const char *cublasGetStatusName(cublasStatus_t status)
{
    return vgcb_status_name(status);
}

const char *cublasGetStatusString(cublasStatus_t status)
{
    return vgcb_status_string(status);
}

/* ---- what is set on a handle ------------------------------------------ */

/* cuBLAS goes back to its default workspace on every stream change: the
 * caller binds its own again after (PyTorch does, when it caches them). */
cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream)
{
    CHECK_HANDLE(handle);
    handle->stream = stream;
    handle->workspace = NULL;
    handle->workspace_size = 0;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream_v2(cublasHandle_t handle, cudaStream_t *stream)
{
    CHECK_HANDLE(handle);
    if (!stream)
        return CUBLAS_STATUS_INVALID_VALUE;
    *stream = handle->stream;
    return CUBLAS_STATUS_SUCCESS;
}

/* cuBLAS refuses a workspace that is not aligned to 256 bytes: an allocator
 * that hands out less fails here, as it would on a GPU. */
cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, void *workspace, size_t size)
{
    vgcb_trace(__func__);
    CHECK_HANDLE(handle);
    if ((uintptr_t)workspace % 256 != 0 || (!workspace && size))
        return CUBLAS_STATUS_INVALID_VALUE;
    handle->workspace = workspace;
    handle->workspace_size = size;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t mode)
{
    CHECK_HANDLE(handle);
    if (mode != CUBLAS_POINTER_MODE_HOST && mode != CUBLAS_POINTER_MODE_DEVICE)
        return CUBLAS_STATUS_INVALID_VALUE;
    handle->pointer_mode = mode;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t *mode)
{
    CHECK_HANDLE(handle);
    if (!mode)
        return CUBLAS_STATUS_INVALID_VALUE;
    *mode = handle->pointer_mode;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetAtomicsMode(cublasHandle_t handle, cublasAtomicsMode_t mode)
{
    CHECK_HANDLE(handle);
    if (mode != CUBLAS_ATOMICS_NOT_ALLOWED && mode != CUBLAS_ATOMICS_ALLOWED)
        return CUBLAS_STATUS_INVALID_VALUE;
    handle->atomics_mode = mode;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetAtomicsMode(cublasHandle_t handle, cublasAtomicsMode_t *mode)
{
    CHECK_HANDLE(handle);
    if (!mode)
        return CUBLAS_STATUS_INVALID_VALUE;
    *mode = handle->atomics_mode;
    return CUBLAS_STATUS_SUCCESS;
}

/* PyTorch reads the math mode back to restore it around reduced-precision
 * GEMMs: any value is kept as given (the flags combine). */
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode)
{
    CHECK_HANDLE(handle);
    handle->math_mode = mode;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetMathMode(cublasHandle_t handle, cublasMath_t *mode)
{
    CHECK_HANDLE(handle);
    if (!mode)
        return CUBLAS_STATUS_INVALID_VALUE;
    *mode = handle->math_mode;
    return CUBLAS_STATUS_SUCCESS;
}

/* 0 means every SM (PyTorch's SM carveout sets and clears it). */
cublasStatus_t cublasSetSmCountTarget(cublasHandle_t handle, int sm_count_target)
{
    CHECK_HANDLE(handle);
    if (sm_count_target < 0)
        return CUBLAS_STATUS_INVALID_VALUE;
    handle->sm_count_target = sm_count_target;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetSmCountTarget(cublasHandle_t handle, int *sm_count_target)
{
    CHECK_HANDLE(handle);
    if (!sm_count_target)
        return CUBLAS_STATUS_INVALID_VALUE;
    *sm_count_target = handle->sm_count_target;
    return CUBLAS_STATUS_SUCCESS;
}

/* ---- host <-> device transfers ----------------------------------------- */

/* rows x cols elements, column-major with leading dimensions in elements:
 * one 2D copy. A copy the fake runtime refuses (memory that is not live
 * device memory) is cuBLAS's mapping error. */
static cublasStatus_t copy_matrix(int rows, int cols, int elem_size, const void *src, int ld_src,
                                  void *dst, int ld_dst, enum cudaMemcpyKind kind,
                                  cudaStream_t stream)
{
    if (rows < 0 || cols < 0 || elem_size <= 0 || ld_src <= 0 || ld_dst <= 0 ||
        ld_src < rows || ld_dst < rows)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (rows == 0 || cols == 0)
        return CUBLAS_STATUS_SUCCESS;
    size_t es = (size_t)elem_size;
    if (cudaMemcpy2DAsync(dst, (size_t)ld_dst * es, src, (size_t)ld_src * es, (size_t)rows * es,
                          (size_t)cols, kind, stream) != cudaSuccess)
        return CUBLAS_STATUS_MAPPING_ERROR;
    return CUBLAS_STATUS_SUCCESS;
}

/* A strided vector is a matrix of one-element columns, the stride its
 * leading dimension. */
static cublasStatus_t copy_vector(int n, int elem_size, const void *src, int inc_src, void *dst,
                                  int inc_dst, enum cudaMemcpyKind kind, cudaStream_t stream)
{
    if (n < 0 || inc_src <= 0 || inc_dst <= 0)
        return CUBLAS_STATUS_INVALID_VALUE;
    return copy_matrix(1, n, elem_size, src, inc_src, dst, inc_dst, kind, stream);
}

cublasStatus_t cublasSetMatrix(int rows, int cols, int elemSize, const void *A, int lda, void *B,
                               int ldb)
{
    return copy_matrix(rows, cols, elemSize, A, lda, B, ldb, cudaMemcpyHostToDevice, NULL);
}

cublasStatus_t cublasGetMatrix(int rows, int cols, int elemSize, const void *A, int lda, void *B,
                               int ldb)
{
    return copy_matrix(rows, cols, elemSize, A, lda, B, ldb, cudaMemcpyDeviceToHost, NULL);
}

cublasStatus_t cublasSetMatrixAsync(int rows, int cols, int elemSize, const void *A, int lda,
                                    void *B, int ldb, cudaStream_t stream)
{
    return copy_matrix(rows, cols, elemSize, A, lda, B, ldb, cudaMemcpyHostToDevice, stream);
}

cublasStatus_t cublasGetMatrixAsync(int rows, int cols, int elemSize, const void *A, int lda,
                                    void *B, int ldb, cudaStream_t stream)
{
    return copy_matrix(rows, cols, elemSize, A, lda, B, ldb, cudaMemcpyDeviceToHost, stream);
}

cublasStatus_t cublasSetVector(int n, int elemSize, const void *x, int incx, void *y, int incy)
{
    return copy_vector(n, elemSize, x, incx, y, incy, cudaMemcpyHostToDevice, NULL);
}

cublasStatus_t cublasGetVector(int n, int elemSize, const void *x, int incx, void *y, int incy)
{
    return copy_vector(n, elemSize, x, incx, y, incy, cudaMemcpyDeviceToHost, NULL);
}

cublasStatus_t cublasSetVectorAsync(int n, int elemSize, const void *hostPtr, int incx,
                                    void *devicePtr, int incy, cudaStream_t stream)
{
    return copy_vector(n, elemSize, hostPtr, incx, devicePtr, incy, cudaMemcpyHostToDevice,
                       stream);
}

cublasStatus_t cublasGetVectorAsync(int n, int elemSize, const void *devicePtr, int incx,
                                    void *hostPtr, int incy, cudaStream_t stream)
{
    return copy_vector(n, elemSize, devicePtr, incx, hostPtr, incy, cudaMemcpyDeviceToHost,
                       stream);
}
