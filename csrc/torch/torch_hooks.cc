// The pluggable allocator's plain hooks, set by install() with
// allocator.allocator().set_*_fn(address): what C++ inside PyTorch calls
// besides malloc and free.
//
//   init_fn(device_count)          at CUDA's lazy init, once
//   reset_fn()                     torch.cuda.empty_cache(), torch.cuda.graph's
//                                  entry, cuDNN after benchmarking, MemPool's end
//   memory_fraction_fn(f, device)  torch.cuda.set_per_process_memory_fraction
//   record_stream_fn(ptr, stream)  Tensor.record_stream, NCCL collectives
//   base_alloc_fn(ptr, size*)      getBaseAllocation
//
// Each runs the C registry (device/heaps.c) and catches nothing because
// nothing below throws; only the memory fraction refuses bad input with an
// exception, which PyTorch raises as RuntimeError. The others are called
// from destructors and teardown, where an exception means std::terminate:
// they never throw.
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "vramguard/devices.h"

extern "C" {

void vramguard_torch_init(int device_count) noexcept;
void vramguard_torch_reset(void) noexcept;
void vramguard_torch_memory_fraction(double fraction, int device);
void vramguard_torch_record_stream(void *ptr, void *stream) noexcept;
void *vramguard_torch_base_alloc(void *ptr, size_t *size) noexcept;

void vramguard_torch_init(int device_count) noexcept
{
    vg_devices_note_device_count(device_count);
}

void vramguard_torch_reset(void) noexcept
{
    (void)vg_devices_empty_cache_all();
}

// The device's budget becomes `fraction` of its memory; 0 allows nothing
// new (the smallest budget there is: one byte), as PyTorch's own 0 does.
void vramguard_torch_memory_fraction(double fraction, int device)
{
    char msg[256];
    int count = vg_devices_device_count();
    if (!(fraction >= 0.0 && fraction <= 1.0)) {
        std::snprintf(msg, sizeof msg, "vramguard: invalid memory fraction %g: allowed range 0~1",
                      fraction);
        throw std::invalid_argument(msg);
    }
    if (device < 0 || device >= VG_MAX_DEVICES || (count >= 0 && device >= count)) {
        std::snprintf(msg, sizeof msg, "vramguard: invalid device %d for a memory fraction", device);
        throw std::invalid_argument(msg);
    }
    int rc = fraction > 0.0 ? vg_devices_set_budget(device, 0, fraction)
                            : vg_devices_set_budget(device, 1, 0.0);
    if (rc != VG_OK) throw std::runtime_error(std::string("vramguard: ") + vg_devices_error());
}

// The stream's own device, which may not be the block's: a block of GPU 0
// read by a stream of GPU 1 must wait for GPU 1. A pointer vramguard did
// not allocate is none of its business, as for PyTorch's own allocator.
void vramguard_torch_record_stream(void *ptr, void *stream) noexcept
{
    if (!ptr) return;
    vg_stream_t s = reinterpret_cast<vg_stream_t>(stream);
    (void)vg_devices_record_stream(ptr, vg_devices_stream_device(s), s);
}

// The start and size of the segment (one cudaMalloc) that holds ptr; a
// pointer no heap holds is its own base, of unknown size (0).
void *vramguard_torch_base_alloc(void *ptr, size_t *size) noexcept
{
    uintptr_t base = 0;
    size_t bytes = 0;
    if (vg_devices_segment_of(ptr, &base, &bytes) != VG_OK) {
        if (size) *size = 0;
        return ptr;
    }
    if (size) *size = bytes;
    return reinterpret_cast<void *>(base);
}

}  // extern "C"
