/* Runtime API: device and pinned host memory, memory info, copies and
 * sets. Device pointers are host pointers into the fake device memory
 * (core_memory.c), so a copy is a memmove once both ends are checked (on a
 * phantom, vgfc_copy drops what goes to the device and reads zeros): a
 * device-side pointer must lie inside live device memory, else the call
 * fails with cudaErrorInvalidValue, as a real one does for a pointer it
 * does not know. Async calls complete before they return.
 *
 * During a stream capture (rt_graph.c) an async copy or set on a capturing
 * stream is checked, then recorded as a node instead of done; cudaMalloc,
 * cudaFree and the synchronous copies and sets (legacy-stream work that
 * waits for it) are refused as CUDA refuses them in the capture modes.
 */
#include "rt.h"

#include <stdint.h>
#include <string.h>

/* ---- allocation -------------------------------------------------------- */

static cudaError_t device_malloc(void **ptr, size_t size)
{
    if (!ptr)
        return rt_error(cudaErrorInvalidValue);
    int dev = rt_current_device();
    if (dev < 0)
        return rt_error(cudaErrorNoDevice);
    return rt_error(vgfc_mem_alloc(dev, size, VGFC_MEM_DEVICE, ptr));
}

static cudaError_t device_free(void *ptr)
{
    if (rt_current_device() < 0)
        return rt_error(cudaErrorNoDevice);
    if (!ptr)
        return cudaSuccess;
    return rt_error(vgfc_mem_free(ptr, VGFC_MEM_DEVICE));
}

cudaError_t cudaMalloc(void **ptr, size_t size)
{
    RT_ENTER(cudaMalloc);
    cudaError_t err = rt_capture_unsafe();
    return err ? err : device_malloc(ptr, size);
}

cudaError_t cudaFree(void *ptr)
{
    RT_ENTER(cudaFree);
    cudaError_t err = rt_capture_unsafe();
    return err ? err : device_free(ptr);
}

/* Captured, they are a node and happen at once: graph memory is not
 * modelled. */
cudaError_t cudaMallocAsync(void **ptr, size_t size, cudaStream_t stream)
{
    RT_ENTER(cudaMallocAsync);
    if (rt_stream_device(stream) < 0)
        return rt_error(cudaErrorInvalidResourceHandle);
    cudaError_t err;
    if (rt_capture_work(stream, cudaGraphNodeTypeMemAlloc, NULL, NULL, &err) && err)
        return err;
    return device_malloc(ptr, size);
}

cudaError_t cudaFreeAsync(void *ptr, cudaStream_t stream)
{
    RT_ENTER(cudaFreeAsync);
    if (rt_stream_device(stream) < 0)
        return rt_error(cudaErrorInvalidResourceHandle);
    cudaError_t err;
    if (rt_capture_work(stream, cudaGraphNodeTypeMemFree, NULL, NULL, &err) && err)
        return err;
    return device_free(ptr);
}

static cudaError_t host_alloc(void **ptr, size_t size)
{
    if (!ptr)
        return rt_error(cudaErrorInvalidValue);
    return rt_error(vgfc_mem_alloc(-1, size, VGFC_MEM_HOST, ptr));
}

cudaError_t cudaMallocHost(void **ptr, size_t size)
{
    RT_ENTER(cudaMallocHost);
    return host_alloc(ptr, size);
}

cudaError_t cudaHostAlloc(void **ptr, size_t size, unsigned int flags)
{
    RT_ENTER(cudaHostAlloc);
    (void)flags; /* portable, mapped, write-combined: all the same host memory */
    return host_alloc(ptr, size);
}

cudaError_t cudaFreeHost(void *ptr)
{
    RT_ENTER(cudaFreeHost);
    if (!ptr)
        return cudaSuccess;
    return rt_error(vgfc_mem_free(ptr, VGFC_MEM_HOST));
}

cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned int flags)
{
    RT_ENTER(cudaHostRegister);
    (void)flags;
    if (!ptr || size == 0)
        return rt_error(cudaErrorInvalidValue);
    return rt_error(vgfc_mem_register(ptr, size));
}

cudaError_t cudaHostUnregister(void *ptr)
{
    RT_ENTER(cudaHostUnregister);
    if (vgfc_mem_free(ptr, VGFC_MEM_REGISTERED) != VGFC_SUCCESS)
        return rt_error(cudaErrorHostMemoryNotRegistered);
    return cudaSuccess;
}

