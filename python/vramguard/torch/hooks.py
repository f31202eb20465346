"""PyTorch's pluggable-allocator hooks, pointed at vramguard's C entry points.

torch.cuda.memory.CUDAPluggableAllocator(...).allocator() has a setter for
each hook besides malloc and free; each takes a C function's address.
install() sets all of them to the functions _core exports
(csrc/torch/torch_hooks.cc and torch_pools.cc), before the allocator is
made current, so that C++ inside PyTorch reaches vramguard too:

    set_init_fn                  CUDA's lazy init: the device count
    set_reset_fn                 torch.cuda.empty_cache(), torch._C._cuda_emptyCache,
                                 torch.cuda.graph's entry, cuDNN after benchmarking
    set_memory_fraction_fn       torch.cuda.set_per_process_memory_fraction
    set_base_alloc_fn            the segment a pointer lies in (refused, in words,
                                 for a block of the arena)
    set_record_stream_fn         Tensor.record_stream, NCCL's collectives (DDP)
    set_begin_allocate_to_pool   CUDA graphs' private pools: capture begin,
    set_end_allocate_to_pool_fn  capture end,
    set_release_pool             graph reset

Then the out-of-memory shim (oom_shim.py), and a clear error where
PyTorch itself refuses every pluggable allocator: the checkpoint state of
torch.compile(mode="reduce-overhead").
"""
import ctypes

from .. import _core
from . import oom_shim as _oom_shim
from .._version import __version__

# (setter on torch._C._CUDAPluggableAllocator, symbol exported by _core)
HOOKS = (
    ("set_init_fn", "vramguard_torch_init"),
    ("set_reset_fn", "vramguard_torch_reset"),
    ("set_memory_fraction_fn", "vramguard_torch_memory_fraction"),
    ("set_base_alloc_fn", "vramguard_torch_base_alloc"),
    ("set_record_stream_fn", "vramguard_torch_record_stream"),
    ("set_begin_allocate_to_pool", "vramguard_torch_begin_pool"),
    ("set_end_allocate_to_pool_fn", "vramguard_torch_end_pool"),
    ("set_release_pool", "vramguard_torch_release_pool"),
)

# torch._C functions that every pluggable allocator refuses with a message
# that reads like a missing feature; cudagraph trees call them after
# recording a graph, and (torch 2.11 on a GPU, its first call) check the
# pool's live allocations before that.
CHECKPOINT_FUNCTIONS = ("_cuda_getCheckpointState", "_cuda_setCheckpointPoolState",
                        "_cuda_checkPoolLiveAllocations")
CHECKPOINT_ADVICE = (
    "torch.compile(mode='reduce-overhead') records CUDA graphs with cudagraph trees, which read "
    "PyTorch's native allocator's pool and checkpoint state ({name}); no pluggable allocator, "
    "vramguard included, can give it. Under vramguard use torch.compile(mode='default') or "
    "mode='max-autotune-no-cudagraphs'; torch.cuda.graph and torch.cuda.make_graphed_callables "
    "work. For reduce-overhead, run without vramguard."
)


def core_library():
    """_core as a C library: the very object Python imported."""
    return ctypes.CDLL(_core.__file__)


def address(lib, symbol):
    return ctypes.cast(getattr(lib, symbol), ctypes.c_void_p).value


def set_hooks(allocator):
    """Points every hook this torch has at _core; returns the setters used
    (an older torch may lack some)."""
    get_raw = getattr(allocator, "allocator", None)  # torch < 2.1 has no hooks to set
    if get_raw is None:
        return []
    raw = get_raw()
    lib = core_library()
    used = []
    for setter, symbol in HOOKS:
        set_fn = getattr(raw, setter, None)
        if set_fn is not None:
            set_fn(address(lib, symbol))
            used.append(setter)
    return used


def set_oom_thrower(thrower_address):
    """The shim's thrower for _core's malloc (None: std::runtime_error)."""
    fn = core_library().vramguard_torch_set_oom_thrower
    fn.argtypes = [ctypes.c_void_p]
    fn.restype = None
    fn(thrower_address)


def guard_checkpoint_state(torch, error):
    """Replaces the torch._C functions cudagraph trees call with ones that
    raise `error` saying what to do, instead of PyTorch's 'does not yet
    support getCheckpointState. If you need it, please file an issue'."""
    native = getattr(torch, "_C", None)
    for name in CHECKPOINT_FUNCTIONS:
        original = getattr(native, name, None)
        if original is None or getattr(original, "_vramguard_refusal", False):
            continue

        def refuse(*args, _name=name, **kwargs):
            raise error("vramguard: " + CHECKPOINT_ADVICE.format(name=f"torch._C.{_name}"))

        refuse.__name__ = name
        refuse._vramguard_refusal = True
        setattr(native, name, refuse)


def plug_in(torch, allocator, oom_error=None):
    """The hooks and the out-of-memory shim, for install() before the
    allocator is made current. Returns what was done, for vramguard's
    state."""
    hooks = set_hooks(allocator)
    shim = _oom_shim.load(torch, __version__, oom_error)
    set_oom_thrower(shim.address)
    return {"hooks": hooks, "oom_shim": shim}
