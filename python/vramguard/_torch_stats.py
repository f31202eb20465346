"""A device heap's counters in the shape of torch.cuda.memory_stats().

Every key the native allocator of PyTorch 2.15 produces is there (123 of
them), so that code indexing them (Lightning's DeviceStatsMonitor reads
inactive_split_bytes, torch.cuda.memory_summary() reads them all) works.
The numbers come from the heap's counters; what vramguard has no notion of
is reported as the native allocator reports it without the setting that
would make it count: no max_split_size (-1), so no oversize blocks, and no
out-of-memory rejection observers. vramguard's own counters (cache hits,
budget refusals, fragmentation, ...) follow, under their own names.
"""
import collections

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


def flat(heap_stats):
    """torch.cuda.memory_stats()'s dict from a heap's stats() (an empty
    dict: a device vramguard has not used, all zeros), sorted by key as
    PyTorch sorts it."""
    result = dict(heap_stats)
    for key in TORCH_KEYS:
        result.setdefault(key, NATIVE_ONLY.get(key, 0))
    result.update(NATIVE_ONLY)
    return collections.OrderedDict(sorted(result.items()))


def nested(heap_stats):
    """torch.cuda.memory_stats_as_nested_dict()'s shape: the flat keys split
    at their dots, plus the per-pool reservations PyTorch keeps for private
    pools (none here)."""
    tree = {"reserved_bytes_by_private_pools": {}}
    for key, value in flat(heap_stats).items():
        node = tree
        *path, leaf = key.split(".")
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = value
    return tree