/* ---- unified memory ---------------------------------------------------
 * Host memory that programs read and write (bitsandbytes' paged optimizers
 * wrap it as a CPU tensor), counted per device apart from device memory
 * (core_memory.c). The devices answer as a Linux data-centre card does:
 * managed memory and concurrent managed access supported (core_attrs.c),
 * so prefetches and advice are taken; a prefetch is recorded, and moves
 * nothing. */

cudaError_t cudaMallocManaged(void **ptr, size_t size, unsigned int flags)
{
    RT_ENTER(cudaMallocManaged);
    if (!ptr || size == 0 || (flags != cudaMemAttachGlobal && flags != cudaMemAttachHost))
        return rt_error(cudaErrorInvalidValue);
    int dev = rt_current_device();
    if (dev < 0)
        return rt_error(cudaErrorNoDevice);
    return rt_error(vgfc_managed_alloc(dev, size, ptr));
}

/* A destination: a device ordinal, or cudaCpuDeviceId for the host (-1 to
 * the core). cudaErrorInvalidDevice for neither. */
static cudaError_t managed_target(int device, int *dev)
{
    if (device == cudaCpuDeviceId) {
        *dev = -1;
        return cudaSuccess;
    }
    if (!vgfc_valid_device(device))
        return cudaErrorInvalidDevice;
    *dev = device;
    return cudaSuccess;
}

/* The same from a location (CUDA 12.2's _v2 calls, CUDA 13's; 12.0 and 12.1
 * have neither, nor the host location types). */
#if CUDART_VERSION >= 12020
static cudaError_t location_target(struct cudaMemLocation location, int *dev)
{
    switch (location.type) {
    case cudaMemLocationTypeDevice:
        return location.id == cudaCpuDeviceId ? cudaErrorInvalidDevice : managed_target(location.id, dev);
    case cudaMemLocationTypeHost:
    case cudaMemLocationTypeHostNuma:
    case cudaMemLocationTypeHostNumaCurrent:
        *dev = -1;
        return cudaSuccess;
    default:
        return cudaErrorInvalidValue;
    }
}
#endif

static cudaError_t prefetch(const void *ptr, size_t count, cudaError_t target_err, int dev, unsigned flags,
                            cudaStream_t stream)
{
    if (rt_stream_device(stream) < 0)
        return rt_error(cudaErrorInvalidResourceHandle);
    if (target_err)
        return rt_error(target_err);
    if (flags != 0 || !ptr || count == 0)
        return rt_error(cudaErrorInvalidValue);
    return rt_error(vgfc_managed_prefetch(ptr, count, dev));
}

static cudaError_t advise(const void *ptr, size_t count, enum cudaMemoryAdvise advice, cudaError_t target_err)
{
    if (advice < cudaMemAdviseSetReadMostly || advice > cudaMemAdviseUnsetAccessedBy)
        return rt_error(cudaErrorInvalidValue);
    /* Read-mostly advice names no location; the others need one. */
    int needs_location = advice != cudaMemAdviseSetReadMostly && advice != cudaMemAdviseUnsetReadMostly;
    if (needs_location && target_err)
        return rt_error(target_err);
    if (!ptr || count == 0 || !vgfc_managed_contains(ptr, count))
        return rt_error(cudaErrorInvalidValue);
    return cudaSuccess;
}

#if CUDART_VERSION >= 13000
cudaError_t cudaMemPrefetchAsync(const void *ptr, size_t count, struct cudaMemLocation location,
                                 unsigned int flags, cudaStream_t stream)
{
    RT_ENTER(cudaMemPrefetchAsync);
    int dev = -1;
    cudaError_t target_err = location_target(location, &dev);
    return prefetch(ptr, count, target_err, dev, flags, stream);
}

cudaError_t cudaMemAdvise(const void *ptr, size_t count, enum cudaMemoryAdvise advice,
                          struct cudaMemLocation location)
{
    RT_ENTER(cudaMemAdvise);
    int dev;
    return advise(ptr, count, advice, location_target(location, &dev));
}
#else
cudaError_t cudaMemPrefetchAsync(const void *ptr, size_t count, int device, cudaStream_t stream)
{
    RT_ENTER(cudaMemPrefetchAsync);
    int dev = -1;
    cudaError_t target_err = managed_target(device, &dev);
    return prefetch(ptr, count, target_err, dev, 0, stream);
}

cudaError_t cudaMemAdvise(const void *ptr, size_t count, enum cudaMemoryAdvise advice, int device)
{
    RT_ENTER(cudaMemAdvise);
    int dev;
    return advise(ptr, count, advice, managed_target(device, &dev));
}

