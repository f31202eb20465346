/* Driver API: contexts. Each device has its primary context and nothing
 * else (no cuCtxCreate). PyTorch reads cuDevicePrimaryCtxGetState to tell
 * whether a device is in use yet: the fake runtime retains a device's
 * primary context the first time it uses the device, as the real one does.
 * A thread's current context also gives the runtime its current device.
 */
#include "drv.h"

#define CTX_STACK 16

static _Thread_local CUcontext stack[CTX_STACK];
static _Thread_local int depth;

int drv_ctx_device_or_current(CUcontext ctx)
{
    if (!ctx)
        ctx = vgfc_current_ctx();
    return ctx ? vgfc_ctx_device(ctx) : -1;
}

CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    DRV_ENTER(cuDevicePrimaryCtxGetState);
    if (!flags || !active)
        return drv_error(CUDA_ERROR_INVALID_VALUE);
    if (!vgfc_valid_device(dev))
        return drv_error(CUDA_ERROR_INVALID_DEVICE);
    *flags = 0;
    *active = vgfc_ctx_active(dev);
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    DRV_ENTER(cuDevicePrimaryCtxRetain);
    if (!pctx)
        return drv_error(CUDA_ERROR_INVALID_VALUE);
    if (!vgfc_valid_device(dev))
        return drv_error(CUDA_ERROR_INVALID_DEVICE);
    vgfc_ctx_retain(dev);
    *pctx = vgfc_primary_ctx(dev);
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
    DRV_ENTER(cuDevicePrimaryCtxRelease);
    if (!vgfc_valid_device(dev))
        return drv_error(CUDA_ERROR_INVALID_DEVICE);
    return vgfc_ctx_release(dev) == VGFC_SUCCESS ? CUDA_SUCCESS
                                                 : drv_error(CUDA_ERROR_INVALID_CONTEXT);
}

CUresult cuCtxGetCurrent(CUcontext *pctx)
{
    DRV_ENTER(cuCtxGetCurrent);
    if (!pctx)
        return drv_error(CUDA_ERROR_INVALID_VALUE);
    *pctx = vgfc_current_ctx();
    return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx)
{
    DRV_ENTER(cuCtxSetCurrent);
    if (ctx && vgfc_ctx_device(ctx) < 0)
        return drv_error(CUDA_ERROR_INVALID_CONTEXT);
    vgfc_set_current_ctx(ctx);
    return CUDA_SUCCESS;
}

CUresult cuCtxPushCurrent(CUcontext ctx)
{
    DRV_ENTER(cuCtxPushCurrent);
    if (!ctx || vgfc_ctx_device(ctx) < 0)
        return drv_error(CUDA_ERROR_INVALID_CONTEXT);
    if (depth == CTX_STACK)
        return drv_error(CUDA_ERROR_INVALID_VALUE);
    stack[depth++] = vgfc_current_ctx();
    vgfc_set_current_ctx(ctx);
    return CUDA_SUCCESS;
}

CUresult cuCtxPopCurrent(CUcontext *pctx)
{
    DRV_ENTER(cuCtxPopCurrent);
    if (depth == 0 && !vgfc_current_ctx())
        return drv_error(CUDA_ERROR_INVALID_CONTEXT);
    if (pctx)
        *pctx = vgfc_current_ctx();
    vgfc_set_current_ctx(depth > 0 ? stack[--depth] : NULL);
    return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice *device)
{
    DRV_ENTER(cuCtxGetDevice);
    if (!device)
        return drv_error(CUDA_ERROR_INVALID_VALUE);
    int dev = drv_ctx_device_or_current(NULL);
    if (dev < 0)
        return drv_error(CUDA_ERROR_INVALID_CONTEXT);
    *device = dev;
    return CUDA_SUCCESS;
}

/* Work never runs behind the caller's back: there is nothing to wait for. */
CUresult cuCtxSynchronize(void)
{
    DRV_ENTER(cuCtxSynchronize);
    return vgfc_current_ctx() ? CUDA_SUCCESS : drv_error(CUDA_ERROR_INVALID_CONTEXT);
}
