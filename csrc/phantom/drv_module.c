/* Driver API: modules, functions and launches, the path of code compiled
 * at run time (PyTorch's jiterator through NVRTC, Triton) and of libraries
 * that load their kernels themselves.
 *
 * A module loads whatever image it is given and keeps nothing of it; every
 * function found in it is one small handle; a launch on a valid stream
 * succeeds and runs nothing (see rt_launch.c for why that is enough). The
 * linker hands back an empty image, which loads like any other.
 */
#include "drv.h"

#include <stdlib.h>
#include <string.h>

/* A module's mark while it is loaded: unloading clears it, so a second
 * unload of the same handle is refused (as by a driver) instead of freeing
 * twice. The memory is kept, never reused, for that check: modules are
 * few (one per jitted kernel). They stay on a list, so that a leak checker
 * sees them kept, not lost. */
#define MODULE_LOADED 0x6d6f64756c65ULL

struct CUmod_st {
    unsigned long long loaded;
    struct CUmod_st *next;
};

static struct CUmod_st *modules;

struct CUfunc_st {
    int function;
};

struct CUlinkState_st {
    int inputs;
};

/* Every function of every module: nothing distinguishes them here. */
static struct CUfunc_st the_function;

/* What a linked image holds: nothing a loader of this driver reads. */
static const char empty_image[16];

static CUresult load(CUmodule *module, const void *image)
{
    if (!module || !image)
        return drv_error(CUDA_ERROR_INVALID_VALUE);
    if (drv_ctx_device_or_current(NULL) < 0)
        return drv_error(CUDA_ERROR_INVALID_CONTEXT);
    struct CUmod_st *m = calloc(1, sizeof *m);
    if (!m)
        return drv_error(CUDA_ERROR_OUT_OF_MEMORY);
    m->loaded = MODULE_LOADED;
    m->next = __atomic_load_n(&modules, __ATOMIC_RELAXED);
    while (!__atomic_compare_exchange_n(&modules, &m->next, m, 1, __ATOMIC_RELEASE, __ATOMIC_RELAXED))
        ;
    *module = m;
    return CUDA_SUCCESS;
}

CUresult cuModuleLoad(CUmodule *module, const char *fname)
{
    DRV_ENTER(cuModuleLoad);
    return load(module, fname);
}

CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
    DRV_ENTER(cuModuleLoadData);
    return load(module, image);
}

CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int num_options, CUjit_option *options,
                            void **values)
{
    DRV_ENTER(cuModuleLoadDataEx);
    (void)num_options, (void)options, (void)values;
    return load(module, image);
}

CUresult cuModuleUnload(CUmodule module)
{
    DRV_ENTER(cuModuleUnload);
    if (!module || !__atomic_exchange_n(&module->loaded, 0, __ATOMIC_ACQ_REL))
        return drv_error(CUDA_ERROR_INVALID_HANDLE);
    return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(CUfunction *function, CUmodule module, const char *name)
{
    DRV_ENTER(cuModuleGetFunction);
    if (!function || !module || !name)
        return drv_error(CUDA_ERROR_INVALID_VALUE);
    if (__atomic_load_n(&module->loaded, __ATOMIC_ACQUIRE) != MODULE_LOADED)
        return drv_error(CUDA_ERROR_INVALID_HANDLE);
    *function = &the_function;
    return CUDA_SUCCESS;
}

/* The same small kernel as cudaFuncGetAttributes describes. */
CUresult cuFuncGetAttribute(int *value, CUfunction_attribute attr, CUfunction function)
{
    DRV_ENTER(cuFuncGetAttribute);
    if (!value || !function)
        return drv_error(CUDA_ERROR_INVALID_VALUE);
    int arch = vgfc_cc_major() * 10 + vgfc_cc_minor();
    switch (attr) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *value = 1024; break;
    case CU_FUNC_ATTRIBUTE_NUM_REGS: *value = 32; break;
    case CU_FUNC_ATTRIBUTE_PTX_VERSION: *value = arch; break;
    case CU_FUNC_ATTRIBUTE_BINARY_VERSION: *value = arch; break;
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: *value = 48 << 10; break;
    case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT: *value = -1; break;
    default: *value = 0; break;
    }
    return CUDA_SUCCESS;
}