#if CUDART_VERSION >= 12020
cudaError_t cudaMemPrefetchAsync_v2(const void *ptr, size_t count, struct cudaMemLocation location,
                                    unsigned int flags, cudaStream_t stream)
{
    RT_ENTER(cudaMemPrefetchAsync_v2);
    int dev = -1;
    cudaError_t target_err = location_target(location, &dev);
    return prefetch(ptr, count, target_err, dev, flags, stream);
}

cudaError_t cudaMemAdvise_v2(const void *ptr, size_t count, enum cudaMemoryAdvise advice,
                             struct cudaMemLocation location)
{
    RT_ENTER(cudaMemAdvise_v2);
    int dev;
    return advise(ptr, count, advice, location_target(location, &dev));
}
#endif
#endif

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total)
{
    RT_ENTER(cudaMemGetInfo);
    if (!free_bytes || !total)
        return rt_error(cudaErrorInvalidValue);
    int dev = rt_current_device();
    if (dev < 0)
        return rt_error(cudaErrorNoDevice);
    size_t cap = vgfc_capacity(dev), used = vgfc_mem_used(dev);
    *total = cap;
    *free_bytes = used < cap ? cap - used : 0;
    return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attrs, const void *ptr)
{
    RT_ENTER(cudaPointerGetAttributes);
    if (!attrs)
        return rt_error(cudaErrorInvalidValue);
    memset(attrs, 0, sizeof *attrs);
    vgfc_range r;
    if (!vgfc_mem_find(ptr, &r)) {
        attrs->type = cudaMemoryTypeUnregistered;
        attrs->device = -2; /* what the real runtime reports for plain host memory */
    } else if (r.kind == VGFC_MEM_MANAGED) {
        attrs->type = cudaMemoryTypeManaged;
        attrs->device = r.home;
        attrs->devicePointer = (void *)ptr;
        attrs->hostPointer = (void *)ptr;
    } else if (r.device >= 0) {
        attrs->type = cudaMemoryTypeDevice;
        attrs->device = r.device;
        attrs->devicePointer = (void *)ptr;
    } else {
        attrs->type = cudaMemoryTypeHost;
        attrs->device = vgfc_current_device();
        attrs->devicePointer = (void *)ptr;
        attrs->hostPointer = (void *)ptr;
    }
    return cudaSuccess;
}

/* ---- copies and sets --------------------------------------------------- */

/* Whether the end of a copy `kind` says is on the device, or (Default) the
 * memory table does, lies in device memory: 0, or cudaErrorInvalidValue.
 * *on_device: where the end turned out to be. */
static int check_end(const void *ptr, size_t size, int *on_device, int inferred)
{
    vgfc_range r;
    /* Managed memory serves as either end, and is host memory to a copy:
     * its bytes are real on a phantom too. */
    if (size && vgfc_managed_contains(ptr, size)) {
        *on_device = 0;
        return VGFC_SUCCESS;
    }
    if (inferred)
        *on_device = vgfc_mem_find(ptr, &r) && r.device >= 0;
    return *on_device ? vgfc_mem_check_device(ptr, size, -1) : VGFC_SUCCESS;
}

/* Which ends of a copy are device memory, once both are checked. */
struct ends {
    int dst_dev, src_dev;
};

static cudaError_t check_copy(void *dst, const void *src, size_t span_dst, size_t span_src,
                              enum cudaMemcpyKind kind, struct ends *ends)
{
    if ((unsigned)kind > cudaMemcpyDefault)
        return rt_error(cudaErrorInvalidMemcpyDirection);
    int inferred = kind == cudaMemcpyDefault;
    ends->dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    ends->src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if ((span_dst || span_src) && (!dst || !src))
        return rt_error(cudaErrorInvalidValue);
    if (check_end(dst, span_dst, &ends->dst_dev, inferred) || check_end(src, span_src, &ends->src_dev, inferred))
        return rt_error(cudaErrorInvalidValue);
    return cudaSuccess;
}

/* A synchronous call's work goes to the legacy stream, and waits for it:
 * 1 when a capture refuses it (*err says why). */
static int sync_refused(cudaError_t *err)
{
    *err = rt_capture_unsafe();
    return *err || rt_capture_work(cudaStreamLegacy, cudaGraphNodeTypeEmpty, NULL, NULL, err);
}

/* The copy or set on `stream`, once checked: 1 when a capture took it (or
 * refused it: *err). The synchronous calls pass NULL. */
static int captured(cudaStream_t stream, enum cudaGraphNodeType type, cudaError_t *err)
{
    if (stream == NULL)
        return sync_refused(err);
    return rt_capture_work(stream, type, NULL, NULL, err);
}

