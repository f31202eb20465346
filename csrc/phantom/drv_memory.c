/* Driver API: plain device memory (cuMemAlloc/cuMemFree) over the same
 * fake memory as cudaMalloc, memory info, the small writes PyTorch does
 * through the driver (cuMemsetD32Async, cuStreamWriteValue32), and pointer
 * queries. Streams are ignored: work is done when the call returns.
 */
#include "drv.h"

#include <string.h>

/* The current context's device, or -1. */
static int current_device(void)
{
    return drv_ctx_device_or_current(NULL);
}

CUresult cuMemGetInfo(size_t *free_bytes, size_t *total)
{
    DRV_ENTER(cuMemGetInfo);
    int dev = current_device();
    if (dev < 0)
        return drv_error(CUDA_ERROR_INVALID_CONTEXT);
    if (!free_bytes || !total)
        return drv_error(CUDA_ERROR_INVALID_VALUE);
    size_t cap = vgfc_capacity(dev), used = vgfc_mem_used(dev);
    *total = cap;
    *free_bytes = used < cap ? cap - used : 0;
    return CUDA_SUCCESS;
}

CUresult cuMemAlloc(CUdeviceptr *dptr, size_t size)
{
    DRV_ENTER(cuMemAlloc);
    int dev = current_device();
    if (dev < 0)
        return drv_error(CUDA_ERROR_INVALID_CONTEXT);
    if (!dptr || size == 0)
        return drv_error(CUDA_ERROR_INVALID_VALUE);
    void *p;
    int err = vgfc_mem_alloc(dev, size, VGFC_MEM_DEVICE, &p);
    if (err)
        return drv_error(err);
    *dptr = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}

CUresult cuMemFree(CUdeviceptr dptr)
{
    DRV_ENTER(cuMemFree);
    return drv_error(vgfc_mem_free((void *)(uintptr_t)dptr, VGFC_MEM_DEVICE));
}

CUresult cuMemGetAddressRange(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
    DRV_ENTER(cuMemGetAddressRange);
    vgfc_range r;
    if (!vgfc_mem_find((void *)(uintptr_t)dptr, &r) ||
        (r.kind != VGFC_MEM_DEVICE && r.kind != VGFC_MEM_MAPPED))
        return drv_error(CUDA_ERROR_NOT_FOUND);
    if (pbase)
        *pbase = (CUdeviceptr)r.base;
    if (psize)
        *psize = r.size;
    return CUDA_SUCCESS;
}

CUresult cuMemsetD8(CUdeviceptr dst, unsigned char value, size_t n)
{
    DRV_ENTER(cuMemsetD8);
    void *p = (void *)(uintptr_t)dst;
    if (n && vgfc_mem_check_device(p, n, -1) != VGFC_SUCCESS)
        return drv_error(CUDA_ERROR_INVALID_VALUE);
    vgfc_fill(p, value, n);
    return CUDA_SUCCESS;
}

CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int value, size_t n, CUstream stream)
{
    DRV_ENTER(cuMemsetD32Async);
    (void)stream;
    uint32_t *p = (uint32_t *)(uintptr_t)dst;
    if (n > SIZE_MAX / 4 || (n && vgfc_mem_check_device(p, 4 * n, -1) != VGFC_SUCCESS))
        return drv_error(CUDA_ERROR_INVALID_VALUE);
    if (!vgfc_phantom()) /* a phantom's device memory has no bytes to set */
        for (size_t i = 0; i < n; i++)
            p[i] = value;
    return CUDA_SUCCESS;
}

CUresult cuStreamWriteValue32(CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags)
{
    DRV_ENTER(cuStreamWriteValue32);
    (void)stream;
    (void)flags;
    cuuint32_t *p = (cuuint32_t *)(uintptr_t)addr;
    if (vgfc_mem_check_device(p, sizeof *p, -1) != VGFC_SUCCESS)
        return drv_error(CUDA_ERROR_INVALID_VALUE);
    if (!vgfc_phantom())
        __atomic_store_n(p, value, __ATOMIC_SEQ_CST);
    return CUDA_SUCCESS;
}

static int memory_type(const vgfc_range *r)
{
    return r->device >= 0 ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
}

CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attr, CUdeviceptr ptr)
{
    DRV_ENTER(cuPointerGetAttribute);
    vgfc_range r;
    if (!data || !vgfc_mem_find((void *)(uintptr_t)ptr, &r))
        return drv_error(CUDA_ERROR_INVALID_VALUE);
    switch (attr) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
        *(CUcontext *)data = vgfc_primary_ctx(r.device >= 0 ? r.device : vgfc_current_device());
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned int *)data = (unsigned int)memory_type(&r);
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
        *(CUdeviceptr *)data = ptr;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        *(void **)data = r.device >= 0 ? NULL : (void *)(uintptr_t)ptr;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        *(int *)data = r.device >= 0 ? r.device : vgfc_current_device();
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        *(CUdeviceptr *)data = (CUdeviceptr)r.base;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
        *(size_t *)data = r.size;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
        *(int *)data = 0;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPED:
        *(int *)data = 1;
        return CUDA_SUCCESS;
    default:
        return drv_error(CUDA_ERROR_NOT_SUPPORTED);
    }
}
