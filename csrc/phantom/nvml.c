/* A fake NVML (libnvidia-ml.so.1): the handful of calls PyTorch makes when
 * the library is present, over the same fake devices.
 *
 * Why it exists: with expandable segments, PyTorch's allocator asks whether
 * the device has fabric memory, and that path calls nvmlInit_v2 through a
 * pointer that is null when NVML is missing (a crash, not an error; real
 * systems always have NVML beside the driver). With this library the
 * answer is "no fabric" (nvmlDeviceGetGpuFabricInfoV is deliberately
 * absent), and the allocator uses POSIX file descriptor handles.
 *
 * Also answers torch.cuda.device_count(), which prefers NVML's count.
 * The few types are declared here: nvml.h is in no pip wheel PyTorch
 * depends on, and these signatures have not changed in years.
 */
#include <stdio.h>
#include <string.h>

#include "core.h"

typedef int nvmlReturn_t;
typedef struct nvml_device *nvmlDevice_t;

#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7

struct nvml_device {
    int index;
};

static struct nvml_device devices[VGFC_MAX_DEVICES];
static int initialised;

nvmlReturn_t nvmlInit_v2(void);
nvmlReturn_t nvmlInit(void);
nvmlReturn_t nvmlShutdown(void);
const char *nvmlErrorString(nvmlReturn_t result);
nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version);
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version);
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count);
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device);
nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus_id, nvmlDevice_t *device);
nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index);
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length);
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *count, void *infos);
nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t device, unsigned int link, int *type);
nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link, void *pci);

nvmlReturn_t nvmlInit_v2(void)
{
    for (int i = 0; i < VGFC_MAX_DEVICES; i++)
        devices[i].index = i;
    __atomic_store_n(&initialised, 1, __ATOMIC_RELEASE);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit(void)
{
    return nvmlInit_v2();
}

nvmlReturn_t nvmlShutdown(void)
{
    return NVML_SUCCESS; /* handles stay valid: PyTorch keeps them */
}

const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    default: return "Unknown Error";
    }
}

static nvmlReturn_t ready(void)
{
    return __atomic_load_n(&initialised, __ATOMIC_ACQUIRE) ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
}

static int device_index(nvmlDevice_t device)
{
    if (device < devices || device >= devices + vgfc_device_count())
        return -1;
    return device->index;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version)
{
    if (!version)
        return NVML_ERROR_INVALID_ARGUMENT;
    *version = vgfc_driver_version();
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version)
{
    return nvmlSystemGetCudaDriverVersion_v2(version);
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count)
{
    if (ready() != NVML_SUCCESS)
        return NVML_ERROR_UNINITIALIZED;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = (unsigned)vgfc_device_count();
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    if (ready() != NVML_SUCCESS)
        return NVML_ERROR_UNINITIALIZED;
    if (!device || index >= (unsigned)vgfc_device_count())
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &devices[index];
    return NVML_SUCCESS;
}

/* "00000000:02:00.0": the device on that bus (the fake's bus is ordinal + 1). */
nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus_id, nvmlDevice_t *device)
{
    if (ready() != NVML_SUCCESS)
        return NVML_ERROR_UNINITIALIZED;
    unsigned domain, bus, dev, fn;
    if (!bus_id || !device || sscanf(bus_id, "%x:%x:%x.%x", &domain, &bus, &dev, &fn) != 4)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < vgfc_device_count(); i++) {
        if (domain == 0 && dev == 0 && (int)bus == vgfc_pci_bus(i)) {
            *device = &devices[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    int i = device_index(device);
    if (i < 0 || !index)
        return NVML_ERROR_INVALID_ARGUMENT;
    *index = (unsigned)i;
    return NVML_SUCCESS;
}

/* The CUDA uuid in NVML's spelling, "GPU-76676661-6b65-6375-0000-000000000001". */
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    int i = device_index(device);
    if (i < 0 || !uuid)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned char b[16];
    vgfc_device_uuid(i, b);
    int n = snprintf(uuid, length,
                     "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                     b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11],
                     b[12], b[13], b[14], b[15]);
    return n < 0 || (unsigned)n >= length ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
}

/* No process runs kernels on a fake device. */
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *count, void *infos)
{
    (void)infos;
    if (device_index(device) < 0 || !count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = 0;
    return NVML_SUCCESS;
}

/* No NVLink. */
nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t device, unsigned int link, int *type)
{
    (void)device, (void)link, (void)type;
    return NVML_ERROR_NOT_SUPPORTED;
}

nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link, void *pci)
{
    (void)device, (void)link, (void)pci;
    return NVML_ERROR_NOT_SUPPORTED;
}
