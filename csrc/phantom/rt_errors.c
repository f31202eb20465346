/* Runtime API: the per-thread last error, error names and strings, and the
 * landing point of every generated stub. */
#include "rt.h"

static _Thread_local cudaError_t last_error;

cudaError_t rt_error(int code)
{
    /* Not ready is an answer, not a failure: it is never the last error. */
    if (code != cudaSuccess && code != cudaErrorNotReady)
        last_error = (cudaError_t)code;
    if (code && vgfc_tracing()) {
        const char *name = vgfc_runtime_error_name(code);
        vgfc_trace("  -> %d %s", code, name ? name : "(not a runtime code)");
    }
    return (cudaError_t)code;
}

/* Every function the fake leaves out lands here (gen_fakecuda.py): it
 * fails, and the failure is also the last error, so that PyTorch's check
 * after a kernel launch raises. */
int vgfc_rt_unsupported(const char *name)
{
    return rt_error(vgfc_unsupported(name));
}

/* A sticky error is never cleared: every call returns it, this one too. */
cudaError_t cudaGetLastError(void)
{
    RT_ENTER(cudaGetLastError);
    cudaError_t err = last_error;
    last_error = cudaSuccess;
    return err;
}

cudaError_t cudaPeekAtLastError(void)
{
    RT_ENTER(cudaPeekAtLastError);
    return last_error;
}

const char *cudaGetErrorName(cudaError_t error)
{
    const char *name = vgfc_runtime_error_name((int)error);
    return name ? name : "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t error)
{
    const char *message = vgfc_error_message((int)error);
    if (message)
        return message;
    const char *name = vgfc_runtime_error_name((int)error);
    return name ? name : "unrecognized error code";
}
