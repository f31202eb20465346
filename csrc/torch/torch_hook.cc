// The entry points PyTorch's CUDAPluggableAllocator calls for malloc and
// free, exported from the same shared object Python imports as
// vramguard._core, so that the allocator PyTorch uses and the stats Python
// reads are one instance. The other hooks are in torch_hooks.cc (cache,
// fraction, streams) and torch_pools.cc (CUDA graphs' private pools).
//
// This is the project's only C++, because a failed allocation must reach
// PyTorch as a C++ exception: PyTorch does not check the pointer a
// pluggable allocator returns, so a NULL would reach CUDA kernels. The
// exception is thrown here, after the C core has returned, so it never
// unwinds through a C frame.
//
// An out-of-memory is thrown as c10::OutOfMemoryError when install() could
// build the small shim that knows that type (python/vramguard/torch/oom_shim.py:
// the type's layout follows the torch version, so it cannot be in this
// wheel): PyTorch then raises torch.OutOfMemoryError, and cuDNN's
// workspace fallback catches it. Otherwise it is a std::runtime_error,
// which PyTorch raises as RuntimeError. Either way the message starts
// "CUDA out of memory.", which is what batch-size finders look for. A
// device error starts "CUDA error: ", as PyTorch's own C10_CUDA_CHECK
// does, and never reads as an out-of-memory, so that nobody shrinks a
// batch for it.
#include <atomic>
#include <cstdio>
#include <stdexcept>
#include <sys/types.h>

#include "vramguard/devices.h"

namespace {

using oom_thrower = void (*)(const char *message);
std::atomic<oom_thrower> thrower{nullptr};

}  // namespace

extern "C" {

void *vramguard_torch_malloc(ssize_t size, int device, void *stream);
void vramguard_torch_free(void *ptr, ssize_t size, int device, void *stream) noexcept;
void vramguard_torch_set_oom_thrower(oom_thrower fn) noexcept;
int vramguard_torch_oom_thrower_set(void) noexcept;

void *vramguard_torch_malloc(ssize_t size, int device, void *stream)
{
    if (size < 0) throw std::invalid_argument("vramguard: negative allocation size");
    void *ptr = nullptr;
    vg_oom_info oom;
    int rc = vg_devices_alloc(static_cast<size_t>(size), device,
                              reinterpret_cast<vg_stream_t>(stream), &ptr, &oom);
    if (rc == VG_OK) return ptr;
    char msg[1536];
    if (oom.status == VG_ERR_NOMEM) {
        vg_format_oom(&oom, "CUDA", msg, sizeof msg);
        if (oom_thrower fn = thrower.load(std::memory_order_acquire)) fn(msg);  // does not return
    } else if (oom.status == VG_ERR_DEVICE) {
        vg_format_device_error(&oom, "CUDA", msg, sizeof msg);
    } else {
        std::snprintf(msg, sizeof msg, "vramguard: %s", vg_devices_error());
    }
    throw std::runtime_error(msg);
}

// Called from destructors: it must not throw, and does not.
void vramguard_torch_free(void *ptr, ssize_t size, int device, void *stream) noexcept
{
    (void)size;
    (void)stream;
    vg_devices_free(ptr, device);
}

// The shim's function that throws c10::OutOfMemoryError(message); NULL
// goes back to std::runtime_error.
void vramguard_torch_set_oom_thrower(oom_thrower fn) noexcept
{
    thrower.store(fn, std::memory_order_release);
}

int vramguard_torch_oom_thrower_set(void) noexcept
{
    return thrower.load(std::memory_order_acquire) != nullptr;
}

}  // extern "C"
