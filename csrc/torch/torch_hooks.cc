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
// nothing below throws. Two refuse with an exception, which PyTorch raises
// as RuntimeError: the memory fraction, for bad input, and the base
// allocation, for a block of the arena (as PyTorch's own refuses for
// expandable segments). The others are called from destructors and
// teardown, where an exception means std::terminate: they never throw.
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
int vramguard_torch_base_alloc_refusal(const void *ptr, char *message, size_t n) noexcept;
void *vramguard_torch_base_alloc(void *ptr, size_t *size);

void vramguard_torch_init(int device_count) noexcept
{
    vg_devices_note_device_count(device_count);
}

void vramguard_torch_reset(void) noexcept
{
    (void)vg_devices_empty_cache_all();
}

// The device's budget becomes `fraction` of its memory; 0 allows nothing
// new (VG_BUDGET_NOTHING), as PyTorch's own 0 does.
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
                            : vg_devices_set_budget(device, VG_BUDGET_NOTHING, 0.0);
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

// The device heap that holds ptr, and the segment (base and size) it lies
// in; nullptr when no device heap does (a private pool's, or nobody's).
static vg_heap *device_heap_of(const void *ptr, uintptr_t *base, size_t *bytes)
{
    for (int d = 0; d < VG_MAX_DEVICES; d++) {
        vg_heap *h = vg_devices_existing(d);
        if (h && vg_heap_segment_of(h, ptr, base, bytes) == VG_OK) return h;
    }
    return nullptr;
}

// What getBaseAllocation answers for a block of the arena, which has no
// base allocation to give: its range is address space whose pages are
// mapped one by one (cuMemMap), and CUDA IPC (cudaIpcGetMemHandle) cannot
// export that, as PyTorch's own getBaseAllocation refuses for expandable
// segments. Writes the message (n bytes) and returns 1 when ptr lies in
// the arena; 0 otherwise. Exported for the tests, which cannot catch a
// C++ exception through ctypes.
int vramguard_torch_base_alloc_refusal(const void *ptr, char *message, size_t n) noexcept
{
    uintptr_t base = 0;
    size_t bytes = 0;
    vg_heap *h = device_heap_of(ptr, &base, &bytes);
    if (!h || !vg_heap_uses_arena(h)) return 0;
    std::snprintf(message, n,
                  "vramguard: the CUDA memory at %p lies in vramguard's arena on GPU %d, virtual "
                  "memory mapped page by page (cuMemMap, as PyTorch's expandable segments), which "
                  "has no base allocation that CUDA IPC (cudaIpcGetMemHandle) can share with "
                  "another process. To share CUDA tensors between processes, allocate them with "
                  "segments: vramguard.install(arena=False), or VRAMGUARD_ARENA=0 in the "
                  "environment, in the process that allocates them.",
                  ptr, vg_heap_device(h)->index);
    return 1;
}

// The start and size of the segment (one cudaMalloc) that holds ptr; a
// pointer no heap holds is its own base, of unknown size (0). A block of
// the arena is refused with an exception, as PyTorch refuses one of its
// expandable segments (TORCH_CHECK): the caller is about to export the
// base through CUDA IPC, and an answer it cannot use would fail there, in
// words that do not say why.
void *vramguard_torch_base_alloc(void *ptr, size_t *size)
{
    char refusal[640];
    if (vramguard_torch_base_alloc_refusal(ptr, refusal, sizeof refusal))
        throw std::runtime_error(refusal);
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
