"""torch.backends.cudnn.benchmark under vramguard.

cuDNN's benchmark mode asks the allocator for its largest free block
(cacheInfo) before trying convolution algorithms, and PyTorch's pluggable
allocator refuses that with "CUDAPluggableAllocator does not yet support
cacheInfo", an error raised in the middle of the first convolution of each
new shape. No hook of the pluggable allocator covers cacheInfo.

So where cuDNN is there to use it, benchmark mode is kept off, at the one
place every path goes through: the setter PyTorch calls,
torch._C._set_cudnn_benchmark. Both `cudnn.benchmark = True` (the
property's setter) and `cudnn.flags(benchmark=True)` (set_flags) call it;
the guarded setter warns (once per line that asks, by Python's default
warning filter) and writes False instead. The getter is PyTorch's own, so
`cudnn.benchmark` reads the real setting.
"""
import importlib
import warnings

#: How often benchmark mode was asked for and kept off: a dry run's report
#: says that its vramguard run measured another cuDNN mode than the others.
kept_off = 0

def keep_benchmark_off(torch):
    try:
        cudnn = importlib.import_module("torch.backends.cudnn")
    except ImportError:
        return
    real_set = getattr(torch._C, "_set_cudnn_benchmark", None)
    real_get = getattr(torch._C, "_get_cudnn_benchmark", None)
    if real_set is None or real_get is None:
        return
    if not getattr(real_set, "vramguard_guard", False):
        guarded = _guarded_setter(cudnn, real_set)
        torch._C._set_cudnn_benchmark = guarded
        prop = type(cudnn).__dict__.get("benchmark")
        if hasattr(prop, "setter"):  # torch.backends.ContextProp, which holds the original
            prop.setter = guarded
        real_set = guarded.original
    if real_get() and cudnn.is_available():
        real_set(False)
        _count()
        _warn()


def _guarded_setter(cudnn, real_set):
    def set_cudnn_benchmark(value):
        if value is True and cudnn.is_available():
            _count()
            _warn()
            value = False
        real_set(value)  # PyTorch's own checks: a bool

    set_cudnn_benchmark.vramguard_guard = True
    set_cudnn_benchmark.original = real_set
    return set_cudnn_benchmark


def _count():
    global kept_off
    kept_off += 1


def _warn():
    warnings.warn(
        "vramguard: torch.backends.cudnn.benchmark is kept off. With any pluggable allocator, "
        "cuDNN's benchmark mode asks for the largest cached block (cacheInfo), which PyTorch "
        "refuses with an error in the middle of a convolution. Training works without it; to use "
        "benchmark mode, run without vramguard.",
        RuntimeWarning,
        stacklevel=4,
    )
