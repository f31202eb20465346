/* The fake driver's internals: the driver API's types (cuda.h) over the
 * shared fake device (core.h). */
#ifndef VGFC_DRV_H
#define VGFC_DRV_H

#include <cuda.h>

#include "core.h"

/* Returns `code` as a CUresult, tracing it when tracing is on. */
CUresult drv_error(int code);

/* Counts the call and returns early with an injected or sticky error. */
#define DRV_ENTER(api)                                                           \
    do {                                                                         \
        int enter_err_ = vgfc_enter(VGFC_API_##api);                             \
        if (enter_err_)                                                          \
            return drv_error(enter_err_);                                        \
    } while (0)

/* The device of a context handle; the current context's for NULL. -1 when
 * neither names a device. */
int drv_ctx_device_or_current(CUcontext ctx);

#endif
