/* What the cuBLAS and cuBLASLt stand-ins share (each links its own copy):
 * the landing point of their generated stubs, status names, the version
 * property, and the check a computing call makes before its "launch". */
#include <stdatomic.h>
#include <stdio.h>

#include "core.h"
#include "cublas_fake.h"

int vgcb_unsupported(const char *name, int *said)
{
    /* Counted and traced with the runtime's and the driver's stubs, so that
     * vg_fakecuda_unsupported_calls() and _last_unsupported() cover these. */
    vgfc_unsupported(name);
    /* Once per function: a training loop would otherwise print it per step.
     * Said whatever VG_FAKECUDA_TRACE is, because cuBLAS's failure reaches
     * the user as a bare CUBLAS_STATUS_NOT_SUPPORTED that names no call. */
    if (!atomic_exchange((_Atomic int *)said, 1))
        fprintf(stderr, "vg_fakecuda: %s is not modelled by the cuBLAS stand-in "
                        "(CUBLAS_STATUS_NOT_SUPPORTED)\n", name);
    return CUBLAS_STATUS_NOT_SUPPORTED;
}

const char *vgcb_status_name(cublasStatus_t status)
{
    switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}

const char *vgcb_status_string(cublasStatus_t status)
{
    switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR: return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR: return "error detected trying to check the license";
    }
    return "unknown error";
}

cublasStatus_t vgcb_property(libraryPropertyType type, int *value)
{
    if (!value)
        return CUBLAS_STATUS_INVALID_VALUE;
    switch (type) {
    case MAJOR_VERSION: *value = CUBLAS_VER_MAJOR; return CUBLAS_STATUS_SUCCESS;
    case MINOR_VERSION: *value = CUBLAS_VER_MINOR; return CUBLAS_STATUS_SUCCESS;
    case PATCH_LEVEL: *value = CUBLAS_VER_PATCH; return CUBLAS_STATUS_SUCCESS;
    }
    return CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t vgcb_launch(void)
{
    return vg_fakecuda_sticky_error() ? CUBLAS_STATUS_EXECUTION_FAILED : CUBLAS_STATUS_SUCCESS;
}

int vgcb_complex_type(cudaDataType t)
{
    switch (t) {
    case CUDA_C_16F: case CUDA_C_16BF: case CUDA_C_32F: case CUDA_C_64F:
    case CUDA_C_8I: case CUDA_C_8U: case CUDA_C_32I: case CUDA_C_32U:
        return 1;
    default:
        return 0;
    }
}

void vgcb_trace(const char *fn)
{
    if (vgfc_tracing())
        vgfc_trace("%s", fn);
}

int vgcb_is_handle(const void *handle, int lt_too)
{
    if (!handle)
        return 0;
    uint32_t magic = *(const uint32_t *)handle;
    return magic == VGCB_MAGIC_BLAS || (lt_too && magic == VGCB_MAGIC_LT);
}
