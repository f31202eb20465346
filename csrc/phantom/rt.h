/* The fake runtime's internals: the runtime API's types
 * (cuda_runtime_api.h, from the CUDA version the fake is built for) over
 * the fake device in the fake driver (core.h). */
#ifndef VGFC_RT_H
#define VGFC_RT_H

#include <cuda_runtime_api.h>

#include "core.h"

/* Makes `code` this thread's last error (as every failing runtime call
 * does) and returns it. */
cudaError_t rt_error(int code);

/* Where every generated stub goes: counts, traces, sets the last error,
 * and gives the code to return (cudaErrorNotSupported, or a sticky error). */
int vgfc_rt_unsupported(const char *name);

/* Counts the call and returns early with an injected or sticky error. */
#define RT_ENTER(api)                                                            \
    do {                                                                         \
        int enter_err_ = vgfc_enter(VGFC_API_##api);                             \
        if (enter_err_)                                                          \
            return rt_error(enter_err_);                                         \
    } while (0)

/* The current device, its primary context made active, as the runtime
 * does on a device's first use; -1 when there is no device. */
int rt_current_device(void);

/* A stream handle's device: NULL and the legacy and per-thread handles
 * mean the current device. -1 for a handle that is no stream. */
int rt_stream_device(cudaStream_t stream);

#endif
