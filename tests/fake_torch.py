"""A stand-in for the few parts of torch that vramguard.install() touches,
so that install(), the patched torch.cuda functions and the entry points
can be tested on machines without a GPU or PyTorch. The allocator it is
handed is called through ctypes, as PyTorch calls it through a pointer."""
import ctypes
import sys
import types


class _Flag:
    """Like torch.backends' ContextProp: a class-level property."""

    def __init__(self):
        self.value = False

    def __get__(self, obj, objtype=None):
        return self.value

    def __set__(self, obj, value):
        self.value = bool(value)


class FakeAllocator:
    def __init__(self, path, alloc_name, free_name):
        lib = ctypes.CDLL(path)
        self.malloc = getattr(lib, alloc_name)  # AttributeError if not exported
        self.malloc.restype = ctypes.c_void_p
        self.malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
        self.free = getattr(lib, free_name)
        self.free.restype = None
        self.free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
        self.path = path


def _unsupported(*args, **kwargs):
    raise RuntimeError("CUDAPluggableAllocator does not yet support getDeviceStats.")


def install_fake(available=True, initialized=False, cuda="13.0", swap_error=False):
    torch = types.ModuleType("torch")
    torch.__version__ = "2.11.0+fake"
    torch.version = types.SimpleNamespace(cuda=cuda)
    cuda_mod = types.ModuleType("torch.cuda")
    memory = types.ModuleType("torch.cuda.memory")
    state = {"allocator": None}

    def change_current_allocator(allocator):
        if swap_error:
            raise RuntimeError("Can't swap an already initialized allocator")
        state["allocator"] = allocator

    memory.CUDAPluggableAllocator = FakeAllocator
    memory.change_current_allocator = change_current_allocator
    for name in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
                 "reset_peak_memory_stats", "memory_stats", "memory_summary", "empty_cache",
                 "set_per_process_memory_fraction", "reset_accumulated_memory_stats",
                 "memory_stats_as_nested_dict", "reset_max_memory_allocated"):
        setattr(memory, name, _unsupported)
        setattr(cuda_mod, name, _unsupported)
    cuda_mod.memory = memory
    cuda_mod.is_available = lambda: available
    cuda_mod.is_initialized = lambda: initialized
    cuda_mod.current_device = lambda: 0

    def get_device_index(device, optional=False):
        if device is None:
            return 0
        return device if isinstance(device, int) else int(str(device).split(":")[1])

    cuda_mod._get_device_index = get_device_index
    torch.cuda = cuda_mod

    class Cudnn(types.ModuleType):
        benchmark = _Flag()

    backends = types.ModuleType("torch.backends")
    backends.cudnn = Cudnn("torch.backends.cudnn")
    torch.backends = backends

    class Storage:
        def __init__(self, ptr):
            self.ptr = ptr

        def data_ptr(self):
            return self.ptr

    class Tensor:
        def __init__(self, ptr):
            self.storage = Storage(ptr)

        def untyped_storage(self):
            return self.storage

        def record_stream(self, stream):
            raise AssertionError("the original record_stream must not be reached")

    torch.Tensor = Tensor
    sys.modules.update({"torch": torch, "torch.cuda": cuda_mod, "torch.cuda.memory": memory,
                        "torch.backends": backends, "torch.backends.cudnn": backends.cudnn})
    return torch, state
