// CUDA graphs' private pools: the pluggable allocator's
// begin_allocate_to_pool, end_allocate_to_pool and release_pool hooks,
// over the registry's pools (device/pools.c).
//
// PyTorch calls them with MempoolId_t, a std::pair of two unsigned long
// long, which is trivially copyable and so arrives by value in two
// registers; end and release are therefore plain C functions taking two
// u64. begin also takes a std::function<bool(cudaStream_t)>, which is not
// trivial: PyTorch passes a temporary by reference and destroys it after
// the call, so begin must have the exact C++ type and keep a copy of its
// own. The registry calls that copy on the allocating thread inside malloc
// (PyTorch's graph filter asks cudaStreamGetCaptureInfo whether the stream
// is in this graph's capture), through filter_accepts, which catches
// whatever the filter throws: no exception may unwind through the C
// registry. An exception means "not this pool".
#include <cstdint>
#include <functional>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>

#include "vramguard/devices.h"

struct CUstream_st;
typedef CUstream_st *cudaStream_t;

namespace {

using pool_id = std::pair<unsigned long long, unsigned long long>;
using stream_filter = std::function<bool(cudaStream_t)>;

int filter_accepts(void *ctx, vg_stream_t stream)
{
    try {
        return (*static_cast<stream_filter *>(ctx))(reinterpret_cast<cudaStream_t>(stream)) ? 1 : 0;
    } catch (...) {
        return 0;
    }
}

void drop_filter(void *ctx)
{
    delete static_cast<stream_filter *>(ctx);
}

}  // namespace

extern "C" {

void vramguard_torch_begin_pool(int device, pool_id id, stream_filter filter);
void vramguard_torch_end_pool(int device, uint64_t id0, uint64_t id1) noexcept;
void vramguard_torch_release_pool(int device, uint64_t id0, uint64_t id1) noexcept;

// Called from CUDAGraph::capture_begin and torch._C._cuda_beginAllocate*,
// where PyTorch turns an exception into a Python RuntimeError.
void vramguard_torch_begin_pool(int device, pool_id id, stream_filter filter)
{
    if (!filter) throw std::invalid_argument("vramguard: begin_allocate_to_pool without a filter");
    stream_filter *copy = new stream_filter(std::move(filter));
    // The registry drops the copy itself when it refuses.
    int rc = vg_devices_begin_pool(device, id.first, id.second, filter_accepts, copy, drop_filter);
    if (rc == VG_ERR_NOMEM) throw std::bad_alloc();
    if (rc != VG_OK) {
        throw std::runtime_error("vramguard: cannot allocate to private pool (" +
                                 std::to_string(id.first) + ", " + std::to_string(id.second) +
                                 ") on device " + std::to_string(device) + ": " + vg_devices_error());
    }
}

// From CUDAGraph's capture end and reset, and graph teardown: never throws.
void vramguard_torch_end_pool(int device, uint64_t id0, uint64_t id1) noexcept
{
    (void)vg_devices_end_pool(device, id0, id1);
}

void vramguard_torch_release_pool(int device, uint64_t id0, uint64_t id1) noexcept
{
    (void)vg_devices_release_pool(device, id0, id1);
}

}  // extern "C"
