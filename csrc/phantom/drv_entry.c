/* Driver API: cuGetProcAddress, through which the runtime's
 * cudaGetDriverEntryPoint and PyTorch find driver functions by their
 * unversioned name, and the error strings.
 *
 * The name -> symbol table is generated from cuda.h (what each name
 * preprocesses to), so a request finds the implementation or the generated
 * stub the header's version of the name means. PyTorch insists on finding
 * every function it lists, even ones it never calls here; stubs satisfy it.
 */
#include "drv.h"

#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

static void *self;
static pthread_once_t self_once = PTHREAD_ONCE_INIT;

/* A handle on this library itself, whatever path it was loaded from. */
static void open_self(void)
{
    Dl_info info;
    if (dladdr((void *)&open_self, &info) && info.dli_fname)
        self = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
}

static const char *exported_name(const char *name)
{
    int lo = 0, hi = vgfc_driver_proc_count;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        int cmp = strcmp(vgfc_driver_procs[mid].name, name);
        if (cmp == 0)
            return vgfc_driver_procs[mid].symbol;
        if (cmp < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return name; /* already a versioned name, or unknown: let dlsym decide */
}

#if CUDA_VERSION >= 12000
CUresult cuGetProcAddress(const char *symbol, void **pfn, int cuda_version, cuuint64_t flags,
                          CUdriverProcAddressQueryResult *status)
#else /* CUDA 11's has no status */
#define CU_GET_PROC_ADDRESS_SUCCESS 0
#define CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND 1
static CUresult get_proc_address(const char *symbol, void **pfn, int cuda_version, cuuint64_t flags, int *status);

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cuda_version, cuuint64_t flags)
{
    return get_proc_address(symbol, pfn, cuda_version, flags, NULL);
}

static CUresult get_proc_address(const char *symbol, void **pfn, int cuda_version, cuuint64_t flags, int *status)
#endif
{
    (void)cuda_version; /* one version of each function here */
    (void)flags;        /* per-thread default stream variants are the same functions */
    if (!symbol || !pfn)
        return drv_error(CUDA_ERROR_INVALID_VALUE);
    pthread_once(&self_once, open_self);
    *pfn = self ? dlsym(self, exported_name(symbol)) : NULL;
    if (status)
        *status = *pfn ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    if (vgfc_tracing())
        vgfc_trace("cuGetProcAddress(%s)%s", symbol, *pfn ? "" : ": not found");
    return *pfn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

CUresult cuGetErrorName(CUresult error, const char **str)
{
    if (!str)
        return CUDA_ERROR_INVALID_VALUE;
    *str = vgfc_driver_error_name((int)error);
    return *str ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult error, const char **str)
{
    if (!str)
        return CUDA_ERROR_INVALID_VALUE;
    const char *name = vgfc_driver_error_name((int)error);
    const char *message = vgfc_error_message((int)error);
    *str = name ? (message ? message : name) : NULL;
    return *str ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

#if CUDA_VERSION >= 13000
/* The driver's own log messages (PyTorch registers for them at start): a
 * phantom driver has none to give, so the callback is kept by no one. */
static struct CUlogsCallbackEntry_st {
    int unused;
} logs_callback;

CUresult cuLogsRegisterCallback(CUlogsCallback callback, void *user_data, CUlogsCallbackHandle *handle)
{
    (void)user_data;
    if (!callback)
        return CUDA_ERROR_INVALID_VALUE;
    if (handle)
        *handle = &logs_callback;
    return CUDA_SUCCESS;
}

CUresult cuLogsUnregisterCallback(CUlogsCallbackHandle handle)
{
    return handle == &logs_callback ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
#endif
