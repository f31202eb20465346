"""A device heap's counters in the shape of torch.cuda.memory_stats().

Every key the native allocator of PyTorch 2.15 produces is there (123 of
them), so that code indexing them (Lightning's DeviceStatsMonitor reads
inactive_split_bytes, torch.cuda.memory_summary() reads them all) works.
The numbers come from the heap's counters; what vramguard has no notion of
is reported as the native allocator reports it without the setting that
would make it count: no max_split_size (-1), so no oversize blocks, and no
out-of-memory rejection observers. vramguard's own counters (cache hits,
budget refusals, fragmentation, ...) follow, under their own names.

A device's figures include its CUDA-graph private pools, as PyTorch's
native allocator counts them: the quantities and PyTorch's counters are the
device heap's plus its pools' (peaks of the sum), and
reserved_bytes_by_private_pools has each pool's reserved bytes under its id
(a pool that is gone keeps current 0 and its peak until reset), flattened
by memory_stats() to "reserved_bytes_by_private_pools.<a>_<b>.<pool>.<metric>".
vramguard's own policy counters and fragmentation stay the device heap's.
"""
import collections

from .. import _core

STAT_ARRAYS = (
    "active", "active_bytes", "allocated_bytes", "allocation", "inactive_split",
    "inactive_split_bytes", "requested_bytes", "reserved_bytes", "segment",
)
POOLS = ("all", "large_pool", "small_pool")
METRICS = ("allocated", "current", "freed", "peak")
COUNTERS = ("num_alloc_retries", "num_device_alloc", "num_device_free", "num_ooms", "num_sync_all_streams")

# What the native allocator reports when max_split_size is not set and no
# rejection observer is attached, which is all vramguard can say.
NATIVE_ONLY = dict(
    [("max_split_size", -1), ("num_oom_rejections", 0)]
    + [(f"{stat}.{metric}", 0) for stat in ("oversize_allocations", "oversize_segments") for metric in METRICS]
)

TORCH_KEYS = tuple(sorted(
    [f"{stat}.{pool}.{metric}" for stat in STAT_ARRAYS for pool in POOLS for metric in METRICS]
    + list(COUNTERS) + list(NATIVE_ONLY)
))


BY_POOL = "reserved_bytes_by_private_pools"


def device_stats(index, heap):
    """A device heap's stats() with the device's private pools added in:
    what vramguard.stats() and torch's memory_stats() report."""
    stats = heap.stats()
    figures = _core.device_figures(index)
    if figures:
        stats.update(figures)
    return stats


def _pool_key(pool_id):
    """As memory_stats() flattens a MempoolId_t: (0, 1) -> "0_1"."""
    return "_".join(str(part) for part in pool_id)


def flat(heap_stats, private_pools=True):
    """torch.cuda.memory_stats()'s dict from device_stats() (an empty dict:
    a device vramguard has not used, all zeros), sorted by key as PyTorch
    sorts it. private_pools=False leaves out the per-pool reservations, as
    torch.accelerator.memory_stats() does."""
    result = dict(heap_stats)
    by_pool = result.pop(BY_POOL, {})
    for key in TORCH_KEYS:
        result.setdefault(key, NATIVE_ONLY.get(key, 0))
    result.update(NATIVE_ONLY)
    if private_pools:
        for pool_id, arrays in by_pool.items():
            for kind, metrics in arrays.items():
                for metric, value in metrics.items():
                    result[f"{BY_POOL}.{_pool_key(pool_id)}.{kind}.{metric}"] = value
    return collections.OrderedDict(sorted(result.items()))


def nested(heap_stats):
    """torch.cuda.memory_stats_as_nested_dict()'s shape: the flat keys split
    at their dots, and the per-pool reservations keyed by pool id tuples."""
    tree = {BY_POOL: {tuple(k): v for k, v in heap_stats.get(BY_POOL, {}).items()}}
    for key, value in flat(heap_stats, private_pools=False).items():
        node = tree
        *path, leaf = key.split(".")
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = value
    return tree