static cudaError_t copy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, int sync,
                        cudaStream_t stream)
{
    struct ends ends;
    cudaError_t err = n ? check_copy(dst, src, n, n, kind, &ends) : cudaSuccess;
    if (err == cudaSuccess && !captured(sync ? NULL : stream, cudaGraphNodeTypeMemcpy, &err) && n)
        vgfc_copy(dst, src, n, ends.dst_dev, ends.src_dev);
    return err;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind)
{
    RT_ENTER(cudaMemcpy);
    return copy(dst, src, n, kind, 1, NULL);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
                            cudaStream_t stream)
{
    RT_ENTER(cudaMemcpyAsync);
    if (rt_stream_device(stream) < 0)
        return rt_error(cudaErrorInvalidResourceHandle);
    return copy(dst, src, n, kind, 0, stream ? stream : cudaStreamLegacy);
}

static cudaError_t copy_2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                           size_t height, enum cudaMemcpyKind kind, cudaStream_t stream)
{
    if (width == 0 || height == 0)
        return cudaSuccess;
    if (width > dpitch || width > spitch)
        return rt_error(cudaErrorInvalidPitchValue);
    /* Both ends span from their first byte to the last row's end; a span
     * past the address space is no memory at all. */
    if (height - 1 > (SIZE_MAX - width) / dpitch || height - 1 > (SIZE_MAX - width) / spitch)
        return rt_error(cudaErrorInvalidValue);
    struct ends ends;
    cudaError_t err = check_copy(dst, src, (height - 1) * dpitch + width, (height - 1) * spitch + width, kind,
                                 &ends);
    if (err != cudaSuccess || captured(stream, cudaGraphNodeTypeMemcpy, &err))
        return err;
    for (size_t row = 0; row < height; row++)
        vgfc_copy((char *)dst + row * dpitch, (const char *)src + row * spitch, width, ends.dst_dev, ends.src_dev);
    return cudaSuccess;
}

cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                         size_t height, enum cudaMemcpyKind kind)
{
    RT_ENTER(cudaMemcpy2D);
    return copy_2d(dst, dpitch, src, spitch, width, height, kind, NULL);
}

cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                              size_t height, enum cudaMemcpyKind kind, cudaStream_t stream)
{
    RT_ENTER(cudaMemcpy2DAsync);
    if (rt_stream_device(stream) < 0)
        return rt_error(cudaErrorInvalidResourceHandle);
    return copy_2d(dst, dpitch, src, spitch, width, height, kind, stream ? stream : cudaStreamLegacy);
}

/* Each end must be memory of the device named for it. */
cudaError_t cudaMemcpyPeerAsync(void *dst, int dst_dev, const void *src, int src_dev, size_t n,
                                cudaStream_t stream)
{
    RT_ENTER(cudaMemcpyPeerAsync);
    if (rt_stream_device(stream) < 0)
        return rt_error(cudaErrorInvalidResourceHandle);
    if (!vgfc_valid_device(dst_dev) || !vgfc_valid_device(src_dev))
        return rt_error(cudaErrorInvalidDevice);
    if (n == 0)
        return cudaSuccess;
    if (vgfc_mem_check_device(dst, n, dst_dev) || vgfc_mem_check_device(src, n, src_dev))
        return rt_error(cudaErrorInvalidValue);
    cudaError_t err;
    if (!captured(stream ? stream : cudaStreamLegacy, cudaGraphNodeTypeMemcpy, &err))
        vgfc_copy(dst, src, n, 1, 1);
    return err;
}

static cudaError_t set(void *dst, int value, size_t n, cudaStream_t stream)
{
    int managed = n && vgfc_managed_contains(dst, n);
    if (n && !managed && vgfc_mem_check_device(dst, n, -1) != VGFC_SUCCESS)
        return rt_error(cudaErrorInvalidValue);
    cudaError_t err;
    if (!captured(stream, cudaGraphNodeTypeMemset, &err)) {
        if (managed)
            memset(dst, value, n); /* host memory, real on a phantom too */
        else
            vgfc_fill(dst, value, n);
    }
    return err;
}

cudaError_t cudaMemset(void *dst, int value, size_t n)
{
    RT_ENTER(cudaMemset);
    return set(dst, value, n, NULL);
}

cudaError_t cudaMemsetAsync(void *dst, int value, size_t n, cudaStream_t stream)
{
    RT_ENTER(cudaMemsetAsync);
    if (rt_stream_device(stream) < 0)
        return rt_error(cudaErrorInvalidResourceHandle);
    return set(dst, value, n, stream ? stream : cudaStreamLegacy);
}