CUresult cuFuncSetAttribute(CUfunction function, CUfunction_attribute attr, int value)
{
    DRV_ENTER(cuFuncSetAttribute);
    (void)attr, (void)value;
    return function ? CUDA_SUCCESS : drv_error(CUDA_ERROR_INVALID_HANDLE);
}

CUresult cuFuncSetCacheConfig(CUfunction function, CUfunc_cache config)
{
    DRV_ENTER(cuFuncSetCacheConfig);
    (void)config;
    return function ? CUDA_SUCCESS : drv_error(CUDA_ERROR_INVALID_HANDLE);
}

CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *num_blocks, CUfunction function, int block_size,
                                                     size_t dynamic_smem)
{
    DRV_ENTER(cuOccupancyMaxActiveBlocksPerMultiprocessor);
    (void)dynamic_smem;
    if (!num_blocks || !function)
        return drv_error(CUDA_ERROR_INVALID_VALUE);
    *num_blocks = vgfc_blocks_per_sm(block_size);
    return CUDA_SUCCESS;
}

/* ---- launches ---------------------------------------------------------- */

static CUresult launch(CUfunction function, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                       unsigned bz)
{
    if (!function)
        return drv_error(CUDA_ERROR_INVALID_HANDLE);
    if (!vgfc_launch_shape_ok(gx, gy, gz, bx, by, bz))
        return drv_error(CUDA_ERROR_INVALID_VALUE);
    return CUDA_SUCCESS;
}

CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned shared_mem, CUstream stream, void **params, void **extra)
{
    DRV_ENTER(cuLaunchKernel);
    (void)shared_mem, (void)stream, (void)params, (void)extra;
    return launch(f, gx, gy, gz, bx, by, bz);
}

#if CUDA_VERSION >= 12000 /* launches with attributes came with CUDA 12 */
CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params, void **extra)
{
    DRV_ENTER(cuLaunchKernelEx);
    (void)params, (void)extra;
    if (!config)
        return drv_error(CUDA_ERROR_INVALID_VALUE);
    return launch(f, config->gridDimX, config->gridDimY, config->gridDimZ, config->blockDimX,
                  config->blockDimY, config->blockDimZ);
}
#endif

CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                   unsigned by, unsigned bz, unsigned shared_mem, CUstream stream, void **params)
{
    DRV_ENTER(cuLaunchCooperativeKernel);
    (void)shared_mem, (void)stream, (void)params;
    return launch(f, gx, gy, gz, bx, by, bz);
}

/* ---- the linker (NVRTC's output linked before loading) ----------------- */

CUresult cuLinkCreate(unsigned int num_options, CUjit_option *options, void **values, CUlinkState *state)
{
    DRV_ENTER(cuLinkCreate);
    (void)num_options, (void)options, (void)values;
    if (!state)
        return drv_error(CUDA_ERROR_INVALID_VALUE);
    struct CUlinkState_st *s = calloc(1, sizeof *s);
    if (!s)
        return drv_error(CUDA_ERROR_OUT_OF_MEMORY);
    *state = s;
    return CUDA_SUCCESS;
}

CUresult cuLinkAddData(CUlinkState state, CUjitInputType type, void *data, size_t size, const char *name,
                       unsigned int num_options, CUjit_option *options, void **values)
{
    DRV_ENTER(cuLinkAddData);
    (void)type, (void)size, (void)name, (void)num_options, (void)options, (void)values;
    if (!state || !data)
        return drv_error(CUDA_ERROR_INVALID_VALUE);
    state->inputs++;
    return CUDA_SUCCESS;
}

CUresult cuLinkComplete(CUlinkState state, void **image, size_t *size)
{
    DRV_ENTER(cuLinkComplete);
    if (!state || !image || !size)
        return drv_error(CUDA_ERROR_INVALID_VALUE);
    *image = (void *)empty_image;
    *size = sizeof empty_image;
    return CUDA_SUCCESS;
}

CUresult cuLinkDestroy(CUlinkState state)
{
    DRV_ENTER(cuLinkDestroy);
    if (!state)
        return drv_error(CUDA_ERROR_INVALID_HANDLE);
    free(state);
    return CUDA_SUCCESS;
}
