/* Runtime API: devices, their properties and attributes, versions, peers.
 * The current device is the device of the thread's current driver context
 * (0 when there is none), so the runtime and the driver agree on it. */
#include "rt.h"

#include <stdio.h>
#include <string.h>

int rt_current_device(void)
{
    int dev = vgfc_current_device();
    if (!vgfc_valid_device(dev))
        return -1;
    vgfc_use_device(dev);
    return dev;
}

static cudaError_t check_device(int dev)
{
    if (vgfc_device_count() == 0)
        return rt_error(cudaErrorNoDevice);
    return vgfc_valid_device(dev) ? cudaSuccess : rt_error(cudaErrorInvalidDevice);
}

cudaError_t cudaGetDeviceCount(int *count)
{
    RT_ENTER(cudaGetDeviceCount);
    if (!count)
        return rt_error(cudaErrorInvalidValue);
    *count = vgfc_device_count();
    return *count ? cudaSuccess : rt_error(cudaErrorNoDevice);
}

cudaError_t cudaGetDevice(int *device)
{
    RT_ENTER(cudaGetDevice);
    if (!device)
        return rt_error(cudaErrorInvalidValue);
    if (vgfc_device_count() == 0)
        return rt_error(cudaErrorNoDevice);
    *device = vgfc_current_device();
    return cudaSuccess;
}

/* Since CUDA 12 setting a device initialises its primary context. */
cudaError_t cudaSetDevice(int device)
{
    RT_ENTER(cudaSetDevice);
    if (check_device(device) != cudaSuccess)
        return vgfc_device_count() ? cudaErrorInvalidDevice : cudaErrorNoDevice;
    vgfc_use_device(device);
    return cudaSuccess;
}

static int attr(enum cudaDeviceAttr a, int dev)
{
    int value = 0;
    vgfc_device_attribute((int)a, dev, &value);
    return value;
}

