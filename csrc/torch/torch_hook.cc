// The entry points PyTorch's CUDAPluggableAllocator calls, exported from
// the same shared object Python imports as vramguard._core, so that the
// allocator PyTorch uses and the stats Python reads are one instance.
//
// This is the project's only C++, because a failed allocation must reach
// PyTorch as a C++ exception: PyTorch does not check the pointer a
// pluggable allocator returns, so a NULL would reach CUDA kernels. The
// exception is thrown here, after the C core has returned, so it never
// unwinds through a C frame. PyTorch turns it into a RuntimeError with the
// message as its one argument. An out-of-memory starts "CUDA out of
// memory.", which is what batch-size finders look for; a device error
// starts "CUDA error: ", as PyTorch's own C10_CUDA_CHECK does, and never
// reads as an out-of-memory, so that nobody shrinks a batch for it.
#include <cstdio>
#include <stdexcept>
#include <sys/types.h>

#include "vramguard/devices.h"

extern "C" {

void *vramguard_torch_malloc(ssize_t size, int device, void *stream);
void vramguard_torch_free(void *ptr, ssize_t size, int device, void *stream) noexcept;

void *vramguard_torch_malloc(ssize_t size, int device, void *stream)
{
    if (size < 0) throw std::invalid_argument("vramguard: negative allocation size");
    void *ptr = nullptr;
    vg_oom_info oom;
    int rc = vg_devices_alloc(static_cast<size_t>(size), device,
                              reinterpret_cast<vg_stream_t>(stream), &ptr, &oom);
    if (rc == VG_OK) return ptr;
    char msg[1536];
    if (oom.status == VG_ERR_NOMEM) vg_format_oom(&oom, "CUDA", msg, sizeof msg);
    else if (oom.status == VG_ERR_DEVICE) vg_format_device_error(&oom, "CUDA", msg, sizeof msg);
    else std::snprintf(msg, sizeof msg, "vramguard: %s", vg_devices_error());
    throw std::runtime_error(msg);
}

// Called from destructors: it must not throw, and does not.
void vramguard_torch_free(void *ptr, ssize_t size, int device, void *stream) noexcept
{
    (void)size;
    (void)stream;
    vg_devices_free(ptr, device);
}

}  // extern "C"
