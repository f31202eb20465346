/* Device attributes, one table for cuDeviceGetAttribute, cudaDeviceGetAttribute
 * (same numbering) and cudaGetDeviceProperties (filled from here), so the
 * three never disagree. The numbers are an H100-like part; memory, the
 * compute capability, the multiprocessor count and the L2 cache size come
 * from the knobs, and the limits kernels are chosen by follow the compute
 * capability. Attributes not listed are 0, the answer for a feature the
 * device lacks.
 */
#include "core.h"

#include <cuda.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* Whether the devices say they support virtual memory management:
 * VG_FAKECUDA_NO_VMM=1 says no from the start, vg_fakecuda_set_vmm at run
 * time. Only the attribute changes (a real device without it fails the VMM
 * calls too, but a caller that asked first never makes them). */
static int vmm_supported = 1;
static pthread_once_t vmm_once = PTHREAD_ONCE_INIT;

static void read_vmm_env(void)
{
    const char *no = getenv("VG_FAKECUDA_NO_VMM");
    if (no && *no && strcmp(no, "0") != 0)
        __atomic_store_n(&vmm_supported, 0, __ATOMIC_RELAXED);
}

static int vmm(void)
{
    pthread_once(&vmm_once, read_vmm_env);
    return __atomic_load_n(&vmm_supported, __ATOMIC_RELAXED);
}

void vg_fakecuda_set_vmm(int supported)
{
    pthread_once(&vmm_once, read_vmm_env); /* so that the env cannot undo this later */
    __atomic_store_n(&vmm_supported, supported != 0, __ATOMIC_RELAXED);
}

/* The limits PyTorch picks kernels by, per compute capability, from the
 * CUDA C Programming Guide's table of technical specifications: shared
 * memory per block (opt-in) and per multiprocessor, threads and blocks per
 * multiprocessor. A phantom T4 must not offer a kernel an H100's 227 KiB. */
struct cc_limits {
    int major, minor;
    int smem_block_optin_kib, smem_sm_kib, threads_sm, blocks_sm;
};

static const struct cc_limits cc_table[] = {
    {7, 0, 96, 96, 2048, 32},   /* V100 */
    {7, 5, 64, 64, 1024, 16},   /* T4 */
    {8, 0, 163, 164, 2048, 32}, /* A100 */
    {8, 6, 99, 100, 1536, 16},  /* A10G, RTX 3090 */
    {8, 9, 99, 100, 1536, 24},  /* L4, RTX 4090 */
    {9, 0, 227, 228, 2048, 32}, /* H100, H200 */
};

/* The entry for the configured capability: the newest not above it. */
static const struct cc_limits *limits(void)
{
    int cc = vgfc_cc_major() * 10 + vgfc_cc_minor();
    const struct cc_limits *best = &cc_table[0];
    for (size_t i = 0; i < sizeof cc_table / sizeof cc_table[0]; i++)
        if (cc_table[i].major * 10 + cc_table[i].minor <= cc)
            best = &cc_table[i];
    return best;
}

/* L2 set aside for persisting accesses came with compute capability 8.0;
 * an older card has none. Never more than the cache itself. */
static int persisting_l2(void)
{
    int l2 = vgfc_l2_bytes();
    if (vgfc_cc_major() < 8)
        return 0;
    return l2 < (30 << 20) ? l2 : 30 << 20;
}

static int attribute(CUdevice_attribute attr, int dev)
{
    switch (attr) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: return vgfc_cc_major();
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: return vgfc_cc_minor();
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: return vgfc_pci_bus(dev);
    case CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD_GROUP_ID: return dev;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: return 64;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: return 2147483647;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: return 65535;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: return 65535;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: return 48 << 10;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: return limits()->smem_block_optin_kib << 10;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: return limits()->smem_sm_kib << 10;
    case CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK: return 1 << 10;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: return 64 << 10;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: return 32;
    case CU_DEVICE_ATTRIBUTE_MAX_PITCH: return 2147483647;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: return 65536;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR: return 65536;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: return 1980000;        /* kHz */
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: return 2619000; /* kHz */
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: return 5120;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: return vgfc_l2_bytes();
    case CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE: return persisting_l2();
    case CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE: return 128 << 20;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT: return 512;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT: return 32;
    case CU_DEVICE_ATTRIBUTE_SURFACE_ALIGNMENT: return 512;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: return vgfc_sm_count();
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: return limits()->threads_sm;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR: return limits()->blocks_sm;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: return 2;
    case CU_DEVICE_ATTRIBUTE_GPU_OVERLAP: return 1;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: return 1;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: return 1;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: return 1;
    case CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: return 1;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS: return 1;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM: return 1;
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH: return 1;
    case CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED: return 1;
#if CUDA_VERSION >= 12000 /* thread block clusters came with CUDA 12 */
    case CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH: return 1;
#endif
    /* The VMM calls are faked (drv_vmm.c): expandable segments work. */
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: return vmm();
    default: return 0;
    }
}

int vgfc_launch_shape_ok(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz)
{
    unsigned long long threads = (unsigned long long)bx * by * bz;
    return threads > 0 && threads <= 1024 && gx && gy && gz;
}

/* As many blocks as the multiprocessor's threads allow, at most its block
 * limit (PyTorch sizes some grids by this; the answer changes launches,
 * never allocations). */
int vgfc_blocks_per_sm(int block_size)
{
    const struct cc_limits *l = limits();
    int blocks = block_size > 0 ? l->threads_sm / block_size : 0;
    return blocks < 1 ? 1 : blocks > l->blocks_sm ? l->blocks_sm : blocks;
}

int vgfc_device_attribute(int attr, int dev, int *value)
{
    if (attr < 1 || attr >= CU_DEVICE_ATTRIBUTE_MAX)
        return VGFC_INVALID_VALUE;
    if (!vgfc_valid_device(dev))
        return VGFC_INVALID_DEVICE;
    *value = attribute((CUdevice_attribute)attr, dev);
    return VGFC_SUCCESS;
}