/* The fields both CUDA 12 and 13 have, from the one attribute table. */
static void fill_properties(struct cudaDeviceProp *p, int dev)
{
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", vgfc_device_name());
    vgfc_device_uuid(dev, (unsigned char *)p->uuid.bytes);
    p->totalGlobalMem = vgfc_capacity(dev);
    p->sharedMemPerBlock = (size_t)attr(cudaDevAttrMaxSharedMemoryPerBlock, dev);
    p->regsPerBlock = attr(cudaDevAttrMaxRegistersPerBlock, dev);
    p->warpSize = attr(cudaDevAttrWarpSize, dev);
    p->memPitch = (size_t)attr(cudaDevAttrMaxPitch, dev);
    p->maxThreadsPerBlock = attr(cudaDevAttrMaxThreadsPerBlock, dev);
    p->maxThreadsDim[0] = attr(cudaDevAttrMaxBlockDimX, dev);
    p->maxThreadsDim[1] = attr(cudaDevAttrMaxBlockDimY, dev);
    p->maxThreadsDim[2] = attr(cudaDevAttrMaxBlockDimZ, dev);
    p->maxGridSize[0] = attr(cudaDevAttrMaxGridDimX, dev);
    p->maxGridSize[1] = attr(cudaDevAttrMaxGridDimY, dev);
    p->maxGridSize[2] = attr(cudaDevAttrMaxGridDimZ, dev);
    p->totalConstMem = (size_t)attr(cudaDevAttrTotalConstantMemory, dev);
    p->major = attr(cudaDevAttrComputeCapabilityMajor, dev);
    p->minor = attr(cudaDevAttrComputeCapabilityMinor, dev);
    p->textureAlignment = (size_t)attr(cudaDevAttrTextureAlignment, dev);
    p->texturePitchAlignment = (size_t)attr(cudaDevAttrTexturePitchAlignment, dev);
    p->multiProcessorCount = attr(cudaDevAttrMultiProcessorCount, dev);
    p->canMapHostMemory = attr(cudaDevAttrCanMapHostMemory, dev);
    p->surfaceAlignment = (size_t)attr(cudaDevAttrSurfaceAlignment, dev);
    p->concurrentKernels = attr(cudaDevAttrConcurrentKernels, dev);
    p->pciBusID = attr(cudaDevAttrPciBusId, dev);
    p->asyncEngineCount = attr(cudaDevAttrAsyncEngineCount, dev);
    p->unifiedAddressing = attr(cudaDevAttrUnifiedAddressing, dev);
    p->memoryBusWidth = attr(cudaDevAttrGlobalMemoryBusWidth, dev);
    p->l2CacheSize = attr(cudaDevAttrL2CacheSize, dev);
    p->persistingL2CacheMaxSize = attr(cudaDevAttrMaxPersistingL2CacheSize, dev);
    p->maxThreadsPerMultiProcessor = attr(cudaDevAttrMaxThreadsPerMultiProcessor, dev);
    p->streamPrioritiesSupported = attr(cudaDevAttrStreamPrioritiesSupported, dev);
    p->globalL1CacheSupported = attr(cudaDevAttrGlobalL1CacheSupported, dev);
    p->localL1CacheSupported = attr(cudaDevAttrLocalL1CacheSupported, dev);
    p->sharedMemPerMultiprocessor = (size_t)attr(cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev);
    p->regsPerMultiprocessor = attr(cudaDevAttrMaxRegistersPerMultiprocessor, dev);
    p->managedMemory = attr(cudaDevAttrManagedMemory, dev);
    p->multiGpuBoardGroupID = attr(cudaDevAttrMultiGpuBoardGroupID, dev);
    p->concurrentManagedAccess = attr(cudaDevAttrConcurrentManagedAccess, dev);
    p->computePreemptionSupported = attr(cudaDevAttrComputePreemptionSupported, dev);
    p->canUseHostPointerForRegisteredMem = attr(cudaDevAttrCanUseHostPointerForRegisteredMem, dev);
    p->cooperativeLaunch = attr(cudaDevAttrCooperativeLaunch, dev);
    p->sharedMemPerBlockOptin = (size_t)attr(cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    p->maxBlocksPerMultiProcessor = attr(cudaDevAttrMaxBlocksPerMultiprocessor, dev);
    p->accessPolicyMaxWindowSize = attr(cudaDevAttrMaxAccessPolicyWindowSize, dev);
    p->reservedSharedMemPerBlock = (size_t)attr(cudaDevAttrReservedSharedMemoryPerBlock, dev);
#if CUDART_VERSION >= 12000 /* fields CUDA 11 does not have */
    p->hostRegisterSupported = attr(cudaDevAttrHostRegisterSupported, dev);
    p->memoryPoolsSupported = attr(cudaDevAttrMemoryPoolsSupported, dev);
    p->clusterLaunch = attr(cudaDevAttrClusterLaunch, dev);
#endif
#if CUDART_VERSION < 13000
    /* Fields CUDA 13 dropped (it answers them as attributes only). */
    p->clockRate = attr(cudaDevAttrClockRate, dev);
    p->memoryClockRate = attr(cudaDevAttrMemoryClockRate, dev);
#endif
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device)
{
    RT_ENTER(cudaGetDeviceProperties);
    if (!prop)
        return rt_error(cudaErrorInvalidValue);
    if (check_device(device) != cudaSuccess)
        return vgfc_device_count() ? cudaErrorInvalidDevice : cudaErrorNoDevice;
    fill_properties(prop, device);
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr a, int device)
{
    RT_ENTER(cudaDeviceGetAttribute);
    if (!value)
        return rt_error(cudaErrorInvalidValue);
    return rt_error(vgfc_device_attribute((int)a, device, value));
}

cudaError_t cudaDeviceGetPCIBusId(char *bus_id, int len, int device)
{
    RT_ENTER(cudaDeviceGetPCIBusId);
    if (!bus_id || len <= 0)
        return rt_error(cudaErrorInvalidValue);
    if (check_device(device) != cudaSuccess)
        return cudaErrorInvalidDevice;
    snprintf(bus_id, (size_t)len, "%04x:%02x:00.0", 0, vgfc_pci_bus(device));
    return cudaSuccess;
}

/* Six levels, 0 (lowest) to -5, as on current GPUs. */
cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest)
{
    RT_ENTER(cudaDeviceGetStreamPriorityRange);
    if (least)
        *least = 0;
    if (greatest)
        *greatest = -5;
    return cudaSuccess;
}

cudaError_t cudaDeviceCanAccessPeer(int *can, int device, int peer)
{
    RT_ENTER(cudaDeviceCanAccessPeer);
    if (!can)
        return rt_error(cudaErrorInvalidValue);
    if (!vgfc_valid_device(device) || !vgfc_valid_device(peer))
        return rt_error(cudaErrorInvalidDevice);
    *can = device != peer;
    return cudaSuccess;
}

/* All memory is one host address space: every peer can always read it. */
cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned int flags)
{
    RT_ENTER(cudaDeviceEnablePeerAccess);
    if (flags != 0)
        return rt_error(cudaErrorInvalidValue);
    if (!vgfc_valid_device(peer) || peer == vgfc_current_device())
        return rt_error(cudaErrorInvalidDevice);
    return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int *version)
{
    RT_ENTER(cudaDriverGetVersion);
    if (!version)
        return rt_error(cudaErrorInvalidValue);
    *version = vgfc_driver_version();
    return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *version)
{
    RT_ENTER(cudaRuntimeGetVersion);
    if (!version)
        return rt_error(cudaErrorInvalidValue);
    *version = CUDART_VERSION;
    return cudaSuccess;
}

/* Every call completes before it returns: there is never work to wait for.
 * Refused during a capture in the global mode (rt_graph.c). */
cudaError_t cudaDeviceSynchronize(void)
{
    RT_ENTER(cudaDeviceSynchronize);
    return rt_current_device() < 0 ? rt_error(cudaErrorNoDevice) : rt_capture_unsafe();
}
