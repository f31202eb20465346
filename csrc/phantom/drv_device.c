/* Driver API: initialisation, versions, and the devices' identity and
 * attributes. Initialisation is not enforced: the fake runtime never calls
 * cuInit, and PyTorch asks the driver about contexts whichever came first. */
#include "drv.h"

#include <stdio.h>
#include <string.h>

CUresult drv_error(int code)
{
    if (code && vgfc_tracing()) {
        const char *name = vgfc_driver_error_name(code);
        vgfc_trace("  -> %d %s", code, name ? name : "(not a driver code)");
    }
    return (CUresult)code;
}

static CUresult check_device(CUdevice dev)
{
    return vgfc_valid_device(dev) ? CUDA_SUCCESS : drv_error(CUDA_ERROR_INVALID_DEVICE);
}

CUresult cuInit(unsigned int flags)
{
    DRV_ENTER(cuInit);
    if (flags != 0)
        return drv_error(CUDA_ERROR_INVALID_VALUE);
    return vgfc_device_count() > 0 ? CUDA_SUCCESS : drv_error(CUDA_ERROR_NO_DEVICE);
}

CUresult cuDriverGetVersion(int *version)
{
    DRV_ENTER(cuDriverGetVersion);
    if (!version)
        return drv_error(CUDA_ERROR_INVALID_VALUE);
    *version = vgfc_driver_version();
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *count)
{
    DRV_ENTER(cuDeviceGetCount);
    if (!count)
        return drv_error(CUDA_ERROR_INVALID_VALUE);
    *count = vgfc_device_count();
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    DRV_ENTER(cuDeviceGet);
    if (!device)
        return drv_error(CUDA_ERROR_INVALID_VALUE);
    if (check_device(ordinal) != CUDA_SUCCESS)
        return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
    DRV_ENTER(cuDeviceGetName);
    if (!name || len <= 0)
        return drv_error(CUDA_ERROR_INVALID_VALUE);
    if (check_device(dev) != CUDA_SUCCESS)
        return CUDA_ERROR_INVALID_DEVICE;
    snprintf(name, (size_t)len, "%s", vgfc_device_name());
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
    DRV_ENTER(cuDeviceGetUuid);
    if (!uuid)
        return drv_error(CUDA_ERROR_INVALID_VALUE);
    if (check_device(dev) != CUDA_SUCCESS)
        return CUDA_ERROR_INVALID_DEVICE;
    vgfc_device_uuid(dev, (unsigned char *)uuid->bytes);
    return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem(size_t *bytes, CUdevice dev)
{
    DRV_ENTER(cuDeviceTotalMem);
    if (!bytes)
        return drv_error(CUDA_ERROR_INVALID_VALUE);
    if (check_device(dev) != CUDA_SUCCESS)
        return CUDA_ERROR_INVALID_DEVICE;
    *bytes = vgfc_capacity(dev);
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int *value, CUdevice_attribute attr, CUdevice dev)
{
    DRV_ENTER(cuDeviceGetAttribute);
    if (!value)
        return drv_error(CUDA_ERROR_INVALID_VALUE);
    return drv_error(vgfc_device_attribute((int)attr, dev, value));
}

/* Deprecated since CUDA 5 and still exported: bitsandbytes before 0.40
 * reads the compute capability through it with ctypes. */
CUresult cuDeviceComputeCapability(int *major, int *minor, CUdevice dev)
{
    DRV_ENTER(cuDeviceComputeCapability);
    if (!major || !minor)
        return drv_error(CUDA_ERROR_INVALID_VALUE);
    int code = vgfc_device_attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev, major);
    if (code == CUDA_SUCCESS)
        code = vgfc_device_attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev, minor);
    return drv_error(code);
}

CUresult cuDeviceGetPCIBusId(char *bus_id, int len, CUdevice dev)
{
    DRV_ENTER(cuDeviceGetPCIBusId);
    if (!bus_id || len <= 0)
        return drv_error(CUDA_ERROR_INVALID_VALUE);
    if (check_device(dev) != CUDA_SUCCESS)
        return CUDA_ERROR_INVALID_DEVICE;
    snprintf(bus_id, (size_t)len, "%04x:%02x:00.0", 0, vgfc_pci_bus(dev));
    return CUDA_SUCCESS;
}
